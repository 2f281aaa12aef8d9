"""A whole LLaMA decoder layer's decoding step as one kernel, in Python MLX: exactness and speed.

The evidence behind decoding's fused kernels (docs/benchmarks.md, "Fourth session of
2026-11-28"): one launch per layer at TinyLlama-1.1B's shapes (bfloat16; the RMS norm, the query,
key and value products with RoPE and the cache written in place, attention over the cache in
chunks, the output product plus the residual, the norm, the SiLU-gated MLP plus the residual), its
blocks taking tasks in order from a counter in a control block (`layer.cu`), checked against MLX's
operations at four positions, then timed over 22 layers of distinct weights: the host's rate of a
token (one Python launch a layer), the GPU's span of a token (every launch in one graph), and one
layer's phases from the kernel's own clock.

On the GPU machine, after ../shared/gpu's two calls:
    source .gpu/p2/assemble.sh && OUT=/tmp/probe python3 bench/fused-layer-probe/probe.py
"""
import os, re, sys, time, struct, json
import mlx.core as mx
import mlx.nn as nn

here = os.path.dirname(os.path.abspath(__file__))
# The runtime's helpers (its gated MLP kernel's loads and warp sums), then the probe's own.
def rust_const(path, name):
    source = open(os.path.join(here, "../../lmx-runtime/src/cuda", path)).read()
    return re.search(r'const %s: &str = r#"(.*?)"#;' % name, source, re.S).group(1)
def rust_header(path):
    source = open(os.path.join(here, "../../lmx-runtime/src/cuda", path)).read()
    return re.search(r'const HEADER: &str = r#"(.*?)"#;', source, re.S).group(1)
HEADER = rust_header("matvec.rs") + rust_const("weights.rs", "STREAM") + rust_const("weights.rs", "DENSE") + rust_header("tasks.rs") + open(os.path.join(here, "layer.cuh")).read()
BODY = open(os.path.join(here, "layer.cu")).read()

D, NQ, NKV, HD, F = 2048, 32, 4, 64, 5632
CH, MAXLEN, LAYERS = 8, 1024, 22
EPS = 1e-5
EPS_BITS = struct.unpack("<i", struct.pack("<f", EPS))[0]
dt = mx.bfloat16

kernel = mx.fast.cuda_kernel(
    name="lmx_layer_probe",
    input_names=["x", "ctl", "n1", "wq", "wk", "wv", "inv_freq", "kc", "vc", "wo", "n2", "wg", "wu", "wd"],
    output_names=["out", "hbuf", "act", "qbuf", "part", "prof"],
    source=BODY,
    header=HEADER,
)
TA = (NQ + 2 * NKV) * HD // 8; TB = NQ * CH; TC = D // 8; TD = F // 8; TE = D // 4
TOTAL = TA + TB + TC + TD + TE
def template(prof=0):
    return [("T", dt), ("D", D), ("NQ", NQ), ("NKV", NKV), ("HD", HD), ("F", F), ("CH", CH),
            ("MAXLEN", MAXLEN), ("KX", max(D, F)), ("EPS_BITS", EPS_BITS), ("PROF", prof)]
inv_freq = (10000.0 ** (-mx.arange(0, HD, 2, dtype=mx.float32) / HD)).astype(mx.float32)


def fused(x, L, ctl, blocks, **kw):
    return fused_all(x, L, ctl, blocks, **kw)[0]


def fused_all(x, L, ctl, blocks, **kw):
    return kernel(
        inputs=[x, ctl, L["n1"], L["wq"], L["wk"], L["wv"], inv_freq, L["kc"], L["vc"], L["wo"], L["n2"], L["wg"], L["wu"], L["wd"]],
        template=template(**kw),
        grid=(blocks * 256, 1, 1),
        threadgroup=(256, 1, 1),
        output_shapes=[(D,), (D,), (F,), (NQ * HD,), (NQ * CH * (HD + 2),), (3 * TOTAL,)],
        output_dtypes=[dt, dt, dt, dt, mx.float32, mx.int64],
    )


