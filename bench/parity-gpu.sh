#!/bin/bash
# Training parity and initialisation on the GPU machine (docs/benchmarks.md, "Training parity"),
# one call from a cold kernel cache, after ../shared/gpu's first call:
#
#     source .gpu/p2/assemble.sh && LMX=<lmx> bash bench/parity-gpu.sh OUT
#
# 1. MLX's initialisation (the anchor's, lmx's default) against GPT-2's, in the anchor
#    (bench/init_compare.py): small on the bundled text, 500 steps; GPT-2 124M on one random
#    batch, 35 steps, bfloat16.
# 2. GPT-2 124M, 16 x 1024, 35 steps from lmx's initial parameters on lmx's batch, lmx beside
#    the Python MLX anchor (bench/anchor_same_init.py): bfloat16, then float32 (true float32:
#    MLX_ENABLE_TF32=0 on both sides) twice, so that each side's two runs show how far the
#    same program parts from itself.
# Environment: LMX (default target/release/lmx), PYTHON (default python3, with MLX), DATA (the
# text of the init comparison, default data/shakespeare.txt).
set -u
out=${1:?output folder}
mkdir -p "$out"
lmx=${LMX:-target/release/lmx}
python=${PYTHON:-python3}
here=$(dirname "$0")

same_init() {  # name, device, then the rest of `lmx bench train`'s arguments
    local name=$1 device=$2
    shift 2
    "$lmx" --device "$device" bench train --same-init --anchor "$here/anchor_same_init.py" \
        --python "$python" --modes compiled --warmup 0 --json "$out/$name.jsonl" "$@" \
        > "$out/$name.txt" 2>&1
    echo "exit status $?" >> "$out/$name.txt"
}

nvidia-smi --query-gpu=name,driver_version --format=csv > "$out/machine.txt" 2>&1
data=${DATA:-$here/../data/shakespeare.txt}
"$python" "$here/init_compare.py" --device gpu --config small --data "$data" \
    --batch 16 --seq 256 --steps 500 > "$out/init-small.jsonl" 2> "$out/init-small.txt"
"$python" "$here/init_compare.py" --device gpu --config gpt2 --data random --batch 16 --seq 1024 \
    --steps 35 --dtype bfloat16 > "$out/init-gpt2.jsonl" 2> "$out/init-gpt2.txt"
same_init gpt2-bf16 gpu --configs gpt2 --dtypes bfloat16 --batch 16 --seq 1024 --steps 35
MLX_ENABLE_TF32=0 same_init gpt2-f32 gpu --configs gpt2 --dtypes float32 --batch 16 --seq 1024 \
    --steps 35 --repeats 2
