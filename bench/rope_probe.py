"""Times lmx's RoPE kernel against MLX's on the GPU, at the shapes of a GRPO update at
TinyLlama's size (bfloat16, 32 rows of 128 positions, 32 query heads and 4 key heads of 64).

    python3 bench/rope_probe.py [--body FILE ...]

The kernel's body is read from lmx-runtime/src/cuda/rope.rs (its `BODY`), so the probe times the
code lmx runs; `--body` adds other bodies to compare. Each is launched through MLX's
`mx.fast.cuda_kernel` as lmx launches it, at several heads per thread (`HEADS`), on the model's
transposed view of [B, T, H, D] (the forward pass) and on a row-contiguous [B, H, T, D] (a
cotangent). A row is REPS calls evaluated at once, so the host's launch time is shared out; the
time is the median of 7 rounds, per call.
"""

import argparse
import pathlib
import re
import statistics
import time

import mlx.core as mx

REPS = 40
ROOT = pathlib.Path(__file__).resolve().parent.parent


def lmx_body():
    source = (ROOT / "lmx-runtime/src/cuda/rope.rs").read_text()
    return re.search(r'const BODY: &str = r#"(.*?)"#;', source, re.S).group(1)


def timed(make):
    """Median seconds per call of `make()` (a list of arrays), REPS calls a round."""
    mx.eval(make())
    rounds = []
    for _ in range(7):
        outs = [a for _ in range(REPS) for a in make()]
        mx.synchronize()
        start = time.perf_counter()
        mx.eval(outs)
        mx.synchronize()
        rounds.append((time.perf_counter() - start) / REPS)
    return statistics.median(rounds)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--body", action="append", default=[])
    args = parser.parse_args()
    bodies = {"lmx": lmx_body()}
    for path in args.body:
        bodies[pathlib.Path(path).stem] = pathlib.Path(path).read_text()
    B, T, D = 32, 128, 64
    rates = mx.array([10000.0 ** (-2 * i / D) for i in range(D // 2)], dtype=mx.float32)
    offset = mx.array([0], dtype=mx.int32)
    for heads in (32, 4):
        views = {
            "transposed": mx.random.normal((B, T, heads, D)).astype(mx.bfloat16).transpose(0, 2, 1, 3),
            "contiguous": mx.random.normal((B, heads, T, D)).astype(mx.bfloat16),
        }
        for layout, x in views.items():
            mx.eval(x)
            megabytes = 2 * x.size * 2 / 1e6
            mlx = timed(lambda: [mx.fast.rope(x, D, traditional=False, base=10000.0, scale=1.0, offset=0)])
            print(f"{heads:2d} heads {layout:10s} MLX fast.rope        {mlx * 1e6:7.1f} us  ({megabytes / mlx / 1e6:5.2f} TB/s)")
            for name, body in bodies.items():
                kernel = mx.fast.cuda_kernel(
                    name=f"probe_{name}", input_names=["x", "offset", "inv_freq"],
                    output_names=["y"], source=body, ensure_row_contiguous=False)
                for per_thread in (1, 2, 4, 8):
                    groups = (heads + per_thread - 1) // per_thread
                    threads = B * T * groups * (D // 2 // 8)

                    def run():
                        return kernel(
                            inputs=[x, offset, rates], output_shapes=[(B, T, heads, D)],
                            output_dtypes=[x.dtype], grid=(threads, 1, 1), threadgroup=(256, 1, 1),
                            template=[("T", x.dtype), ("VEC", 8), ("HEADS", per_thread), ("FORWARD", 1)])

                    got = run()[0].transpose(0, 2, 1, 3)
                    want = mx.fast.rope(x, D, traditional=False, base=10000.0, scale=1.0, offset=0)
                    gap = mx.abs(got.astype(mx.float32) - want.astype(mx.float32)).max().item()
                    seconds = timed(run)
                    print(f"{heads:2d} heads {layout:10s} {name:8s} HEADS={per_thread}     {seconds * 1e6:7.1f} us  ({megabytes / seconds / 1e6:5.2f} TB/s)  max gap to MLX {gap:.3g}")


if __name__ == "__main__":
    main()
