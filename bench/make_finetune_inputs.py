"""Writes what the fine-tuning benchmark (bench/finetune-gpu.sh) trains on, without a network:

- MODEL/: a LLaMA in Hugging Face's layout (config.json, model.safetensors in bfloat16, a
  tokenizer) with TinyLlama-1.1B's configuration and random weights, built with mlx-lm's own
  model class so that mlx-lm loads it as it loads a published model;
- DATA/: train.jsonl and valid.jsonl of `text` examples, each exactly LENGTH tokens with the
  end-of-sequence token mlx-lm appends, so that both trainers see the same unpadded batches.

    python bench/make_finetune_inputs.py MODEL DATA [--preset tinyllama|tiny] [--length 512]

The tokenizer is a word-level one over the words w0 .. w{vocab-1}: one word, one token.
"""

import argparse
import json
import os

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten
from mlx_lm.models import llama

PRESETS = {
    # TinyLlama-1.1B (its config.json on the Hub).
    "tinyllama": dict(
        hidden_size=2048,
        num_hidden_layers=22,
        intermediate_size=5632,
        num_attention_heads=32,
        num_key_value_heads=4,
        vocab_size=32000,
        max_position_embeddings=2048,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
    ),
    # A CPU-sized check of this script and of the benchmark's commands.
    "tiny": dict(
        hidden_size=64,
        num_hidden_layers=4,
        intermediate_size=172,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=512,
        max_position_embeddings=1024,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
    ),
}


def write_model(folder, settings, seed):
    os.makedirs(folder, exist_ok=True)
    config = dict(
        model_type="llama",
        architectures=["LlamaForCausalLM"],
        tie_word_embeddings=False,
        attention_bias=False,
        mlp_bias=False,
        hidden_act="silu",
        rope_scaling=None,
        torch_dtype="bfloat16",
        bos_token_id=1,
        eos_token_id=2,
        **settings,
    )
    mx.random.seed(seed)
    model = llama.Model(llama.ModelArgs.from_dict(config))
    model.set_dtype(mx.bfloat16)
    weights = dict(tree_flatten(model.parameters()))
    mx.save_safetensors(os.path.join(folder, "model.safetensors"), weights, {"format": "pt"})
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    write_tokenizer(folder, settings["vocab_size"])


def write_tokenizer(folder, vocab):
    specials = ["<unk>", "<s>", "</s>"]
    words = specials + [f"w{i}" for i in range(vocab - len(specials))]
    tokenizer = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            dict(id=i, content=t, single_word=False, lstrip=False, rstrip=False,
                 normalized=False, special=True)
            for i, t in enumerate(specials)
        ],
        "normalizer": None,
        "pre_tokenizer": {"type": "WhitespaceSplit"},
        "post_processor": None,
        "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": False},
        "model": {"type": "WordLevel", "vocab": {w: i for i, w in enumerate(words)},
                  "unk_token": "<unk>"},
    }
    with open(os.path.join(folder, "tokenizer.json"), "w") as f:
        json.dump(tokenizer, f)
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump(dict(tokenizer_class="PreTrainedTokenizerFast", bos_token="<s>",
                       eos_token="</s>", unk_token="<unk>", add_bos_token=False,
                       model_max_length=1 << 20), f, indent=2)


def write_data(folder, vocab, length, counts, seed):
    import random

    rng = random.Random(seed)
    os.makedirs(folder, exist_ok=True)
    for name, count in counts.items():
        with open(os.path.join(folder, f"{name}.jsonl"), "w") as f:
            for _ in range(count):
                # length - 1 words; mlx-lm appends the end-of-sequence token.
                words = (f"w{rng.randrange(vocab - 3)}" for _ in range(length - 1))
                f.write(json.dumps({"text": " ".join(words)}) + "\n")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("data")
    parser.add_argument("--preset", default="tinyllama", choices=sorted(PRESETS))
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--examples", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    settings = PRESETS[args.preset]
    write_model(args.model, settings, args.seed)
    write_data(args.data, settings["vocab_size"], args.length,
               {"train": args.examples, "valid": 16, "test": 16}, args.seed)


if __name__ == "__main__":
    main()
