"""Generation speed in Python MLX, written the way mlx-lm writes it: the anchor for `lmx bench generate`.

GPT-2 (learned positions, LayerNorm, GELU, tied head) and LLaMA (RMSNorm, RoPE, SwiGLU, GQA) with
random weights, a KV cache grown in steps of 256 as mlx_lm.models.cache.KVCache does, greedy decoding
with one mx.eval per token (mx.async_eval of the next token, as mlx_lm.generate does).

    python3 generate_anchor.py --model gpt2 --dim 768 --layers 12 --heads 12 --vocab 50257 --prompt 128 --tokens 128
prints one JSON line: prompt tokens/s, decode tokens/s.
"""

import argparse
import json
import time

import mlx.core as mx
import mlx.nn as nn


class KVCache:
    step = 256

    def __init__(self):
        self.keys = self.values = None
        self.offset = 0

    def update_and_fetch(self, keys, values):
        prev = self.offset
        if self.keys is None or (prev + keys.shape[2]) > self.keys.shape[2]:
            b, h, _, d = keys.shape
            n = (self.step + keys.shape[2] - 1) // self.step * self.step
            k = mx.zeros((b, h, n, d), keys.dtype)
            v = mx.zeros((b, h, n, d), values.dtype)
            if self.keys is not None:
                self.keys = mx.concatenate([self.keys[..., :prev, :], k], axis=2)
                self.values = mx.concatenate([self.values[..., :prev, :], v], axis=2)
            else:
                self.keys, self.values = k, v
        self.offset += keys.shape[2]
        self.keys[..., prev:self.offset, :] = keys
        self.values[..., prev:self.offset, :] = values
        return self.keys[..., : self.offset, :], self.values[..., : self.offset, :]


class Attention(nn.Module):
    def __init__(self, d, heads, kv_heads, rope, bias):
        super().__init__()
        self.heads, self.kv_heads, self.hd = heads, kv_heads, d // heads
        self.q = nn.Linear(d, d, bias=bias)
        self.k = nn.Linear(d, kv_heads * self.hd, bias=bias)
        self.v = nn.Linear(d, kv_heads * self.hd, bias=bias)
        self.o = nn.Linear(d, d, bias=bias)
        self.rope = nn.RoPE(self.hd, base=10000.0) if rope else None

    def __call__(self, x, cache):
        b, t, _ = x.shape
        q = self.q(x).reshape(b, t, self.heads, -1).transpose(0, 2, 1, 3)
        k = self.k(x).reshape(b, t, self.kv_heads, -1).transpose(0, 2, 1, 3)
        v = self.v(x).reshape(b, t, self.kv_heads, -1).transpose(0, 2, 1, 3)
        if self.rope is not None:
            q, k = self.rope(q, offset=cache.offset), self.rope(k, offset=cache.offset)
        k, v = cache.update_and_fetch(k, v)
        mask = "causal" if t > 1 else None
        o = mx.fast.scaled_dot_product_attention(q, k, v, scale=self.hd ** -0.5, mask=mask)
        return self.o(o.transpose(0, 2, 1, 3).reshape(b, t, -1))


class Block(nn.Module):
    def __init__(self, args):
        super().__init__()
        llama = args.model == "llama"
        d = args.dim
        self.llama = llama
        norm = (lambda: nn.RMSNorm(d)) if llama else (lambda: nn.LayerNorm(d))
        self.n1, self.n2 = norm(), norm()
        self.attn = Attention(d, args.heads, args.kv_heads or args.heads, llama, not llama)
        hidden = args.hidden or 4 * d
        self.up = nn.Linear(d, hidden, bias=not llama)
        self.down = nn.Linear(hidden, d, bias=not llama)
        self.gate = nn.Linear(d, hidden, bias=False) if llama else None

    def __call__(self, x, cache):
        x = x + self.attn(self.n1(x), cache)
        h = self.n2(x)
        h = nn.silu(self.gate(h)) * self.up(h) if self.llama else nn.gelu_approx(self.up(h))
        return x + self.down(h)


class Model(nn.Module):
    def __init__(self, args):
        super().__init__()
        self.args = args
        self.tok = nn.Embedding(args.vocab, args.dim)
        self.pos = nn.Embedding(args.ctx, args.dim) if args.model == "gpt2" else None
        self.blocks = [Block(args) for _ in range(args.layers)]
        self.norm = nn.RMSNorm(args.dim) if args.model == "llama" else nn.LayerNorm(args.dim)
        self.head = nn.Linear(args.dim, args.vocab, bias=False) if args.model == "llama" else None

    def __call__(self, x, caches):
        h = self.tok(x)
        if self.pos is not None:
            h = h + self.pos(mx.arange(caches[0].offset, caches[0].offset + x.shape[1]))
        for block, cache in zip(self.blocks, caches):
            h = block(h, cache)
        h = self.norm(h)
        return self.head(h) if self.head is not None else self.tok.as_linear(h)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", choices=["gpt2", "llama"], default="gpt2")
    p.add_argument("--dim", type=int, default=768)
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--kv-heads", type=int, default=0)
    p.add_argument("--hidden", type=int, default=0)
    p.add_argument("--vocab", type=int, default=50257)
    p.add_argument("--ctx", type=int, default=1024)
    p.add_argument("--prompt", type=int, default=128)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--device", default="default", choices=["default", "cpu", "gpu"])
    args = p.parse_args()
    if args.device != "default":
        mx.set_default_device(mx.cpu if args.device == "cpu" else mx.gpu)
    mx.random.seed(0)
    model = Model(args)
    if args.dtype == "bfloat16":
        model.set_dtype(mx.bfloat16)
    mx.eval(model.parameters())
    prompt = mx.random.randint(0, args.vocab, (1, args.prompt))

    def run():
        caches = [KVCache() for _ in model.blocks]
        t0 = time.perf_counter()
        logits = model(prompt, caches)
        y = mx.argmax(logits[:, -1, :], axis=-1)
        mx.eval(y)
        t1 = time.perf_counter()
        for _ in range(args.tokens - 1):
            next_y = mx.argmax(model(y[:, None], caches)[:, -1, :], axis=-1)
            mx.async_eval(next_y)
            y.item()
            y = next_y
        y.item()
        t2 = time.perf_counter()
        return args.prompt / (t1 - t0), (args.tokens - 1) / (t2 - t1)

    run()  # warm-up: kernels, caches
    prompt_tps, decode_tps = run()
    print(json.dumps({"impl": "python-mlx", "model": args.model, "prompt": args.prompt, "tokens": args.tokens,
                      "dtype": args.dtype, "prompt_tokens_per_s": round(prompt_tps, 1),
                      "decode_tokens_per_s": round(decode_tps, 1)}))


if __name__ == "__main__":
    main()
