"""The Python MLX anchor (shared/bench/anchor_mlx.py) started from lmx's initial parameters and
trained on lmx's batch: `lmx bench train --same-init` sets the two loss curves side by side.

The model, the loss, the clipping, the optimizer and the step are the anchor's, unchanged (the
classes and functions down to `clip_by_global_norm` are a verbatim copy of anchor_mlx.py, so that
this runs where the shared folder is absent, in CI; `diff` shows they match). Only the starting
point differs: instead of seeding MLX's initialisers and drawing random tokens, it loads the
safetensors file lmx wrote (`--init`): lmx's parameters, renamed to the anchor's module tree
(lmx's linear weights are `[out, in]`, as MLX's nn.Linear stores them, so nothing is transposed),
and the batch (`batch.inputs`, `batch.targets`).

    lmx bench train --configs tiny --same-init --anchor bench/anchor_same_init.py

It prints the anchor's JSON line with one more field, `losses`: every step's loss, warm-up included.
"""

import argparse
import json
import re
import statistics
import time
from functools import partial

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
from mlx.utils import tree_flatten, tree_map

CONFIGS = {
    # name: (d_model, n_layers, n_heads, vocab)
    "tiny": (64, 2, 2, 256),
    "small": (256, 6, 4, 256),
    "medium": (1024, 12, 16, 256),
    "gpt2": (768, 12, 12, 50304),
}


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.out = nn.Linear(4 * d, d)

    def __call__(self, x):
        b, t, d = x.shape
        q, k, v = mx.split(self.qkv(self.ln1(x)), 3, axis=-1)
        q, k, v = (a.reshape(b, t, self.heads, -1).transpose(0, 2, 1, 3) for a in (q, k, v))
        a = mx.fast.scaled_dot_product_attention(q, k, v, scale=q.shape[-1] ** -0.5, mask="causal")
        x = x + self.proj(a.transpose(0, 2, 1, 3).reshape(b, t, d))
        return x + self.out(nn.gelu_approx(self.fc(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, d, layers, heads, vocab, max_seq):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(max_seq, d)
        self.blocks = [Block(d, heads) for _ in range(layers)]
        self.ln_f = nn.LayerNorm(d)

    def __call__(self, x):
        h = self.tok(x) + self.pos(mx.arange(x.shape[1]))
        for blk in self.blocks:
            h = blk(h)
        return self.tok.as_linear(self.ln_f(h))


def clip_by_global_norm(grads, max_norm):
    # graph-only: no host read, so it can live inside mx.compile
    total = mx.sqrt(sum(mx.sum(g.astype(mx.float32) ** 2) for _, g in tree_flatten(grads)))
    scale = mx.minimum(1.0, max_norm / (total + 1e-6))
    return tree_map(lambda g: g * scale.astype(g.dtype), grads), total


# lmx's names (models/gpt2.lmx, Hugging Face's GPT-2 names) -> the anchor's module tree.
RENAMES = [
    (r"^wte\.", "tok."),
    (r"^wpe\.", "pos."),
    (r"^h\.(\d+)\.ln_1\.", r"blocks.\1.ln1."),
    (r"^h\.(\d+)\.ln_2\.", r"blocks.\1.ln2."),
    (r"^h\.(\d+)\.attn\.c_attn\.", r"blocks.\1.qkv."),
    (r"^h\.(\d+)\.attn\.c_proj\.", r"blocks.\1.proj."),
    (r"^h\.(\d+)\.mlp\.c_fc\.", r"blocks.\1.fc."),
    (r"^h\.(\d+)\.mlp\.c_proj\.", r"blocks.\1.out."),
    (r"^ln_f\.", "ln_f."),
]


def anchor_name(name):
    for pattern, replacement in RENAMES:
        renamed, count = re.subn(pattern, replacement, name)
        if count:
            return renamed
    raise SystemExit(f"lmx's parameter {name} has no place in the anchor's model")


def load_start(model, path):
    """Loads lmx's parameters into `model` (every one, each of the anchor's shape and dtype) and
    returns lmx's batch."""
    arrays = mx.load(path)
    inputs, targets = arrays.pop("batch.inputs"), arrays.pop("batch.targets")
    ours = dict(tree_flatten(model.parameters()))
    loaded = {anchor_name(name): array for name, array in arrays.items()}
    if loaded.keys() != ours.keys():
        raise SystemExit(
            f"{path}: lmx's parameters do not match the anchor's: missing "
            f"{sorted(ours.keys() - loaded.keys())}, extra {sorted(loaded.keys() - ours.keys())}"
        )
    for name, array in loaded.items():
        if array.shape != ours[name].shape or array.dtype != ours[name].dtype:
            raise SystemExit(
                f"{path}: {name} is {array.dtype}{list(array.shape)} in lmx's file, "
                f"{ours[name].dtype}{list(ours[name].shape)} in the anchor"
            )
    model.load_weights(list(loaded.items()), strict=True)
    return inputs, targets


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--config", default="small", choices=sorted(CONFIGS))
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--compile", type=int, default=1)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--device", default="default", choices=["default", "cpu", "gpu"])
    p.add_argument("--peak_tflops", type=float, default=989.0)
    p.add_argument("--init", required=True, help="the safetensors file lmx wrote")
    args = p.parse_args()
    if args.device != "default":
        mx.set_default_device(mx.cpu if args.device == "cpu" else mx.gpu)

    d, layers, heads, vocab = CONFIGS[args.config]
    model = GPT(d, layers, heads, vocab, args.seq)
    if args.dtype == "bfloat16":
        model.set_dtype(mx.bfloat16)
    x, y = load_start(model, args.init)
    if x.shape != (args.batch, args.seq):
        raise SystemExit(f"{args.init}: lmx's batch is {list(x.shape)}, not [{args.batch}, {args.seq}]")
    n_params = sum(v.size for _, v in tree_flatten(model.parameters()))
    optimizer = optim.AdamW(learning_rate=3e-4, weight_decay=0.01)
    optimizer.init(model.trainable_parameters())  # state exists before tracing: no retrace at step 2

    def loss_fn(model, x, y):
        logits = model(x)
        return nn.losses.cross_entropy(logits.astype(mx.float32), y, reduction="mean")

    loss_and_grad = nn.value_and_grad(model, loss_fn)
    state = [model.state, optimizer.state]

    def step(x, y):
        loss, grads = loss_and_grad(model, x, y)
        grads, _ = clip_by_global_norm(grads, 1.0)
        optimizer.update(model, grads)
        return loss

    if args.compile:
        step = partial(mx.compile, inputs=state, outputs=state)(step)

    mx.eval(model.parameters(), optimizer.state, x, y)

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
    tok_s = args.batch * args.seq / (ms / 1e3)
    flops_per_tok = 6 * n_params + 12 * layers * d * args.seq  # as in anchor_torch.py
    print(json.dumps({
        "impl": "python-mlx", "mlx": mx.__version__, "device": str(mx.default_device()),
        "config": args.config, "batch": args.batch, "seq": args.seq, "dtype": args.dtype,
        "compile": bool(args.compile), "params": n_params, "median_ms": round(ms, 3),
        "tokens_per_s": round(tok_s, 1),
        "mfu": round(flops_per_tok * tok_s / (args.peak_tflops * 1e12), 4),
        "loss_first": round(losses[0], 4), "loss_last": round(losses[-1], 4),
        "losses": losses,
    }))


if __name__ == "__main__":
    main()
