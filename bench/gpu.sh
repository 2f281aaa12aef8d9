#!/bin/bash
# The GPU tables of docs/benchmarks.md, in three parts meant each to fit one 10-minute call on the
# GPU machine from MLX's cold kernel cache, as on a fresh machine (see ../shared/gpu/README.md for
# staging MLX's CUDA build there):
#
#     bash bench/gpu.sh 1 OUT   # bf16 compile table: tiny, small
#     bash bench/gpu.sh 2 OUT   # its medium rows; GPT-2 124M bf16 in both orders; torch.compile
#     bash bench/gpu.sh 3 OUT   # generation, float32 compile table
#
# (The bf16 table of parts 1 and 2 together: `lmx bench report OUT1/train-bf16.jsonl
# OUT2/train-bf16-medium.jsonl --plot bf16.svg`.)
#
# Environment: LMX (the lmx binary, default target/release/lmx), ANCHORS (the folder holding
# anchor_mlx.py and anchor_torch.py, default ../shared/bench), PYTHON (default python3, with MLX),
# OVERLAP (the trainer's run order for every lmx row: off, build or submit; default the trainer's).
# Every result lands in OUT: the tables (*.txt), every run (*.jsonl, written as each run ends:
# `lmx bench report` makes the tables of a part cut short from them), the plots (*.svg).
set -u
part=${1:?part 1, 2 or 3}
out=${2:?output folder}
case ${OVERLAP:-} in
'' | off | build | submit) ;;
*)
    echo "OVERLAP=$OVERLAP: use off, build or submit" >&2
    exit 2
    ;;
esac
mkdir -p "$out"
lmx=${LMX:-target/release/lmx}
anchors=${ANCHORS:-../shared/bench}
python=${PYTHON:-python3}
here=$(dirname "$0")

train() {  # name, then the rest of `lmx bench train`'s arguments
    local name=$1
    shift
    "$lmx" --device gpu bench train --anchor "$anchors/anchor_mlx.py" --python "$python" \
        ${OVERLAP:+--overlap "$OVERLAP"} --json "$out/$name.jsonl" "$@" > "$out/$name.txt" 2>&1
    echo "exit status $?" >> "$out/$name.txt"
}

case $part in
1)
    nvidia-smi --query-gpu=name,driver_version --format=csv > "$out/machine.txt" 2>&1
    "$python" -c "import mlx.core as mx; print('mlx', mx.__version__, mx.default_device())" \
        >> "$out/machine.txt" 2>&1
    # Untimed: MLX's CUDA backend compiles its kernels on first use (cached for the later runs).
    "$lmx" --device gpu bench train --configs tiny,small --dtypes bfloat16 \
        --batch 16 --seq 256 --steps 2 --warmup 1 > "$out/kernels.txt" 2>&1
    train train-bf16 --configs tiny,small --modes compiled,eager --dtypes bfloat16 \
        --batch 16 --seq 256 --steps 50 --warmup 10 --repeats 3
    ;;
2)
    train train-bf16-medium --configs medium --modes compiled,eager --dtypes bfloat16 \
        --batch 16 --seq 256 --steps 50 --warmup 10 --repeats 3
    train gpt2-bf16 --configs gpt2 --modes compiled --dtypes bfloat16 \
        --batch 16 --seq 1024 --steps 30 --warmup 5 --repeats 2
    # The same with one step on the device at a time, unless OVERLAP already sets the order of
    # every row.
    [ -n "${OVERLAP:-}" ] || train gpt2-bf16-build --configs gpt2 --modes compiled \
        --dtypes bfloat16 --batch 16 --seq 1024 --steps 30 --warmup 5 --repeats 2 --overlap build
    "$python" "$anchors/anchor_torch.py" --config gpt2 --batch 16 --seq 1024 --steps 30 \
        --compile 1 --dtype bfloat16 > "$out/torch.txt" 2>&1
    ;;
3)
    "$lmx" --device gpu bench generate --models gpt2,llama --llama-preset tinyllama-1.1b \
        --dtypes bfloat16 --repeats 2 --anchor "$here/generate_anchor.py" --python "$python" \
        --json "$out/generate.jsonl" > "$out/generate.txt" 2>&1
    train train-f32 --configs tiny,small,medium --modes compiled,eager --dtypes float32 \
        --batch 16 --seq 256 --steps 50 --warmup 10 --repeats 2 --plot "$out/train-f32.svg"
    ;;
*)
    echo "unknown part $part: use 1, 2 or 3" >&2
    exit 2
    ;;
esac
