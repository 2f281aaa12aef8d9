"""Quantization fixtures, computed by Python MLX and mlx-lm's own code (tests/quantized_*.rs and
lmx-runtime/tests/quantize_mlx.rs read them).

    python3 tests/reference/quantized.py                 # writes the fixtures
    python3 tests/reference/quantized.py --check DIR     # loads lmx's quantized output in mlx-lm

Needs MLX 0.32.2 (the version the Rust side builds) and mlx-lm, no torch:
    python3 -m venv /work/venv-quant
    /work/venv-quant/bin/pip install "mlx[cpu]==0.32.2" mlx-lm numpy

Writes:
- lmx-runtime/tests/fixtures/quantize_mlx.safetensors: float32 weights `w` [4, 384] and `w_bf16`
  (the same, bfloat16), and for every supported bits and group size `{bits}_{group}.weight`,
  `.scales`, `.biases`: `mx.quantize` of `w` (and `bf16_{bits}_{group}.*` of `w_bf16`).
- tests/fixtures/llama_q_mlx_lm/: a tiny LLaMA (lmx's `tiny` preset's settings) built with
  mlx-lm's own `llama.Model`, float16, quantized by mlx-lm's `quantize_model` (4 bits, groups of
  32; `lm_head` 8 bits in groups of 64 by a per-layer entry; `model.layers.1.self_attn.v_proj`
  left in float16 by the predicate, so only its missing scales say so; the `down_proj`s, rows of
  172, skipped by mlx-lm's divisibility rule) and saved by `save_model`/`save_config`.
- tests/fixtures/llama_q_mlx_lm_io.safetensors: int32 `tokens` [2, 8], the float32 `logits` of
  that model (float16 parameters widened to float32, as the Rust test does), and `greedy`: the
  8 tokens mlx-lm's `generate_step` picks greedily (in float32) after the first row of tokens.

- tests/fixtures/mixtral_q_mlx_lm/: the tiny Mixtral of tests/fixtures/hf/mixtral (transformers'
  per-expert `experts.E.w1` layout) converted by `mlx_lm.convert -q` (4 bits in groups of 32):
  mlx-lm stacks the experts into `switch_mlp` (`QuantizedSwitchLinear`: packed `weight`,
  `scales`, `biases` `[experts, ...]`); `model.layers.1.block_sparse_moe.switch_mlp.down_proj` is
  8 bits in groups of 64 by a per-layer entry. tests/fixtures/mixtral_q_mlx_lm_io.safetensors: as
  the LLaMA's, with tokens [2, 20].

- tests/fixtures/gpt2_q_mlx_lm/: the tiny GPT-2 of tests/fixtures/hf/gpt2 (transformers'
  `Conv1D` weights, `[in, out]`) loaded by mlx-lm's `load_model` (whose `sanitize` transposes
  them and names the network `model.`), quantized by `quantize_model` (4 bits in groups of 32:
  every linear layer and both embeddings) and saved by `save_model`/`save_config`, as
  `mlx_lm.convert -q` does: `model.`-prefixed names, the weights `[out, in]`.
  tests/fixtures/gpt2_q_mlx_lm_io.safetensors: as the LLaMA's, with tokens [2, 8].

`--check DIR` loads DIR (a model folder lmx wrote: config.json, model.safetensors and
`io.safetensors` with `tokens` and lmx's `logits`) with mlx-lm's `load_model` and compares the
logits.
"""

import json
import sys
import tempfile
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten
from mlx_lm import convert
from mlx_lm.generate import generate_step
from mlx_lm.models import llama
from mlx_lm.models.switch_layers import QuantizedSwitchLinear
from mlx_lm.utils import load_model, quantize_model, save_config, save_model

ROOT = Path(__file__).resolve().parents[2]
BITS = [2, 3, 4, 5, 6, 8]
GROUPS = [32, 64, 128]
CONFIG = {
    "model_type": "llama",
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "intermediate_size": 172,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-5,
    "vocab_size": 256,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "max_position_embeddings": 256,
}


def quantize_fixture():
    rng = np.random.default_rng(0)
    w = mx.array(rng.normal(0.0, 0.5, (4, 384)).astype(np.float32))
    w_bf16 = w.astype(mx.bfloat16)
    out = {"w": w, "w_bf16": w_bf16}
    for bits in BITS:
        for group in GROUPS:
            for prefix, weight in (("", w), ("bf16_", w_bf16)):
                q, s, b = mx.quantize(weight, group_size=group, bits=bits)
                key = f"{prefix}{bits}_{group}"
                out[f"{key}.weight"], out[f"{key}.scales"], out[f"{key}.biases"] = q, s, b
    path = ROOT / "lmx-runtime/tests/fixtures/quantize_mlx.safetensors"
    path.parent.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(path), out)
    print("wrote", path)


def predicate(path, module):
    if path == "lm_head":
        return {"group_size": 64, "bits": 8, "mode": "affine"}
    return path != "model.layers.1.self_attn.v_proj"


def logits_of(model, tokens):
    """The model's logits in float32 on its float16 parameters widened (the uint32 packed
    weights stay as they are)."""
    model.set_dtype(mx.float32)
    return model(tokens).astype(mx.float32)