def reference(x, L, kc, vc, pos):
    h = mx.fast.rms_norm(x[None, None], L["n1"], EPS)
    q = (h @ L["wq"].T).reshape(1, 1, NQ, HD).transpose(0, 2, 1, 3)
    k = (h @ L["wk"].T).reshape(1, 1, NKV, HD).transpose(0, 2, 1, 3)
    v = (h @ L["wv"].T).reshape(1, 1, NKV, HD).transpose(0, 2, 1, 3)
    q = mx.fast.rope(q, HD, traditional=False, base=10000.0, scale=1.0, offset=pos)
    k = mx.fast.rope(k, HD, traditional=False, base=10000.0, scale=1.0, offset=pos)
    kc = kc.reshape(1, NKV, MAXLEN, HD)
    vc = vc.reshape(1, NKV, MAXLEN, HD)
    K = mx.concatenate([kc[:, :, :pos], k], axis=2)
    Vv = mx.concatenate([vc[:, :, :pos], v], axis=2)
    a = mx.fast.scaled_dot_product_attention(q, K, Vv, scale=HD ** -0.5)
    o = a.transpose(0, 2, 1, 3).reshape(1, 1, D) @ L["wo"].T
    h2 = x[None, None] + o
    m = mx.fast.rms_norm(h2, L["n2"], EPS)
    out = h2 + (nn.silu(m @ L["wg"].T) * (m @ L["wu"].T)) @ L["wd"].T
    return out.reshape(D), k.reshape(NKV, HD), v.reshape(NKV, HD)


def layer(seed):
    mx.random.seed(seed)
    w = lambda o, i: (mx.random.normal((o, i)) * (i ** -0.5)).astype(dt)
    L = dict(n1=(1 + 0.1 * mx.random.normal((D,))).astype(dt), wq=w(NQ * HD, D), wk=w(NKV * HD, D),
             wv=w(NKV * HD, D), wo=w(D, NQ * HD), n2=(1 + 0.1 * mx.random.normal((D,))).astype(dt),
             wg=w(F, D), wu=w(F, D), wd=w(D, F),
             kc=mx.random.normal((NKV, MAXLEN, HD)).astype(dt), vc=mx.random.normal((NKV, MAXLEN, HD)).astype(dt))
    mx.eval(L)
    return L


def ctl_at(pos):
    c = [0] * 320
    c[256] = pos
    c = mx.array(c, dtype=mx.int32)
    mx.eval(c)
    return c


def rel(a, b):
    a = a.astype(mx.float32); b = b.astype(mx.float32)
    return (mx.abs(a - b).max() / mx.maximum(mx.abs(b).max(), 1e-6)).item()


results = {}
blocks = int(os.environ.get("BLOCKS", "264"))
L = layer(0)
x = mx.random.normal((D,)).astype(dt)
mx.eval(x)
for pos in [0, 5, 128, 700]:
    kc0 = mx.array(L["kc"]); vc0 = mx.array(L["vc"]);
    want, wk, wv = reference(x, L, kc0, vc0, pos)
    mx.eval(want, wk, wv)
    ctl = ctl_at(pos)
    got = fused(x, L, ctl, blocks)
    mx.eval(got)
    gk = L["kc"][:, pos]; gv = L["vc"][:, pos]
    r = dict(out=rel(got, want), k=rel(gk, wk), v=rel(gv, wv), ctl=[v for v in ctl.tolist() if v])
    # the same launch again with the advanced position, then back (control block reused)
    print("pos", pos, r, flush=True)
    results[f"pos{pos}"] = r

