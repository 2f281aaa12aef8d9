"""What a flat training state would buy at the anchors' sizes, measured in Python MLX.

The anchor (`anchor_mlx.py`) keeps one array per parameter and per AdamW moment, so its compiled
step updates them one kernel each, and its gradient norm takes two kernels per gradient. This
probe trains the anchor's own model with its own loss and AdamW settings, but over a flat state:
every parameter is a view of one flat buffer, the two moments are flat buffers like it, and after
the backward pass the gradients are packed into one flat buffer. The norm, the clip and AdamW
are then a reduction and one fused update over the flat buffers, whatever the model's size.

    python3 bench/flat_state_probe.py --anchors ../shared/bench --config tiny --pack kernel

`--pack concat` packs the gradients with `mx.concatenate` (on CUDA, one copy kernel per
gradient); `--pack kernel` with one CUDA kernel of `mx.fast.cuda_kernel` that reads them all.
It prints one JSON line with the anchor's fields and the peak memory, so `lmx bench` tables and
this probe's lines read alike.
"""

import argparse
import json
import statistics
import sys
import time

import mlx.core as mx
from mlx.utils import tree_flatten, tree_unflatten


def pack_kernel(sizes, dtype):
    """One CUDA kernel copying every gradient into its place in the flat buffer."""
    names = [f"g{i}" for i in range(len(sizes))]
    branches, offset = [], 0
    for name, size in zip(names, sizes):
        branches.append(f"if (i < {offset + size}) {{ out[i] = static_cast<T>({name}[i - {offset}]); return; }}")
        offset += size
    body = "  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;\n  "
    body += "\n  ".join(branches)
    kernel = mx.fast.cuda_kernel(
        name=f"flat_pack_{len(sizes)}_{offset}", input_names=names, output_names=["out"],
        source=body)

    def pack(grads):
        return kernel(inputs=grads, template=[("T", dtype)], grid=(offset, 1, 1),
                      threadgroup=(256, 1, 1), output_shapes=[(offset,)],
                      output_dtypes=[dtype])[0]
    return pack


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--anchors", required=True, help="the folder of anchor_mlx.py")
    p.add_argument("--config", default="small")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--pack", default="kernel", choices=["kernel", "concat"])
    args = p.parse_args()
    sys.path.insert(0, args.anchors)
    import anchor_mlx as anchor
    import mlx.nn as nn

    mx.random.seed(0)
    d, layers, heads, vocab = anchor.CONFIGS[args.config]
    model = anchor.GPT(d, layers, heads, vocab, args.seq)
    dtype = mx.bfloat16 if args.dtype == "bfloat16" else mx.float32
    model.set_dtype(dtype)
    named = tree_flatten(model.trainable_parameters())
    names = [name for name, _ in named]
    shapes = [value.shape for _, value in named]
    sizes = [value.size for _, value in named]
    offsets = [sum(sizes[:i]) for i in range(len(sizes))]
    flat = mx.concatenate([value.reshape(-1) for _, value in named])
    m, v = mx.zeros_like(flat), mx.zeros_like(flat)
    if args.pack == "kernel":
        pack = pack_kernel(sizes, dtype)
    else:
        def pack(grads):
            return mx.concatenate([g.reshape(-1) for g in grads])

    def loss_of(params, x, y):
        model.update(tree_unflatten(list(zip(names, params))))
        logits = model(x)
        return nn.losses.cross_entropy(logits.astype(mx.float32), y, reduction="mean")

    loss_and_grads = mx.value_and_grad(loss_of)
    lr, wd, b1, b2, eps = 3e-4, 0.01, 0.9, 0.999, 1e-8

    def step(flat, m, v, x, y):
        params = [flat[o:o + s].reshape(shape) for o, s, shape in zip(offsets, sizes, shapes)]
        loss, grads = loss_and_grads(params, x, y)
        g = pack(grads)
        norm = mx.sqrt(mx.sum(g.astype(mx.float32) ** 2))
        g = g * mx.minimum(1.0, 1.0 / (norm + 1e-6)).astype(g.dtype)
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * mx.square(g)
        flat = flat * (1 - lr * wd) - lr * m / (mx.sqrt(v) + eps)
        return flat, m, v, loss

    step = mx.compile(step)
    data = mx.random.randint(0, vocab, (args.batch, args.seq + 1))
    x, y = data[:, :-1], data[:, 1:]
    mx.eval(flat, m, v, x, y)
    mx.reset_peak_memory()
    times, losses = [], []
    for i in range(args.warmup + args.steps):
        t0 = time.perf_counter()
        flat, m, v, loss = step(flat, m, v, x, y)
        mx.eval(loss, flat, m, v)
        dt = time.perf_counter() - t0
        losses.append(loss.item())
        if i >= args.warmup:
            times.append(dt)
    ms = statistics.median(times) * 1e3
    print(json.dumps({
        "impl": f"python-mlx-flat-{args.pack}", "config": args.config, "batch": args.batch,
        "seq": args.seq, "dtype": args.dtype, "params": sum(sizes), "tensors": len(sizes),
        "median_ms": round(ms, 3), "loss_first": round(losses[0], 4),
        "loss_last": round(losses[-1], 4),
        "peak_mib": round(mx.get_peak_memory() / 2**20, 1),
    }))


if __name__ == "__main__":
    main()
