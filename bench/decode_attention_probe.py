"""Times lmx's decode attention kernel on the GPU at TinyLlama's decoding shapes (bfloat16, one
row, 32 query heads over 4 key heads of 64, a 512-slot cache), by its block size and features.

    python3 bench/decode_attention_probe.py [--body NAME=FILE ...]

The kernel's body is read from lmx-runtime/src/cuda/decode_attention.rs (`SHARE` and `WHOLE`),
so the probe times the code lmx runs; `--body` adds other bodies of the same inputs to compare.
Each row is REPS launches chained through the query (each call's output is the next one's
query), evaluated at once, so that one launch's time is the wall time over REPS: the kernel, the
GPU's gap between two graph nodes and whatever of the host's launch work the GPU waits for (the
`copy` body's rows). Median of 7 rounds. Rows: warps a block, the features (the query's and key's
rotation and the cache write, all or none), the query's position, and whether the position is
a one-value array (`padded` 0: MLX's CUDA allocator keeps it in its pool of scalars) or the
first of four values (`padded` 1: an allocation of its own). Both are made by the host, so both
lie in host-reachable memory: pinned host memory where the device has no concurrent managed
access. The rotation's rates are made by MLX operations, so in device memory.
"""

import argparse
import itertools
import pathlib
import re
import statistics
import time

import mlx.core as mx

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
def lmx_body():
    source = (ROOT / "lmx-runtime/src/cuda/decode_attention.rs").read_text()
    part = lambda name: re.search(rf'const {name}: &str = r#"(.*?)"#;', source, re.S).group(1)
    return part("SHARE") + part("WHOLE")


def timed(step, q):
    mx.eval(step(q))
    rounds = []
    for _ in range(7):
        x = q
        for _ in range(REPS):
            x = step(x)
        mx.synchronize()
        start = time.perf_counter()
        mx.eval(x)
        mx.synchronize()
        rounds.append((time.perf_counter() - start) / REPS)
    return statistics.median(rounds)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--body", action="append", default=[])
    parser.add_argument("--capacity", type=int, default=512)
    args = parser.parse_args()
    bodies = {"lmx": lmx_body(), "copy": COPY}
    for spec in args.body:
        name, path = spec.split("=", 1)
        bodies[name] = pathlib.Path(path).read_text()
    heads, kv_heads, dim, capacity = 32, 4, 64, args.capacity
    dtype = mx.bfloat16
    q = mx.random.normal((1, heads, 1, dim)).astype(dtype)
    k = mx.random.normal((1, kv_heads, capacity, dim)).astype(dtype)
    v = mx.random.normal((1, kv_heads, capacity, dim)).astype(dtype)
    k_new = mx.random.normal((1, kv_heads, 1, dim)).astype(dtype)
    v_new = mx.random.normal((1, kv_heads, 1, dim)).astype(dtype)
    rates = 10000.0 ** (-mx.arange(0, dim, 2, dtype=mx.float32) / dim)
    no_starts = mx.array(0, dtype=mx.int32)
    mx.eval(q, k, v, k_new, v_new, rates, no_starts)
    print(f"{'body':>10} {'warps':>5} {'features':>9} {'position':>8} {'padded':>6} "
          f"{'us a launch':>11}")
    for name, body in bodies.items():
        kernel = mx.fast.cuda_kernel(name=f"probe_{name}", input_names=INPUTS,
                                     output_names=["out"], source=body)
        rows = itertools.product((32, 16), (1, 0), (128, 383), (0, 1))
        for warps, features, pos, padded in rows:
            position = mx.array([pos] + [0] * 3 * padded, dtype=mx.int32)
            mx.eval(position)

            def step(x):
                return kernel(
                    inputs=[x, k, v, position, no_starts, position, rates, k_new, v_new,
                            position, rates],
                    template=[("T", dtype), ("D", dim), ("WARPS", warps), ("HAS_STARTS", 0),
                              ("ROPE_Q", features), ("WRITE", features), ("ROPE_K", features)],
                    grid=(warps * 32, heads, 1), threadgroup=(warps * 32, 1, 1),
                    output_shapes=[q.shape], output_dtypes=[dtype])[0]

            us = timed(step, q) * 1e6
            print(f"{name:>10} {warps:>5} {'all' if features else 'none':>9} {pos:>8} "
                  f"{padded:>6} {us:>11.2f}", flush=True)


if __name__ == "__main__":
    main()
