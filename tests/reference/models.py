"""Independent Python MLX references of the bundled models (models/*.lmx) at their `tiny` presets.

Each model is written the way mlx-lm writes its architecture (mlx.nn layers, mx.fast kernels),
but follows the semantics of its .lmx file where they differ from the published model: GPT-2 and
MPT use the exact (erf) GELU, and Mistral's tiny preset attends globally in every 4th layer and
through a sliding window of 32 elsewhere. Module attribute names make each parameter's dotted name the one the generated Rust
tree uses (`lmx::runtime::tree::names`), so the weights load by name with `strict=True`.

For every model `<name>` this reads, from the fixture folder (first argument, default
tests/fixtures):

- `<name>_tiny.safetensors`: the parameters (float16, widened here to float32), written by
  `cargo run --example export_tiny`;
- `<name>_tiny_io.safetensors`: `tokens`, int32 [B, T];

and rewrites `<name>_tiny_io.safetensors` with `tokens` and the float32 `logits` [B, T, vocab]
of this reference. `tests/reference/make_fixtures.sh` runs both steps.
"""

import math
import sys
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn


@dataclass
class Args:
    """The settings of one model (a `.lmx` file's config at its `tiny` preset)."""

    vocab: int = 256
    ctx: int = 256
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    n_kv_heads: int = 4
    head_dim: int = 16
    d_ff: int = 256
    eps: float = 1e-5
    rope_base: float = 10000.0
    window: int = 0
    global_every: int = 0
    n_experts: int = 0
    experts_per_token: int = 0


def causal_mask(length: int, window: int = 0) -> mx.array:
    """Boolean [T, T] mask, True where query i may see key j: j <= i and, with a window,
    i - j < window (mlx-lm's `create_causal_mask` with `window_size`)."""
    rows = mx.arange(length)[:, None]
    cols = mx.arange(length)[None]
    mask = rows >= cols
    if window:
        mask = mask & (rows < cols + window)
    return mask


# GPT-2 (models/gpt2.lmx): learned positions, LayerNorm, exact GELU, tied head.


