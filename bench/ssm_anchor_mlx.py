"""Recurrent layers' training in Python MLX: the anchor of `lmx train --model mamba2` and
`--model qwen3_next` (bench/ssm-gpu.sh).

`--family mamba2` (the default) is mlx-lm's own `mamba2.Model` (its SSD scan `ssm_attn`, chunks of
256 positions, computed one chunk after another), built from the same settings as
models/mamba2.lmx's preset. `--family qwen3_next` is mlx-lm's own `qwen3_next.Model` with dense
MLPs (no experts): Gated DeltaNet layers (`gated_delta_update`: mlx-lm's Metal kernel on Metal,
its per-position loop of MLX operations elsewhere) and every `--attn-every`-th layer gated full
attention, as models/qwen3_next.lmx at the same settings. Both are trained as lmx's step trains
them: AdamW (beta2 0.95, weight decay 0.1), global-norm clip 1.0, the cross-entropy in float32,
compiled over [model.state, optimizer.state]. Random tokens, one batch.

    python3 ssm_anchor_mlx.py --d-model 768 --layers 24 --batch 8 --seq 1024 --steps 30 --dtype bfloat16
    python3 ssm_anchor_mlx.py --family qwen3_next --vocab 32000 --d-model 1024 --layers 8 \
        --heads 8 --kv-heads 2 --head-dim 128 --lin-k-heads 8 --lin-v-heads 16 --lin-k-dim 64 \
        --lin-v-dim 64 --d-ff 2816 --attn-every 4 --rope-dims 32 --batch 8 --seq 1024

Prints one JSON line: median ms/step, tokens/s, peak memory, first and last loss.
"""

import argparse
import json
import statistics
import time
from functools import partial

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
from mlx.utils import tree_flatten, tree_map
from mlx_lm.models import mamba2, qwen3_next


def clip_by_global_norm(grads, max_norm):
    total = mx.sqrt(sum(mx.sum(g.astype(mx.float32) ** 2) for _, g in tree_flatten(grads)))
    scale = mx.minimum(1.0, max_norm / (total + 1e-6))
    return tree_map(lambda g: g * scale.astype(g.dtype), grads), total


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--family", default="mamba2", choices=["mamba2", "qwen3_next"])
    p.add_argument("--vocab", type=int, default=50288)
    p.add_argument("--d-model", type=int, default=768)
    p.add_argument("--layers", type=int, default=24)
    p.add_argument("--state", type=int, default=128)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--groups", type=int, default=1)
    # qwen3_next's (--head-dim is then the attention layers' head size).
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--lin-k-heads", type=int, default=8)
    p.add_argument("--lin-v-heads", type=int, default=16)
    p.add_argument("--lin-k-dim", type=int, default=64)
    p.add_argument("--lin-v-dim", type=int, default=64)
    p.add_argument("--d-ff", type=int, default=2816)
    p.add_argument("--attn-every", type=int, default=4)
    p.add_argument("--rope-dims", type=int, default=32)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    args = p.parse_args()

    mx.random.seed(0)
    model = mamba2_model(args) if args.family == "mamba2" else qwen3_next_model(args)
    if args.dtype == "bfloat16":
        model.set_dtype(mx.bfloat16)
    params = sum(v.size for _, v in tree_flatten(model.parameters()))
    optimizer = optim.AdamW(learning_rate=3e-4, betas=[0.9, 0.95], weight_decay=0.1)
    optimizer.init(model.trainable_parameters())

    def loss_fn(model, x, y):
        logits = model(x)
        return nn.losses.cross_entropy(logits.astype(mx.float32), y, reduction="mean")

    loss_and_grad = nn.value_and_grad(model, loss_fn)
    state = [model.state, optimizer.state]

    @partial(mx.compile, inputs=state, outputs=state)
    def step(x, y):
        loss, grads = loss_and_grad(model, x, y)
        grads, _ = clip_by_global_norm(grads, 1.0)
        optimizer.update(model, grads)
        return loss

    mx.random.seed(1)
    data = mx.random.randint(0, args.vocab, (args.batch, args.seq + 1))
    x, y = data[:, :-1], data[:, 1:]
    mx.eval(model.parameters(), optimizer.state, x, y)
    mx.reset_peak_memory()

    times, losses = [], []
    for i in range(args.warmup + args.steps):
        t0 = time.perf_counter()
        loss = step(x, y)
        mx.eval(loss, state)
        dt = time.perf_counter() - t0
        losses.append(loss.item())
        if i >= args.warmup:
            times.append(dt)
    ms = statistics.median(times) * 1e3
    print(json.dumps({
        "impl": f"python-mlx-lm-{args.family}", "mlx": mx.__version__,
        "device": str(mx.default_device()),
        "params": params, "batch": args.batch, "seq": args.seq, "dtype": args.dtype,
        "median_ms": round(ms, 3),
        "tokens_per_s": round(args.batch * args.seq / (ms / 1e3), 1),
        "peak_memory_mib": round(mx.get_peak_memory() / 2**20, 1),
        "loss_first": round(losses[0], 4), "loss_last": round(losses[-1], 4),
    }))


def mamba2_model(args):
    d_inner = 2 * args.d_model
    model_args = mamba2.ModelArgs(
        model_type="mamba2",
        num_heads=d_inner // args.head_dim,
        head_dim=args.head_dim,
        vocab_size=args.vocab,
        hidden_size=args.d_model,
        intermediate_size=d_inner,
        state_size=args.state,
        num_hidden_layers=args.layers,
        layer_norm_epsilon=1e-5,
        conv_kernel=4,
        n_groups=args.groups,
        use_bias=False,
        use_conv_bias=True,
        tie_word_embeddings=True,
        # lmx's model does not clamp the step sizes; (0, inf) keeps mlx-lm's from clamping either.
        time_step_limit=(0.0, float("inf")),
        time_step_rank="auto",
    )
    return mamba2.Model(model_args)


def qwen3_next_model(args):
    """mlx-lm's Qwen3-Next with dense MLPs, models/qwen3_next.lmx's layout at these settings."""
    model_args = qwen3_next.ModelArgs(
        model_type="qwen3_next",
        hidden_size=args.d_model,
        num_hidden_layers=args.layers,
        intermediate_size=args.d_ff,
        num_attention_heads=args.heads,
        linear_num_value_heads=args.lin_v_heads,
        linear_num_key_heads=args.lin_k_heads,
        linear_key_head_dim=args.lin_k_dim,
        linear_value_head_dim=args.lin_v_dim,
        linear_conv_kernel_dim=4,
        num_experts=0,
        num_experts_per_tok=0,
        decoder_sparse_step=1,
        shared_expert_intermediate_size=0,
        mlp_only_layers=[],
        moe_intermediate_size=0,
        rms_norm_eps=1e-6,
        vocab_size=args.vocab,
        num_key_value_heads=args.kv_heads,
        rope_theta=10000000.0,
        partial_rotary_factor=args.rope_dims / args.head_dim,
        max_position_embeddings=max(args.seq, 4096),
        head_dim=args.head_dim,
        tie_word_embeddings=False,
        full_attention_interval=args.attn_every,
    )
    return qwen3_next.Model(model_args)


if __name__ == "__main__":
    main()
