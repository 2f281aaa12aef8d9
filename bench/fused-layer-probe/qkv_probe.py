"""A decoding kernel of a pre-norm attention block's query, key and value (`qkv.cu`) alone, in
Python MLX: its numbers against MLX's operations, its time, and why the cache's write is not
part of it (docs/benchmarks.md, "Fifth session of 2026-11-28").

Reads the kernel's helpers from the runtime's sources, launches it at TinyLlama-1.1B's
shapes (bfloat16), and times chains of 22 launches in one evaluation (each launch's input the
output before it), beside the same chain of the gated MLP kernel and of MLX's separate operations
(the norm, the three products, two rotations). Then checks whether MLX writes a cache buffer in
place (donates it) when an operation before the write reads it: it does not, which is why the
kernel leaves the cache to the write and attention after it.

On the GPU machine, after ../shared/gpu's two calls:
    source .gpu/p2/assemble.sh && python3 bench/fused-layer-probe/qkv_probe.py
"""
import ctypes, os, re, struct
# One CUDA graph an evaluation (MLX commits one every 100 operations or 1,000 MB of inputs on an
# H100 or H200): a chain's launches then run back to back, not as the host encodes them.
os.environ.setdefault("MLX_MAX_OPS_PER_BUFFER", "100000")
os.environ.setdefault("MLX_MAX_MB_PER_BUFFER", "1000000")
import mlx.core as mx

here = os.path.dirname(os.path.abspath(__file__))
def rust(path, name):
    source = open(os.path.join(here, "../../lmx-runtime/src/cuda", path)).read()
    return re.search(r'const %s: &str = r#"(.*?)"#;' % name, source, re.S).group(1)
HEADER = rust("matvec.rs", "HEADER") + rust("weights.rs", "STREAM") + rust("weights.rs", "DENSE") + rust("tasks.rs", "HEADER")
BODY = open(os.path.join(here, "qkv.cu")).read()

D, HQ, HKV, HD, CAP, F = 2048, 32, 4, 64, 512, 5632
EPS = 1e-5
EPS_BITS = struct.unpack("<i", struct.pack("<f", EPS))[0]
dt = mx.bfloat16
qkv = mx.fast.cuda_kernel(
    name="lmx_normed_qkv_probe",
    input_names=["x", "nw", "wq", "wk", "wv", "q_rates", "k_rates", "q_at", "k_at"],
    output_names=["q", "k", "v"], source=BODY, header=HEADER)
mlp = mx.fast.cuda_kernel(
    name="lmx_gated_mlp_probe", input_names=["x", "nw", "wg", "wu", "wd", "res", "ctl"],
    output_names=["y", "act"], source=rust("gated_mlp.rs", "BODY"),
    header=rust("activation.rs", "HEADER") + HEADER)
rates = (10000.0 ** (-mx.arange(0, HD, 2, dtype=mx.float32) / HD)).astype(mx.float32)
ctl_m = mx.zeros((256,), dtype=mx.int32)
BLOCKS = (HQ + 2 * HKV) * HD // 8


# The same kernel with the norm left out (x copied to shared memory as it is): what the norm costs.
plain_body = BODY.replace(
    "lmx_task_rms_norm<T, D, WARPS>(x, nw, xs, eps, red, aligned);",
    """for (int i = threadIdx.x; i < D / (16 / int(sizeof(T))); i += 256)
    reinterpret_cast<uint4*>(xs)[i] = reinterpret_cast<const uint4*>(x)[i];
  __syncthreads();""")
qkv_plain = mx.fast.cuda_kernel(
    name="lmx_plain_qkv_probe",
    input_names=["x", "nw", "wq", "wk", "wv", "q_rates", "k_rates", "q_at", "k_at"],
    output_names=["q", "k", "v"], source=plain_body, header=HEADER)
POSITIONS = {pos: mx.array(pos, dtype=mx.int32) for pos in (0, 5, 300, 511)}
mx.eval(POSITIONS)
# A launch's own cost: a kernel of the same helpers that copies one value.
noop = mx.fast.cuda_kernel(name="lmx_noop_probe", input_names=["x"], output_names=["y"],
                           source="  if (threadIdx.x == 0) y[0] = x[0];", header=HEADER)


def fused(x, L, pos, kernel=None):
    p = POSITIONS[pos]
    return (kernel or qkv)(
        inputs=[x, L["nw"], L["wq"], L["wk"], L["wv"], rates, rates, p, p],
        template=[("T", dt), ("D", D), ("HQ", HQ), ("HKV", HKV), ("HD", HD), ("EPS_BITS", EPS_BITS)],
        grid=(BLOCKS * 256, 1, 1), threadgroup=(256, 1, 1),
        output_shapes=[(1, HQ, 1, HD), (1, HKV, 1, HD), (1, HKV, 1, HD)],
        output_dtypes=[dt, dt, dt])


def gated(x, L):
    return mlp(inputs=[x, L["nw"], L["wg"], L["wu"], L["wd"], x, ctl_m],
               template=[("T", dt), ("D", D), ("F", F), ("KX", F), ("ACT", 0), ("EPS_BITS", EPS_BITS)],
               grid=(264 * 256, 1, 1), threadgroup=(256, 1, 1),
               output_shapes=[(D,), (F,)], output_dtypes=[dt, dt])[0]