# Speed: LAYERS distinct layers, one launch each per token, a sync per token.
layers = [layer(i + 1) for i in range(LAYERS)]
variants = [dict()]
for kw, blocks in [(v, b) for v in variants for b in (264, 528)]:
    ctls = [ctl_at(128) for _ in range(LAYERS)]
    def token(x):
        for i in range(LAYERS):
            x = fused(x, layers[i], ctls[i], blocks, **kw)
        return x
    y = x
    for _ in range(5):
        y = token(y) * 0 + x
        mx.eval(y)
    n = 200
    t0 = time.perf_counter()
    for _ in range(n):
        y = token(x)
        mx.eval(y)
    dtime = (time.perf_counter() - t0) / n
    gb = sum(sum(v.nbytes for k, v in Li.items() if k not in ("kc", "vc")) for Li in layers) / 1e9
    print(f"{kw} blocks {blocks}: {dtime*1e3:.3f} ms a token of {LAYERS} layers, {gb/dtime:.0f} GB/s", flush=True)
    results[f"fused{blocks}{kw}"] = dict(ms=dtime * 1e3, gbps=gb / dtime)
    for i in range(LAYERS):
        c = ctls[i].tolist(); assert [v for j, v in enumerate(c) if j != 256] == [0] * 319, c

# Where one layer's time goes.
names = ["qkv", "attn", "o", "gate_up", "down"]
bounds = [0, TA, TA + TB, TA + TB + TC, TA + TB + TC + TD, TOTAL]
for blocks in (264,):
    ctl = ctl_at(128)
    for rep in range(4):
        outs = fused_all(x, layers[0], ctl, blocks, prof=1)
        mx.eval(outs)
    pr = outs[5].tolist()
    t0 = min(pr[0::3])
    line = []
    for k in range(5):
        a, b = bounds[k], bounds[k + 1]
        claims = pr[3 * a:3 * b:3]; starts = pr[3 * a + 1:3 * b:3]; ends = pr[3 * a + 2:3 * b:3]
        durs = sorted(e - s for s, e in zip(starts, ends))
        line.append(f"{names[k]}: claim {min(claims)-t0}..{max(claims)-t0} start {min(starts)-t0} end {max(ends)-t0} ns, task median {durs[len(durs)//2]} max {durs[-1]}")
    print(f"profile blocks {blocks}: {(max(outs[5].tolist()[2::3]) - min(outs[5].tolist()[0::3]))/1e3:.1f} us\n  " + "\n  ".join(line), flush=True)
    results[f"profile{blocks}"] = line

# The GPU's span of a token's 22 launches, from the first block's first ticket to the last
# block's last task (every launch encoded into one graph before it runs).
for blocks in (264, 528):
    ctls = [ctl_at(128) for _ in range(LAYERS)]
    spans = []
    for rep in range(20):
        y = x
        profs = []
        for i in range(LAYERS):
            outs = fused_all(y, layers[i], ctls[i], blocks, prof=1)
            y = outs[0]
            profs.append(outs[5])
        mx.eval(y, *profs)
        first = min(profs[0].tolist()[0::3]); last = max(profs[-1].tolist()[2::3])
        spans.append((last - first) / 1e3)
    spans.sort()
    print(f"GPU span of {LAYERS} layers, blocks {blocks}: median {spans[len(spans)//2]:.1f} us (min {spans[0]:.1f})", flush=True)
    results[f"span{blocks}"] = spans

# MLX's ops, the same 22 layers, compiled per layer.
def ref_stack(x, pos):
    for Li in layers:
        x, _, _ = reference(x, Li, Li["kc"], Li["vc"], pos)
    return x
cref = mx.compile(lambda x: ref_stack(x, 128))
for _ in range(3):
    mx.eval(cref(x))
n = 50
t0 = time.perf_counter()
for _ in range(n):
    mx.eval(cref(x))
dtime = (time.perf_counter() - t0) / n
print(f"MLX ops compiled: {dtime*1e3:.3f} ms a token", flush=True)
results["mlx_ops"] = dict(ms=dtime * 1e3)
out = os.environ.get("OUT")
if out:
    json.dump(results, open(os.path.join(out, "probe.json"), "w"), indent=1)
