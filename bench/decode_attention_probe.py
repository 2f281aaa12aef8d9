"""Times lmx's decode attention kernel on the GPU at TinyLlama's decoding shapes (bfloat16, one
row, 32 query heads over 4 key heads of 64, a 512-slot cache), by its block size, its blocks per
head and its features.

    python3 bench/decode_attention_probe.py [--caches N] [--splits 1,4] [--body NAME=FILE ...]

The kernel's source is read from lmx-runtime/src/cuda/decode_attention.rs (`SHARE`, then
`WHOLE` for one block per head, or `SPLIT` for several whose last merges their parts in scratch), so the
probe times the code lmx runs; `--body` adds other one-block bodies of the same inputs (with their
own `UNROLL`) to compare. Each row is REPS launches chained through the query (each call's
output is the next one's query), over `--caches` key-value buffers in turn (with enough of them,
more bytes than the L2 cache holds, as a model's layers' are), evaluated at once, so that one
launch's time is the wall time over REPS: the kernel, the GPU's gap between two graph nodes and
whatever of the host's launch work the GPU waits for (the `copy` body's rows); CUPTI's trace of
the kernels alone (`bench/cupti-build.sh`) separates them. Median of 7 rounds. Rows: warps a
block, blocks per head, the features (the query's and key's rotation and the cache write, all or
none), the query's position, and whether the position is a one-value array (`padded` 0: MLX's
CUDA allocator keeps it in its pool of scalars), the first of four values (`padded` 1: an
allocation of its own), both made by the host, so both in host-reachable memory (pinned host
memory where the device has no concurrent managed access), or a view of a device operation's
output of more than 8 bytes (`padded` 2: device memory, as `nn::device_resident` makes a decode
step's position). The rotation's rates are made by MLX operations, so in device memory.
"""

import argparse
import itertools
import pathlib
import re

import mlx.core as mx

from chained import chained

REPS = 200
ROOT = pathlib.Path(__file__).resolve().parent.parent
INPUTS = ["q", "k", "v", "position", "starts", "rope_offset", "inv_freq", "k_new", "v_new",
          "k_rope_offset", "k_inv_freq"]
# The lower bound: a kernel of the same inputs and grid that copies the query.
COPY = r"""
  const int bh = blockIdx.y;
  const int t = threadIdx.x;
  if (t < D) {
    out[static_cast<size_t>(bh) * D + t] = q[static_cast<size_t>(bh) * D + t];
  }
"""
UNROLL = 4


def lmx_part(name):
    source = (ROOT / "lmx-runtime/src/cuda/decode_attention.rs").read_text()
    return re.search(rf'const {name}: &str = r#"(.*?)"#;', source, re.S).group(1)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--body", action="append", default=[])
    parser.add_argument("--capacity", type=int, default=512)
    parser.add_argument("--caches", type=int, default=1,
                        help="key-value buffers taken in turn (more bytes than the L2 cache holds, "
                             "as a model's layers' are, with enough of them)")
    parser.add_argument("--warps", default="32,16", help="block sizes in warps, comma-separated")
    parser.add_argument("--positions", default="0,1,2",
                        help="the position's arrays: 0 one host-made value, 1 the first of four "
                             "host-made values, 2 a device operation's output")
    parser.add_argument("--splits", default="1,4", help="blocks per head, comma-separated")
    args = parser.parse_args()
    # Each body: its source, whether its blocks split a head (`SPLIT`), whether it takes UNROLL.
    bodies = {"lmx": (lmx_part("SHARE") + lmx_part("WHOLE"), False, True),
              "split": (lmx_part("SHARE") + lmx_part("SPLIT"), True, True),
              "copy": (COPY, False, False)}
    for spec in args.body:
        name, path = spec.split("=", 1)
        bodies[name] = (pathlib.Path(path).read_text(), False, False)
    heads, kv_heads, dim, capacity = 32, 4, 64, args.capacity
    dtype = mx.bfloat16
    q = mx.random.normal((1, heads, 1, dim)).astype(dtype)
    caches = [tuple(mx.random.normal((1, kv_heads, capacity, dim)).astype(dtype) for _ in "kv")
              for _ in range(args.caches)]
    k_new = mx.random.normal((1, kv_heads, 1, dim)).astype(dtype)
    v_new = mx.random.normal((1, kv_heads, 1, dim)).astype(dtype)
    rates = 10000.0 ** (-mx.arange(0, dim, 2, dtype=mx.float32) / dim)
    no_starts = mx.array(0, dtype=mx.int32)
    splits = [int(n) for n in args.splits.split(",")]
    counters = mx.zeros((256,), dtype=mx.int32)
    work = mx.zeros((heads * max(splits) * (dim + 2),), dtype=mx.float32)
    mx.eval(q, caches, k_new, v_new, rates, no_starts, counters, work)
    print(f"{'body':>10} {'warps':>5} {'splits':>6} {'features':>9} {'position':>8} "
          f"{'padded':>6} {'us a launch':>11}")
    for name, (body, split, unrolled) in bodies.items():
        inputs = INPUTS + ["ctl", "work"] if split else INPUTS
        kernel = mx.fast.cuda_kernel(name=f"probe_{name}", input_names=inputs,
                                     output_names=["out"], source=body)
        blocks_per_head = [n for n in splits if n > 1] if split else [1]
        rows = itertools.product([int(w) for w in args.warps.split(",")], blocks_per_head, (1, 0),
                                 (128, 383), [int(p) for p in args.positions.split(",")])
        for warps, blocks, features, pos, padded in rows:
            if padded == 2:
                # Made by a device operation, more than 8 bytes: device memory (a view of row 0).
                position = (mx.zeros((2, 4), dtype=mx.int32) + pos)[0, :1]
            else:
                position = mx.array([pos] + [0] * 3 * padded, dtype=mx.int32)
            mx.eval(position)
            template = [("T", dtype), ("D", dim), ("WARPS", warps), ("HAS_STARTS", 0),
                        ("ROPE_Q", features), ("WRITE", features), ("ROPE_K", features)]
            if unrolled:
                template.append(("UNROLL", UNROLL))

            def step(x, i):
                k, v = caches[i % len(caches)]
                extra = [counters, work] if split else []
                return kernel(
                    inputs=[x, k, v, position, no_starts, position, rates, k_new, v_new,
                            position, rates] + extra,
                    template=template,
                    grid=(blocks * warps * 32, heads, 1), threadgroup=(warps * 32, 1, 1),
                    output_shapes=[q.shape], output_dtypes=[dtype])[0]

            us = chained(step, q, REPS) * 1e6
            print(f"{name:>10} {warps:>5} {blocks:>6} {'all' if features else 'none':>9} "
                  f"{pos:>8} {padded:>6} {us:>11.2f}", flush=True)


if __name__ == "__main__":
    main()
