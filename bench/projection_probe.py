"""Times attention's query, key and value projections as three products against one product over
the three weights concatenated, at a GRPO update's shape at TinyLlama's size (bfloat16, 32 rows
of 128 positions, d_model 2048, 32 query heads and 4 key-value heads of 64, 22 layers).

    python3 bench/projection_probe.py

Each layer projects, rotates the queries and keys (`mx.fast.rope`), attends causally
(`mx.fast.scaled_dot_product_attention`) and projects the output, as mlx-lm's llama; the
layers' outputs feed the next. Timed: the forward pass alone (a frozen reference model) and the
forward and backward passes (the policy: gradients in every weight), each `mx.compile`d, the
median of 7 rounds of 5 calls evaluated at once. "fused" concatenates each layer's three
weights inside the step (their values change every update) and splits the product's output.
"""

import statistics
import time

import mlx.core as mx

import os

B, T, D, H, KV, HD, LAYERS = 32, 128, 2048, 32, 4, 64, 22
if os.environ.get("PROBE_SIZE") == "tiny":  # a quick check of the script on a CPU
    B, T, D, H, KV, HD, LAYERS = 2, 16, 64, 4, 2, 16, 2


def attention(x, wq, wk, wv, wo, fused):
    if fused:
        y = x @ mx.concatenate([wq, wk, wv], axis=0).T
        q, k, v = mx.split(y, [D, D + KV * HD], axis=-1)
    else:
        q, k, v = x @ wq.T, x @ wk.T, x @ wv.T
    q = q.reshape(B, T, H, HD).transpose(0, 2, 1, 3)
    k = k.reshape(B, T, KV, HD).transpose(0, 2, 1, 3)
    v = v.reshape(B, T, KV, HD).transpose(0, 2, 1, 3)
    q = mx.fast.rope(q, HD, traditional=False, base=10000.0, scale=1.0, offset=0)
    k = mx.fast.rope(k, HD, traditional=False, base=10000.0, scale=1.0, offset=0)
    a = mx.fast.scaled_dot_product_attention(q, k, v, scale=HD**-0.5, mask="causal")
    return x + a.transpose(0, 2, 1, 3).reshape(B, T, D) @ wo.T


def model(weights, x, fused):
    for wq, wk, wv, wo in weights:
        x = attention(x, wq, wk, wv, wo, fused)
    return x


def timed(fn, *args):
    mx.eval(fn(*args))
    rounds = []
    for _ in range(7):
        mx.synchronize()
        start = time.perf_counter()
        mx.eval([fn(*args) for _ in range(5)])
        mx.synchronize()
        rounds.append((time.perf_counter() - start) / 5)
    return statistics.median(rounds) * 1e3


def main():
    def w(rows, cols):
        return (mx.random.normal((rows, cols)) * cols**-0.5).astype(mx.bfloat16)

    weights = [(w(D, D), w(KV * HD, D), w(KV * HD, D), w(D, D)) for _ in range(LAYERS)]
    x = mx.random.normal((B, T, D)).astype(mx.bfloat16)
    cotangent = mx.random.normal((B, T, D)).astype(mx.bfloat16)
    mx.eval(weights, x, cotangent)
    for fused in (False, True, False, True):
        forward = mx.compile(lambda ws, x: model(ws, x, fused))
        loss = lambda ws, x: (model(ws, x, fused) * cotangent).astype(mx.float32).sum()
        both = mx.compile(mx.value_and_grad(loss))
        print(
            f"{'fused' if fused else 'three':>5}: forward {timed(forward, weights, x):7.2f} ms, "
            f"forward and backward {timed(both, weights, x):7.2f} ms ({LAYERS} layers)",
            flush=True,
        )


if __name__ == "__main__":
    main()