def separate(x, L, pos):
    h = mx.fast.rms_norm(x.reshape(1, 1, D), L["nw"], EPS)
    q = (h @ L["wq"].T).reshape(1, 1, HQ, HD).transpose(0, 2, 1, 3)
    k = (h @ L["wk"].T).reshape(1, 1, HKV, HD).transpose(0, 2, 1, 3)
    v = (h @ L["wv"].T).reshape(1, 1, HKV, HD).transpose(0, 2, 1, 3)
    q = mx.fast.rope(q, HD, traditional=False, base=10000.0, scale=1.0, offset=pos)
    k = mx.fast.rope(k, HD, traditional=False, base=10000.0, scale=1.0, offset=pos)
    return q, k, v


def layer(seed):
    mx.random.seed(seed)
    w = lambda o, i: (mx.random.normal((o, i)) * (i ** -0.5)).astype(dt)
    L = dict(nw=(1 + 0.1 * mx.random.normal((D,))).astype(dt), wq=w(HQ * HD, D), wk=w(HKV * HD, D),
             wv=w(HKV * HD, D), kc=mx.random.normal((1, HKV, CAP, HD)).astype(dt),
             wg=w(F, D), wu=w(F, D), wd=w(D, F))
    mx.eval(L)
    return L


def rel(a, b):
    a = a.astype(mx.float32); b = b.astype(mx.float32)
    return (mx.abs(a - b).max() / mx.maximum(mx.abs(b).max(), 1e-6)).item()


L = layer(0)
x = mx.random.normal((D,)).astype(dt)
for pos in [0, 5, 300, 511]:
    got = fused(x, L, pos)
    want = separate(x, L, pos)
    print(f"pos {pos}:", " ".join(f"{n} {rel(g, w):.4f}" for n, g, w in zip("qkv", got, want)), flush=True)

layers = [layer(i + 1) for i in range(22)]
def chain(f, y):
    for Li in layers:
        y = f(y, Li)
    return y

# The GPU's time of a chain: a clock kernel before it and one after it (each copies its input on,
# thread 0 writing the GPU's clock), all in one graph.
clock = mx.fast.cuda_kernel(
    name="lmx_clock_probe", input_names=["x"], output_names=["y", "t"],
    source="""
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < N) y[i] = x[i];
  if (i == 0) {
    long long now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    t[0] = now;
  }""")
def clocked(z):
    return clock(inputs=[z], template=[("N", D)], grid=(D, 1, 1), threadgroup=(256, 1, 1),
                 output_shapes=[(D,), (1,)], output_dtypes=[dt, mx.int64])


def timed(name, step, n=10):
    for _ in range(3):
        mx.eval(step(x))
    spans = []
    for _ in range(n):
        y, t0 = clocked(x)
        y, t1 = clocked(step(y))
        mx.eval(y, t0, t1)
        spans.append((t1.item() - t0.item()) / 1e3)
    spans.sort()
    us = spans[len(spans) // 2]
    print(f"{name}: GPU {us:.1f} us a chain of 22 (median of {n}), {us / 22:.2f} us a layer", flush=True)

timed("normed query, key and value", lambda y: chain(lambda z, Li: fused(z, Li, 300)[0].reshape(D), y))
timed("a launch that copies one value", lambda y: chain(lambda z, Li: noop(
    inputs=[z], template=[], grid=(D, 1, 1), threadgroup=(256, 1, 1), output_shapes=[(D,)],
    output_dtypes=[dt])[0], y))
timed("gated MLP", lambda y: chain(lambda z, Li: gated(z, Li), y))
def every(outputs):
    q, k, v = outputs
    return q.reshape(D) + (k.reshape(-1)[:1] + v.reshape(-1)[:1]) * 0
timed("MLX's separate operations", lambda y: chain(lambda z, Li: every(separate(z, Li, 300)), y))
timed("normed query, key and value, every output read", lambda y: chain(lambda z, Li: every(fused(z, Li, 300)), y))
timed("the same without the norm, every output read", lambda y: chain(lambda z, Li: every(fused(z, Li, 300, qkv_plain)), y))
timed("normed query, key and value, again", lambda y: chain(lambda z, Li: fused(z, Li, 300)[0].reshape(D), y))
timed("MLX's separate operations, again", lambda y: chain(lambda z, Li: every(separate(z, Li, 300)), y))

# Whether a cache's write reuses its buffer (MLX donates an input held by nothing else) when an
# operation it depends on reads the buffer first: the data's address before and after.
def address(a):
    return ctypes.addressof(ctypes.c_char.from_buffer(memoryview(a)))
for reads in (False, True):
    try:
        b0 = mx.array(L["kc"]) * 1
        mx.eval(b0)
        before = address(b0)
        if reads:
            kn = b0.sum(axis=2, keepdims=True)
        else:
            kn = mx.ones((1, HKV, 1, HD), dtype=dt)
        places = mx.broadcast_to(mx.array(300, dtype=mx.int32).reshape(1, 1, 1, 1), kn.shape)
        b1 = mx.put_along_axis(b0, places, kn, axis=2)
        del b0
        mx.eval(b1)
        print("read first" if reads else "write alone", "donated" if address(b1) == before else "copied", flush=True)
    except Exception as err:
        print("address check failed:", err, flush=True)
