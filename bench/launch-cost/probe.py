"""What one operation of a compiled decode step costs the host in MLX's CUDA backend, by kind:
chains of N operations on one [1, 2048] bfloat16 row, compiled, each "token" fed the last one's
output and queued one token ahead (`async_eval`), as lmx's decoding loop does. The per-operation
cost is the slope between two chain lengths, so the per-token fixed costs cancel.

Kinds: MLX's `fast.rms_norm` (a primitive compile does not fuse), and a custom kernel
(`mx.fast.cuda_kernel`) whose source carries a comment of 0, 8 and 32 KB (MLX hashes a custom
kernel's whole source at every launch to name its module); then the norm with a weight of its own
per operation passed as an input of the call, as a model's parameters are, and with a position
scalar made from the host's value each call.

    source .gpu/p2/assemble.sh && python3 bench/launch-cost/probe.py
    MLX_USE_CUDA_GRAPHS=0 python3 bench/launch-cost/probe.py   # direct launches
"""
import os, time
import mlx.core as mx

D = 2048
TOKENS = int(os.environ.get("TOKENS", "300"))
x0 = mx.random.normal((1, D)).astype(mx.bfloat16)
w = mx.ones((D,), dtype=mx.bfloat16)

def custom(pad_kb):
    body = "  int i = blockIdx.x * blockDim.x + threadIdx.x;\n  y[i] = x[i] * T(0.999f);\n"
    body = ("// " + "x" * 1021 + "\n") * pad_kb + body
    k = mx.fast.cuda_kernel(name=f"launch_cost_{pad_kb}", input_names=["x"],
                            output_names=["y"], source=body)
    return lambda x, _: k(inputs=[x], template=[("T", x.dtype)], grid=(D, 1, 1),
                       threadgroup=(256, 1, 1), output_shapes=[x.shape],
                       output_dtypes=[x.dtype])[0]

rms_norm = lambda x, w: mx.fast.rms_norm(x, w, 1e-5)
KINDS = {"rms_norm": rms_norm}
if mx.cuda.is_available():
    KINDS.update({f"custom_{kb}kb": custom(kb) for kb in (0, 8, 32)})

WEIGHTS = [mx.random.normal((D,)).astype(mx.bfloat16) for _ in range(300)]
mx.eval(WEIGHTS)

def per_token(op, n, weights=False, position=False):
    """Host microseconds a token of a chain of n operations `op`; with `weights`, each operation
    reads a weight of its own passed as an input of the compiled call (as a model's parameters
    are); with `position`, each call also takes a scalar made from the host's value."""
    def chain(x, *rest):
        ws = rest[:n] if weights else [w] * n
        for i in range(n):
            x = op(x, ws[i])
        return x
    step = mx.compile(chain)
    extra = WEIGHTS[:n] if weights else []
    call = lambda x, t: step(x, *extra, *([mx.array(t, dtype=mx.int32)] if position else []))
    x = call(x0, 0)
    mx.eval(x)
    for t in range(20):
        x = call(x, t)
    mx.eval(x)
    start = time.perf_counter()
    pending = call(x, 0)
    mx.async_eval(pending)
    for t in range(TOKENS):
        nxt = call(pending, t)
        mx.async_eval(nxt)
        mx.eval(pending)
        pending = nxt
    mx.eval(pending)
    return (time.perf_counter() - start) / (TOKENS + 1) * 1e6

print(f"MLX_USE_CUDA_GRAPHS={os.environ.get('MLX_USE_CUDA_GRAPHS', '1')} "
      f"MLX_MAX_OPS_PER_BUFFER={os.environ.get('MLX_MAX_OPS_PER_BUFFER', 'default')}")
def row(rnd, name, op, **how):
    t100, t300 = per_token(op, 100, **how), per_token(op, 300, **how)
    print(f"round {rnd} {name:22s} 100 ops {t100:8.1f} us/token, 300 ops {t300:8.1f} "
          f"us/token: {(t300 - t100) / 200:.2f} us an operation", flush=True)

for rnd in range(2):
    for name, op in KINDS.items():
        row(rnd, name, op)
    row(rnd, "rms_norm, own weights", rms_norm, weights=True)
    row(rnd, "rms_norm, + position", rms_norm, position=True)
