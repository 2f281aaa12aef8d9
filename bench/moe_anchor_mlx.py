"""Sparse Mixtral training in Python MLX with mlx-lm's own model: the anchor of bench/moe-gpu.sh.

mlx-lm's `mixtral` Model (its SwitchGLU: `gather_mm` over the experts' stacked weights, rows
sorted by expert from 64 on) at the size given, trained as lmx's `mixtral.lmx` step trains it:
cross-entropy, AdamW (betas 0.9 and 0.95, weight decay 0.1), global-norm clip 1.0, compiled
over [model.state, optimizer.state] as mlx-lm's trainer compiles its step, on random tokens.

    python3 moe_anchor_mlx.py --d-model 1024 --layers 8 --d-ff 3584 --batch 8 --seq 1024

Prints one JSON line: the settings, the parameter count, median ms per step over the timed
steps (after --warmup), tokens/s, peak memory and the last loss.
"""

import argparse
import json
import statistics
import time
from functools import partial

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
from mlx.utils import tree_flatten
from mlx_lm.models import mixtral


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--d-model", type=int, default=1024)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--d-ff", type=int, default=3584)
    p.add_argument("--experts", type=int, default=8)
    p.add_argument("--top-k", type=int, default=2)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    args = p.parse_args()

    mx.random.seed(0)
    model = mixtral.Model(
        mixtral.ModelArgs(
            model_type="mixtral",
            vocab_size=args.vocab,
            hidden_size=args.d_model,
            intermediate_size=args.d_ff,
            num_hidden_layers=args.layers,
            num_attention_heads=args.heads,
            num_key_value_heads=args.kv_heads,
            num_local_experts=args.experts,
            num_experts_per_tok=args.top_k,
        )
    )
    model.set_dtype(getattr(mx, args.dtype))
    params = sum(v.size for _, v in tree_flatten(model.parameters()))
    optimizer = optim.AdamW(learning_rate=args.lr, betas=[0.9, 0.95], weight_decay=0.1)

    def loss_fn(model, tokens):
        logits = model(tokens[:, :-1]).astype(mx.float32)
        return nn.losses.cross_entropy(logits, tokens[:, 1:]).mean()

    state = [model.state, optimizer.state]

    @partial(mx.compile, inputs=state, outputs=state)
    def step(tokens):
        loss, grads = nn.value_and_grad(model, loss_fn)(model, tokens)
        grads, _ = optim.clip_grad_norm(grads, 1.0)
        optimizer.update(model, grads)
        return loss

    times = []
    loss = None
    for i in range(args.warmup + args.steps):
        tokens = mx.random.randint(0, args.vocab, (args.batch, args.seq + 1))
        mx.eval(tokens)
        start = time.perf_counter()
        loss = step(tokens)
        mx.eval(loss, state)
        if i >= args.warmup:
            times.append(time.perf_counter() - start)
    ms = statistics.median(times) * 1e3
    print(
        json.dumps(
            {
                "name": "mlx-lm",
                "mlx": mx.__version__,
                "params": params,
                "d_model": args.d_model,
                "layers": args.layers,
                "d_ff": args.d_ff,
                "experts": args.experts,
                "top_k": args.top_k,
                "batch": args.batch,
                "seq": args.seq,
                "dtype": args.dtype,
                "median_ms": round(ms, 2),
                "tokens_per_s": round(args.batch * args.seq / (ms / 1e3), 1),
                "peak_memory_mib": round(mx.get_peak_memory() / 2**20, 1),
                "last_loss": loss.item(),
            }
        )
    )


if __name__ == "__main__":
    main()
