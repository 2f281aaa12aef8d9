"""Times lmx's decoding gated MLP kernel on the GPU at TinyLlama's shapes (bfloat16, one row,
2,048 wide, 5,632 gated features), by its blocks and variants of its body.

    python3 bench/gated_mlp_probe.py

The kernel's source is read from lmx-runtime/src/cuda (the headers it includes and
`gated_mlp.rs`'s `BODY`), so the probe times the code lmx runs; the variants are edits of that
body, each named in `VARIANTS`. Each row is REPS launches chained through the row (each
launch's output is the next one's input and residual), over LAYERS sets of weights in turn (more
bytes than the L2 cache holds, as a model's layers are), evaluated at once: one launch's time is
the wall time over REPS. Median of 7 rounds. `bench/decode-profile-gpu.sh`'s CUPTI library,
preloaded, gives the kernels' own times.
"""

import pathlib
import re
import struct

import mlx.core as mx

from chained import chained

REPS = 220
EPS_BITS = struct.unpack("<i", struct.pack("<f", 1e-5))[0]
LAYERS = 4
ROOT = pathlib.Path(__file__).resolve().parent.parent / "lmx-runtime/src/cuda"


def part(file, name):
    source = (ROOT / file).read_text()
    return re.search(rf'const {name}: &str = r#"(.*?)"#;', source, re.S).group(1)


HEADER = "".join([part("activation.rs", "HEADER"), part("matvec.rs", "HEADER"),
                  part("row_norm.rs", "HEADER"), part("weights.rs", "STREAM"),
                  part("weights.rs", "DENSE"), part("tasks.rs", "HEADER")])
MATRICES = ("  using W = lmx_dense<T>;\n  const W mg = W{wg};\n  const W mu = W{wu};\n"
            "  const W md = W{wd};\n")
BODY = part("gated_mlp.rs", "BODY")

# Each block's first task by its index, not a ticket (faster, but blocks could then wait on
# tasks of blocks not yet running on a GPU that holds fewer at once).
STATIC_FIRST = [("    s_ticket = atomicAdd(control, 1);\n", "    s_ticket = blockIdx.x;\n"),
                ("      claimed = atomicAdd(control, 1);",
                 "      claimed = int(gridDim.x) + atomicAdd(control, 1);")]


def variant(name):
    body = BODY
    if name == "static_first":
        for old, new in STATIC_FIRST:
            assert old in body, "the body's tickets changed"
            body = body.replace(old, new)
    if name == "gate_only":
        body = body.replace("constexpr int TOTAL = TG + D / 4;", "constexpr int TOTAL = TG;")
    if name == "down_only":
        # The gate and up tasks count themselves done without reading a weight.
        body = body.replace("if (t < TG) {", "if (t < TG) { if (lane == 0) act[t * 8 + warp] = x[0]; } "
                            "else if (false) {", 1)
    return MATRICES + body


VARIANTS = ["lmx", "static_first", "gate_only", "down_only"]


def main():
    d, f, dtype = 2048, 5632, mx.bfloat16
    x = (mx.random.normal((1, 1, d)) * 0.1).astype(dtype)
    nw = mx.ones((d,), dtype=dtype)
    scale = 0.02
    layers = [tuple((mx.random.normal(s) * scale).astype(dtype)
                    for s in ((f, d), (f, d), (d, f))) for _ in range(LAYERS)]
    control = mx.zeros((256,), dtype=mx.int32)
    mx.eval(x, nw, layers, control)
    print(f"{'variant':>10} {'blocks':>6} {'us a launch':>11}  (weights {3 * f * d * 2 / 1e6:.1f} MB)")
    for name in VARIANTS:
        kernel = mx.fast.cuda_kernel(
            name=f"probe_mlp_{name}", input_names=["x", "nw", "wg", "wu", "wd", "res", "ctl"],
            output_names=["y", "act"], source=variant(name), header=HEADER)
        for blocks in (132, 198, 264) if name == "lmx" else (264,):
            def step(row, i):
                wg, wu, wd = layers[i % LAYERS]
                return kernel(
                    inputs=[row, nw, wg, wu, wd, row, control],
                    template=[("T", dtype), ("D", d), ("F", f), ("KX", f), ("ACT", 2),
                              ("EPS_BITS", EPS_BITS)],
                    grid=(blocks * 256, 1, 1), threadgroup=(256, 1, 1),
                    output_shapes=[row.shape, (f,)], output_dtypes=[dtype, dtype])[0]

            us = chained(step, x, REPS) * 1e6
            gbs = 3 * f * d * 2 / (us * 1e-6) / 1e12
            print(f"{name:>10} {blocks:>6} {us:>11.2f}  {gbs:.2f} TB/s", flush=True)


if __name__ == "__main__":
    main()