class Gpt2Attention(nn.Module):
    def __init__(self, args: Args):
        super().__init__()
        self.n_heads = args.n_heads
        self.scale = (args.d_model // args.n_heads) ** -0.5
        self.c_attn = nn.Linear(args.d_model, 3 * args.d_model)
        self.c_proj = nn.Linear(args.d_model, args.d_model)

    def __call__(self, x: mx.array) -> mx.array:
        B, L, D = x.shape
        q, k, v = mx.split(self.c_attn(x), 3, axis=-1)
        q, k, v = (a.reshape(B, L, self.n_heads, -1).transpose(0, 2, 1, 3) for a in (q, k, v))
        out = mx.fast.scaled_dot_product_attention(q, k, v, scale=self.scale, mask="causal")
        return self.c_proj(out.transpose(0, 2, 1, 3).reshape(B, L, D))


class Gpt2Mlp(nn.Module):
    def __init__(self, args: Args):
        super().__init__()
        self.c_fc = nn.Linear(args.d_model, 4 * args.d_model)
        self.c_proj = nn.Linear(4 * args.d_model, args.d_model)

    def __call__(self, x: mx.array) -> mx.array:
        return self.c_proj(nn.gelu_approx(self.c_fc(x)))


class Gpt2Block(nn.Module):
    def __init__(self, args: Args):
        super().__init__()
        self.ln_1 = nn.LayerNorm(args.d_model, eps=args.eps)
        self.attn = Gpt2Attention(args)
        self.ln_2 = nn.LayerNorm(args.d_model, eps=args.eps)
        self.mlp = Gpt2Mlp(args)

    def __call__(self, x: mx.array) -> mx.array:
        h = x + self.attn(self.ln_1(x))
        return h + self.mlp(self.ln_2(h))


class Gpt2(nn.Module):
    def __init__(self, args: Args):
        super().__init__()
        self.wte = nn.Embedding(args.vocab, args.d_model)
        self.wpe = nn.Embedding(args.ctx, args.d_model)
        self.h = [Gpt2Block(args) for _ in range(args.n_layers)]
        self.ln_f = nn.LayerNorm(args.d_model, eps=args.eps)

    def __call__(self, tokens: mx.array) -> mx.array:
        h = self.wte(tokens) + self.wpe(mx.arange(tokens.shape[1]))
        for block in self.h:
            h = block(h)
        return self.wte.as_linear(self.ln_f(h))


# LLaMA family (models/llama.lmx, gemma.lmx, mistral.lmx, mixtral.lmx): RMSNorm, RoPE,
# grouped-query attention, gated MLPs.


class LlamaAttention(nn.Module):
    def __init__(self, args: Args, window: int = 0):
        super().__init__()
        d, hd = args.d_model, args.head_dim
        self.n_heads, self.n_kv_heads, self.window = args.n_heads, args.n_kv_heads, window
        self.scale = hd**-0.5
        self.q_proj = nn.Linear(d, args.n_heads * hd, bias=False)
        self.k_proj = nn.Linear(d, args.n_kv_heads * hd, bias=False)
        self.v_proj = nn.Linear(d, args.n_kv_heads * hd, bias=False)
        self.o_proj = nn.Linear(args.n_heads * hd, d, bias=False)
        self.rope = nn.RoPE(hd, traditional=False, base=args.rope_base)

    def __call__(self, x: mx.array) -> mx.array:
        B, L, _ = x.shape
        q = self.q_proj(x).reshape(B, L, self.n_heads, -1).transpose(0, 2, 1, 3)
        k = self.k_proj(x).reshape(B, L, self.n_kv_heads, -1).transpose(0, 2, 1, 3)
        v = self.v_proj(x).reshape(B, L, self.n_kv_heads, -1).transpose(0, 2, 1, 3)
        q, k = self.rope(q), self.rope(k)
        mask = causal_mask(L, self.window) if self.window else "causal"
        out = mx.fast.scaled_dot_product_attention(q, k, v, scale=self.scale, mask=mask)
        return self.o_proj(out.transpose(0, 2, 1, 3).reshape(B, L, -1))


class GatedMlp(nn.Module):
    """`down_proj(act(gate_proj(x)) * up_proj(x))`: SwiGLU with silu, GeGLU with gelu_approx."""

    def __init__(self, args: Args, activation=nn.silu):
        super().__init__()
        self.activation = activation
        self.gate_proj = nn.Linear(args.d_model, args.d_ff, bias=False)
        self.up_proj = nn.Linear(args.d_model, args.d_ff, bias=False)
        self.down_proj = nn.Linear(args.d_ff, args.d_model, bias=False)

    def __call__(self, x: mx.array) -> mx.array:
        return self.down_proj(self.activation(self.gate_proj(x)) * self.up_proj(x))


class MixtralSwitchGlu(nn.Module):
    """The experts' weights stacked `[experts, out, in]`, as mlx-lm's `SwitchGLU` holds them."""

    def __init__(self, args: Args):
        super().__init__()
        e, d, f = args.n_experts, args.d_model, args.d_ff
        self.gate_proj = {"weight": mx.zeros((e, f, d))}
        self.up_proj = {"weight": mx.zeros((e, f, d))}
        self.down_proj = {"weight": mx.zeros((e, d, f))}

    def expert(self, e: int, x: mx.array) -> mx.array:
        gate = x @ self.gate_proj["weight"][e].T
        up = x @ self.up_proj["weight"][e].T
        return (nn.silu(gate) * up) @ self.down_proj["weight"][e].T


class MixtralSparseMoe(nn.Module):
    """mlx-lm's routing: top-k gate logits by argpartition, softmax over the k chosen, and the
    experts' outputs weighted by it (dense over experts here, every expert on every token with
    the unchosen ones masked, instead of mlx-lm's gather_mm)."""

    def __init__(self, args: Args):
        super().__init__()
        self.k = args.experts_per_token
        self.n_experts = args.n_experts
        self.gate = nn.Linear(args.d_model, args.n_experts, bias=False)
        self.switch_mlp = MixtralSwitchGlu(args)
        # The smallest gap between the k-th and (k+1)-th gate logit of the last call: how far
        # the routing is from a tie that rounding could flip.
        self.margin = None

    def __call__(self, x: mx.array) -> mx.array:
        gates = self.gate(x)
        inds = mx.stop_gradient(mx.argpartition(-gates, kth=self.k - 1, axis=-1)[..., : self.k])
        scores = mx.softmax(mx.take_along_axis(gates, inds, axis=-1), axis=-1, precise=True)
        ranked = mx.sort(gates, axis=-1)
        self.margin = (ranked[..., -self.k] - ranked[..., -self.k - 1]).min().item()
        y = mx.zeros_like(x)
        for e in range(self.n_experts):
            weight = (scores * (inds == e)).sum(axis=-1, keepdims=True)
            y = y + weight * self.switch_mlp.expert(e, x)
        return y


class GemmaRMSNorm(nn.Module):
    """Gemma's RMSNorm, as mlx-lm writes it: the scale is 1 + weight."""

    def __init__(self, dims: int, eps: float):
        super().__init__()
        self.weight = mx.zeros((dims,))
        self.eps = eps

    def __call__(self, x: mx.array) -> mx.array:
        return mx.fast.rms_norm(x, 1.0 + self.weight, self.eps)


class LlamaDecoderLayer(nn.Module):
    def __init__(self, args: Args, window: int = 0, mlp=None, norm=nn.RMSNorm):
        super().__init__()
        self.input_layernorm = norm(args.d_model, eps=args.eps)
        self.self_attn = LlamaAttention(args, window)
        self.post_attention_layernorm = norm(args.d_model, eps=args.eps)
        self.moe = bool(args.n_experts)
        if self.moe:
            self.block_sparse_moe = MixtralSparseMoe(args)
        else:
            self.mlp = mlp or GatedMlp(args)

    def __call__(self, x: mx.array) -> mx.array:
        h = x + self.self_attn(self.input_layernorm(x))
        ffn = self.block_sparse_moe if self.moe else self.mlp
        return h + ffn(self.post_attention_layernorm(h))


class LlamaModel(nn.Module):
    def __init__(self, args: Args, layers, norm=nn.RMSNorm):
        super().__init__()
        self.embed_tokens = nn.Embedding(args.vocab, args.d_model)
        self.layers = layers
        self.norm = norm(args.d_model, eps=args.eps)


class Llama(nn.Module):
    """LLaMA, Mistral (sliding window in layers whose number is not a multiple of
    `global_every`) and Mixtral (sparse MoE): untied head."""

    def __init__(self, args: Args):
        super().__init__()

        def window(i: int) -> int:
            sliding = args.window and (args.global_every == 0 or (i + 1) % args.global_every != 0)
            return args.window if sliding else 0

        layers = [LlamaDecoderLayer(args, window(i)) for i in range(args.n_layers)]
        self.model = LlamaModel(args, layers)
        self.lm_head = nn.Linear(args.d_model, args.vocab, bias=False)

    def __call__(self, tokens: mx.array) -> mx.array:
        h = self.model.embed_tokens(tokens)
        for layer in self.model.layers:
            h = layer(h)
        return self.lm_head(self.model.norm(h))


class Gemma(nn.Module):
    """Gemma: embeddings scaled by sqrt(d_model), GeGLU (tanh GELU), multi-query attention,
    RMSNorm scaled by 1 + weight, tied head."""

    def __init__(self, args: Args):
        super().__init__()
        self.d_model = args.d_model
        layers = [
            LlamaDecoderLayer(args, mlp=GatedMlp(args, nn.gelu_approx), norm=GemmaRMSNorm)
            for _ in range(args.n_layers)
        ]
        self.model = LlamaModel(args, layers, norm=GemmaRMSNorm)

    def __call__(self, tokens: mx.array) -> mx.array:
        h = self.model.embed_tokens(tokens) * (self.d_model**0.5)
        for layer in self.model.layers:
            h = layer(h)
        return self.model.embed_tokens.as_linear(self.model.norm(h))


# MPT (models/mpt.lmx): ALiBi, LayerNorm without bias, no biases, exact GELU, tied head.


def mpt_alibi_slopes(n_heads: int, alibi_bias_max: float = 8.0) -> mx.array:
    """Hugging Face MPT's `gen_slopes`: 2^(-max * i / n) for the next power of two n, the odd
    then even ones when n_heads is not a power of two."""
    n = 2 ** math.ceil(math.log2(n_heads))
    m = mx.arange(1, n + 1, dtype=mx.float32) * (alibi_bias_max / n)
    slopes = 1.0 / mx.power(2.0, m)
    if n != n_heads:
        slopes = mx.concatenate([slopes[1::2], slopes[::2]])[:n_heads]
    return slopes


def mpt_alibi_mask(n_heads: int, length: int) -> mx.array:
    """Additive [heads, T, T] mask: Hugging Face MPT's bias slope * (j - (T - 1)) over key j
    (equal under the softmax to slope * (j - i)), and -inf above the diagonal."""
    bias = mpt_alibi_slopes(n_heads)[:, None, None] * mx.arange(1 - length, 1)[None, None, :]
    blocked = mx.where(causal_mask(length), 0.0, -mx.inf)
    return bias + blocked[None]


class MptAttention(nn.Module):
    def __init__(self, args: Args):
        super().__init__()
        self.n_heads = args.n_heads
        self.scale = (args.d_model // args.n_heads) ** -0.5
        self.Wqkv = nn.Linear(args.d_model, 3 * args.d_model, bias=False)
        self.out_proj = nn.Linear(args.d_model, args.d_model, bias=False)

    def __call__(self, x: mx.array) -> mx.array:
        B, L, D = x.shape
        q, k, v = mx.split(self.Wqkv(x), 3, axis=-1)
        q, k, v = (a.reshape(B, L, self.n_heads, -1).transpose(0, 2, 1, 3) for a in (q, k, v))
        mask = mpt_alibi_mask(self.n_heads, L)
        out = mx.fast.scaled_dot_product_attention(q, k, v, scale=self.scale, mask=mask)
        return self.out_proj(out.transpose(0, 2, 1, 3).reshape(B, L, D))


class MptFfn(nn.Module):
    def __init__(self, args: Args):
        super().__init__()
        self.up_proj = nn.Linear(args.d_model, args.d_ff, bias=False)
        self.down_proj = nn.Linear(args.d_ff, args.d_model, bias=False)

    def __call__(self, x: mx.array) -> mx.array:
        return self.down_proj(nn.gelu(self.up_proj(x)))


class MptBlock(nn.Module):
    def __init__(self, args: Args):
        super().__init__()
        self.norm_1 = nn.LayerNorm(args.d_model, eps=args.eps, bias=False)
        self.attn = MptAttention(args)
        self.norm_2 = nn.LayerNorm(args.d_model, eps=args.eps, bias=False)
        self.ffn = MptFfn(args)

    def __call__(self, x: mx.array) -> mx.array:
        h = x + self.attn(self.norm_1(x))
        return h + self.ffn(self.norm_2(h))


class MptTransformer(nn.Module):
    def __init__(self, args: Args):
        super().__init__()
        self.wte = nn.Embedding(args.vocab, args.d_model)
        self.blocks = [MptBlock(args) for _ in range(args.n_layers)]
        self.norm_f = nn.LayerNorm(args.d_model, eps=args.eps, bias=False)


class Mpt(nn.Module):
    def __init__(self, args: Args):
        super().__init__()
        self.transformer = MptTransformer(args)

    def __call__(self, tokens: mx.array) -> mx.array:
        h = self.transformer.wte(tokens)
        for block in self.transformer.blocks:
            h = block(h)
        return self.transformer.wte.as_linear(self.transformer.norm_f(h))


# The `tiny` presets, as models/*.lmx declare them (defaults overridden by `preset tiny`).
MODELS = {
    "gpt2": (Gpt2, Args(n_heads=2, head_dim=32, d_ff=256)),
    "llama": (Llama, Args(n_kv_heads=2, d_ff=172)),
    "gemma": (Gemma, Args(n_kv_heads=1, head_dim=32, d_ff=256, eps=1e-6)),
    "mistral": (
        Llama,
        Args(n_layers=4, n_kv_heads=2, d_ff=128, window=32, global_every=4),
    ),
    "mixtral": (
        Llama,
        Args(n_kv_heads=2, d_ff=128, rope_base=1e6, n_experts=4, experts_per_token=2),
    ),
    "mpt": (Mpt, Args(d_ff=256)),
}


def run(name: str, fixtures: Path) -> None:
    """Loads `name`'s weights and tokens from `fixtures` and writes its logits next to them."""
    cls, args = MODELS[name]
    model = cls(args)
    weights = mx.load(str(fixtures / f"{name}_tiny.safetensors"))
    model.load_weights([(k, v.astype(mx.float32)) for k, v in weights.items()], strict=True)
    io_path = fixtures / f"{name}_tiny_io.safetensors"
    tokens = mx.load(str(io_path))["tokens"]
    logits = model(tokens).astype(mx.float32)
    mx.eval(logits)
    mx.save_safetensors(str(io_path), {"tokens": tokens, "logits": logits})
    scale = mx.abs(logits).max().item()
    line = f"{name}: tokens {tokens.shape}, logits {logits.shape}, max |logit| {scale:.4f}"
    if args.n_experts:
        margin = min(layer.block_sparse_moe.margin for layer in model.model.layers)
        line += f", smallest top-k routing margin {margin:.2e}"
    print(line)


def main() -> None:
    fixtures = Path(sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures")
    print(f"mlx {mx.__version__} on {mx.default_device()}")
    for name in MODELS:
        run(name, fixtures)


if __name__ == "__main__":
    main()
