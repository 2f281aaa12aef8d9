"""What a compiled MLX function's inputs cost each call: the same elementwise operations (13 a
layer over 22 layers, each layer reading 12 of its 25 leaves) over 550 parameter-like leaves (a
4-bit TinyLlama's count), the leaves passed as inputs of every call or captured as the trace's
constants; each call queued one ahead with `async_eval`, as lmx's decoding loop does.

    python3 bench/param_inputs_probe.py

Prints both per-call times and their difference, three rounds (docs/benchmarks.md, "Session of
2026-11-30").
"""
import time, mlx.core as mx
mx.set_default_device(mx.cpu)
L = 22; LEAVES_PER_LAYER = 25  # ~ 4-bit TinyLlama: 7 linears x 3 + norms
params = [mx.ones((4,)) * (i + 1) for i in range(L * LEAVES_PER_LAYER)]
mx.eval(params)
def body(x, ps):
    for l in range(L):
        p = ps[l * LEAVES_PER_LAYER:(l + 1) * LEAVES_PER_LAYER]
        # four ops a layer, each reading several leaves (as the kernels do)
        x = x + p[0] * p[1]
        x = x * p[2] + p[3] - p[4]
        x = mx.maximum(x, p[5]) + p[6] * p[7] + p[8]
        x = x / (p[9] + 2.0) + p[10] + p[11]
    return x
f_in = mx.compile(lambda x, *ps: body(x, ps))
f_cap = mx.compile(lambda x: body(x, params))
x = mx.ones((4,))
def bench(f, args, n=2000):
    y = f(*args); mx.eval(y)
    t = time.perf_counter()
    for _ in range(n):
        y = f(*args); mx.async_eval(y)
    mx.eval(y)
    return (time.perf_counter() - t) / n * 1e6
for r in range(3):
    a = bench(f_in, [x] + params)
    b = bench(f_cap, [x])
    print(f"inputs {a:.1f} us/call, captured {b:.1f} us/call, saved {a-b:.1f} us ({len(params)} leaves)")
