#!/bin/bash
# The generation table of docs/benchmarks.md: `lmx bench generate` beside mlx-lm's own
# `stream_generate` (batch 1) and `batch_generate` (batch 32), through bench/generate_mlx_lm.py, in
# one run on the same machine: GPT-2 124M and TinyLlama-1.1B shapes (random weights), bfloat16,
# 128-token prompts, 256 new tokens, greedy (through the compiled decode step); then TinyLlama
# 4-bit, then batch 32, then TinyLlama decoded speculatively, drafted by its own first 2 layers
# (4 tokens at a time; the acceptance rate is printed under its row; the anchor decodes plainly).
#
#     bash bench/generate-gpu.sh OUT
#
# Environment: LMX (the lmx binary, default target/release/lmx), PYTHON (with MLX and mlx-lm,
# default python3), DEVICE (lmx's --device, default gpu), REPEATS (timed runs of each, default 1).
# On the GPU machine, staged by bench/gpu-stage-finetune.sh (the release lmx and mlx-lm's wheels
# in .gpu-ft; see its header and ../shared/gpu/README.md), with carry [".gpu/p2", ".gpu-ft"]:
#
#     source .gpu/p2/assemble.sh && source .gpu-ft/unpack.sh && \
#         LMX=.gpu-ft/lmx bash bench/generate-gpu.sh $OUT/gen
set -u
out=${1:?output folder}
mkdir -p "$out"
lmx=${LMX:-target/release/lmx}
python=${PYTHON:-python3}
device=${DEVICE:-gpu}
repeats=${REPEATS:-1}
here=$(dirname "$0")

bench() {  # name, then lmx bench generate's flags for the rows
    local name=$1
    shift
    "$lmx" --device "$device" bench generate --dtypes bfloat16 --prompt 128 --tokens 256 \
        --repeats "$repeats" --llama-preset tinyllama-1.1b --anchor "$here/generate_mlx_lm.py" \
        --python "$python" --json "$out/$name.jsonl" "$@" > "$out/$name.txt" 2>&1
    echo "exit status $?" >> "$out/$name.txt"
}
bench bf16 --models gpt2,llama
bench q4 --models llama --bits 4
bench batch32 --models gpt2,llama --batch 32
bench speculative --models llama --draft-layers 2 --draft-tokens 4
for name in bf16 q4 batch32 speculative; do
    echo "== $name"
    grep -v '^{' "$out/$name.txt"
done
