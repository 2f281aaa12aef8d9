"""mlx-lm's own generation speed: the anchor for `lmx bench generate --anchor bench/generate_mlx_lm.py`.

mlx-lm's GPT-2 or LLaMA model class at the sizes given (random weights, cast to the dtype, quantized
with nn.quantize at --bits if given, group size 64), decoding greedily with mlx-lm's own
`stream_generate` (batch 1) or `batch_generate` (--batch N, N prompts of the same length).

    python3 generate_mlx_lm.py --model llama --dim 2048 --layers 22 --heads 32 --kv-heads 4 \
        --hidden 5632 --vocab 32000 --ctx 2048 --prompt 128 --tokens 256 --dtype bfloat16

prints one JSON line: prompt tokens/s and decode tokens/s as mlx-lm reports them (`prompt_tps`,
`generation_tps`). The tokenizer is a word-level one with no end-of-sequence token, so that every
run generates exactly --tokens tokens, as lmx's side does.
"""

import argparse
import json
import os
import random
import sys
import tempfile

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.generate import batch_generate, stream_generate
from mlx_lm.models import gpt2, llama
from mlx_lm.utils import load_tokenizer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_finetune_inputs import write_tokenizer  # noqa: E402


def build(args):
    if args.model == "llama":
        model = llama.Model(llama.ModelArgs(
            model_type="llama", hidden_size=args.dim, num_hidden_layers=args.layers,
            intermediate_size=args.hidden, num_attention_heads=args.heads,
            num_key_value_heads=args.kv_heads or args.heads, vocab_size=args.vocab,
            rms_norm_eps=1e-5, rope_theta=10000.0, max_position_embeddings=args.ctx,
            tie_word_embeddings=False))
    else:
        model = gpt2.Model(gpt2.ModelArgs(
            model_type="gpt2", n_ctx=args.ctx, n_embd=args.dim, n_head=args.heads,
            n_layer=args.layers, n_positions=args.ctx, layer_norm_epsilon=1e-5,
            vocab_size=args.vocab))
    model.set_dtype(getattr(mx, args.dtype))
    if args.bits:
        nn.quantize(model, group_size=64, bits=args.bits)
    mx.eval(model.parameters())
    return model


def tokenizer(vocab):
    folder = tempfile.mkdtemp()
    write_tokenizer(folder, vocab)
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump(dict(tokenizer_class="PreTrainedTokenizerFast", unk_token="<unk>",
                       add_bos_token=False, model_max_length=1 << 20), f)
    return load_tokenizer(folder)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", choices=["gpt2", "llama"], required=True)
    for flag in ["--dim", "--layers", "--heads", "--vocab", "--ctx"]:
        p.add_argument(flag, type=int, required=True)
    p.add_argument("--kv-heads", type=int, default=0)
    p.add_argument("--hidden", type=int, default=0)
    p.add_argument("--prompt", type=int, default=128)
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--device", default="gpu")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--bits", type=int, default=0)
    args = p.parse_args()
    mx.set_default_device(mx.gpu if args.device == "gpu" else mx.cpu)
    model = build(args)
    tok = tokenizer(args.vocab)
    rng = random.Random(0)
    prompts = [[rng.randrange(3, args.vocab) for _ in range(args.prompt)]
               for _ in range(args.batch)]
    if args.batch == 1:
        def run(tokens):
            last = None
            for last in stream_generate(model, tok, mx.array(prompts[0]), max_tokens=tokens):
                pass
            assert last.generation_tokens == tokens, last.generation_tokens
            return last.prompt_tps, last.generation_tps
    else:
        def run(tokens):
            stats = batch_generate(model, tok, prompts, max_tokens=tokens).stats
            return stats.prompt_tps, stats.generation_tps
    run(8)  # warm-up: kernels compiled, buffers allocated
    prompt_tps, decode_tps = run(args.tokens)
    print(json.dumps({
        "impl": "mlx-lm", "model": args.model, "prompt": args.prompt, "tokens": args.tokens,
        "dtype": args.dtype, "batch": args.batch, "bits": args.bits or None,
        "prompt_tokens_per_s": prompt_tps, "decode_tokens_per_s": decode_tps,
        "device": args.device,
    }))


if __name__ == "__main__":
    main()
