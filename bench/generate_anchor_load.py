"""mlx-lm's load and first token, as `mlx_lm.generate` does them: load the folder, then one
greedy token of a short prompt. Used by bench/finetune-gpu.sh under bench/measure.py.

    python bench/generate_anchor_load.py MODEL
"""

import sys

import mlx.core as mx
from mlx_lm import generate, load

model, tokenizer = load(sys.argv[1])
text = generate(model, tokenizer, prompt="w1 w2 w3 w4", max_tokens=1)
mx.synchronize()
print(repr(text))