def llama_fixture():
    mx.random.seed(0)
    model = llama.Model(llama.ModelArgs.from_dict(CONFIG))
    model.set_dtype(mx.float16)
    model, config = quantize_model(model, dict(CONFIG), 32, 4, quant_predicate=predicate)
    folder = ROOT / "tests/fixtures/llama_q_mlx_lm"
    save_model(folder, model)
    save_config(config, folder / "config.json")
    # Reloaded as any user would, so the logits are those of the files.
    model, _ = load_model(folder)
    tokens = mx.array(np.random.default_rng(1).integers(0, 256, (2, 8)).astype(np.int32))
    logits = logits_of(model, tokens)
    greedy = []
    for token, _ in generate_step(tokens[0], model, max_tokens=8, sampler=lambda l: mx.argmax(l, -1)):
        greedy.append(int(token))
    io = {"tokens": tokens, "logits": logits, "greedy": mx.array(greedy, dtype=mx.int32)}
    mx.save_safetensors(str(ROOT / "tests/fixtures/llama_q_mlx_lm_io.safetensors"), io)
    print("wrote", folder, "greedy", greedy)


def io_fixture(model, name, length):
    """Fixed tokens [2, length], the model's float32 logits and the greedy continuation of the
    first row, as `{name}_io`."""
    tokens = mx.array(np.random.default_rng(1).integers(0, 256, (2, length)).astype(np.int32))
    logits = logits_of(model, tokens)
    greedy = []
    for token, _ in generate_step(tokens[0], model, max_tokens=8, sampler=lambda l: mx.argmax(l, -1)):
        greedy.append(int(token))
    io = {"tokens": tokens, "logits": logits, "greedy": mx.array(greedy, dtype=mx.int32)}
    mx.save_safetensors(str(ROOT / f"tests/fixtures/{name}_io.safetensors"), io)
    return greedy


def _gather_qmm_affine(self, x, indices, sorted_indices=False):
    """mlx-lm's `QuantizedSwitchLinear.__call__` without the `global_scale` argument: mlx-lm
    0.32.2 passes it (None for affine quantization) to `mx.gather_qmm`, which MLX 0.32.2 does
    not take yet, so its quantized experts cannot run on the MLX the Rust side builds."""
    x = mx.gather_qmm(
        x,
        self["weight"],
        self["scales"],
        self.get("biases"),
        rhs_indices=indices,
        transpose=True,
        group_size=self.group_size,
        bits=self.bits,
        mode=self.mode,
        sorted_indices=sorted_indices,
    )
    if "bias" in self:
        x = x + mx.expand_dims(self["bias"][indices], -2)
    return x


QuantizedSwitchLinear.__call__ = _gather_qmm_affine


def mixtral_predicate(path, module):
    if path == "model.layers.1.block_sparse_moe.switch_mlp.down_proj":
        return {"group_size": 64, "bits": 8, "mode": "affine"}
    return True


def mixtral_fixture():
    folder = ROOT / "tests/fixtures/mixtral_q_mlx_lm"
    if folder.exists():
        for f in folder.iterdir():
            f.unlink()
        folder.rmdir()
    convert(
        str(ROOT / "tests/fixtures/hf/mixtral"),
        mlx_path=str(folder),
        quantize=True,
        q_group_size=32,
        q_bits=4,
        quant_predicate=mixtral_predicate,
    )
    (folder / "README.md").unlink(missing_ok=True)
    model, _ = load_model(folder)
    stacked = [p for p, m in model.named_modules() if isinstance(m, QuantizedSwitchLinear)]
    assert len(stacked) == 6, stacked
    # 2 x 20 tokens with 2 experts each: 80 rows, which mlx-lm sorts by expert (from 64 on);
    # generation's single tokens take the unsorted product.
    greedy = io_fixture(model, "mixtral_q_mlx_lm", 20)
    print("wrote", folder, "greedy", greedy)


def gpt2_fixture():
    folder = ROOT / "tests/fixtures/gpt2_q_mlx_lm"
    # mlx-lm reads GPT-2 as the published `gpt2` weights are stored (saved from `GPT2Model`,
    # without transformers' `transformer.` prefix or the tied head) and requires `n_ctx`, which
    # transformers no longer writes (it is n_positions).
    source = ROOT / "tests/fixtures/hf/gpt2"
    weights = mx.load(str(source / "model.safetensors"))
    weights = {
        name.removeprefix("transformer."): w for name, w in weights.items() if name != "lm_head.weight"
    }
    with tempfile.TemporaryDirectory() as published:
        mx.save_safetensors(str(Path(published) / "model.safetensors"), weights)
        config = json.loads((source / "config.json").read_text())
        (Path(published) / "config.json").write_text(json.dumps(config | {"n_ctx": 64}))
        model, config = load_model(Path(published))
    model, config = quantize_model(model, config, 32, 4)
    save_model(folder, model)
    save_config(config, folder / "config.json")
    model, _ = load_model(folder)
    greedy = io_fixture(model, "gpt2_q_mlx_lm", 8)
    print("wrote", folder, "greedy", greedy)


def check(folder):
    folder = Path(folder)
    model, config = load_model(folder)
    kinds = (nn.QuantizedLinear, nn.QuantizedEmbedding, QuantizedSwitchLinear)
    quantized = [p for p, m in model.named_modules() if isinstance(m, kinds)]
    io = mx.load(str(folder / "io.safetensors"))
    ours = logits_of(model, io["tokens"])
    err = (mx.abs(ours - io["logits"]).max() / mx.abs(io["logits"]).max()).item()
    print(f"{folder}: {len(quantized)} quantized layers; max |mlx-lm - lmx| / max |lmx| = {err:.3g}")
    print("quantization:", json.dumps(config.get("quantization")))
    if err > 1e-4:
        sys.exit(f"logits differ: {err}")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--check":
        check(sys.argv[2])
    else:
        quantize_fixture()
        llama_fixture()
        mixtral_fixture()
        gpt2_fixture()
