"""Data-parallel GPT training in Python MLX: the anchor of `lmx launch -- train` (docs/benchmarks.md).

The GPT-2 124M of models/gpt2.lmx's `gpt2` preset (pre-norm, learned positions, the tanh form of
GELU, fused attention, tied embeddings, vocabulary 50,304; AdamW, global-norm clip 1.0), which
`lmx train --preset gpt2` trains, compiled over [model.state,
optimizer.state], with the gradients averaged over the ranks by `mx.distributed.all_sum` inside the
compiled step, as mlx-lm's trainer does. Start one process per GPU with mlx.launch's environment
(MLX_RANK, MLX_WORLD_SIZE, NCCL_HOST_IP, NCCL_PORT, CUDA_VISIBLE_DEVICES), or alone for one GPU:

    python3 dp_anchor_mlx.py --batch 16 --seq 1024 --steps 30 --dtype bfloat16
Rank 0 prints one JSON line: ranks, median ms/step, tokens/s over all ranks, peak memory of its GPU.
Each rank trains on its own random tokens (seeded by rank), --batch rows each.
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
    total = mx.sqrt(sum(mx.sum(g.astype(mx.float32) ** 2) for _, g in tree_flatten(grads)))
    scale = mx.minimum(1.0, max_norm / (total + 1e-6))
    return tree_map(lambda g: g * scale.astype(g.dtype), grads), total


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=16, help="rows per rank")
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    args = p.parse_args()

    group = mx.distributed.init()
    ranks, rank = group.size(), group.rank()
    mx.random.seed(0)
    d, layers, heads, vocab = 768, 12, 12, 50304
    model = GPT(d, layers, heads, vocab, args.seq)
    if args.dtype == "bfloat16":
        model.set_dtype(mx.bfloat16)
    optimizer = optim.AdamW(learning_rate=3e-4, weight_decay=0.01)
    optimizer.init(model.trainable_parameters())

    def loss_fn(model, x, y):
        logits = model(x)
        return nn.losses.cross_entropy(logits.astype(mx.float32), y, reduction="mean")

    loss_and_grad = nn.value_and_grad(model, loss_fn)
    state = [model.state, optimizer.state]

    @partial(mx.compile, inputs=state, outputs=state)
    def step(x, y):
        loss, grads = loss_and_grad(model, x, y)
        if ranks > 1:
            grads = tree_map(lambda g: mx.distributed.all_sum(g) / ranks, grads)
            loss = mx.distributed.all_sum(loss) / ranks
        grads, _ = clip_by_global_norm(grads, 1.0)
        optimizer.update(model, grads)
        return loss

    mx.random.seed(1 + rank)
    data = mx.random.randint(0, vocab, (args.batch, args.seq + 1))
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
    if rank == 0:
        print(json.dumps({
            "impl": "python-mlx-data-parallel", "mlx": mx.__version__, "ranks": ranks,
            "batch_per_rank": args.batch, "seq": args.seq, "dtype": args.dtype,
            "median_ms": round(ms, 3),
            "tokens_per_s": round(ranks * args.batch * args.seq / (ms / 1e3), 1),
            "peak_memory_mib": round(mx.get_peak_memory() / 2**20, 1),
            "loss_first": round(losses[0], 4), "loss_last": round(losses[-1], 4),
        }))


if __name__ == "__main__":
    main()
