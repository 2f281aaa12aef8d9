#!/bin/bash
# The fine-tuning table of docs/benchmarks.md: LoRA and QLoRA (4-bit) on TinyLlama-1.1B's
# configuration (random bfloat16 weights), and loading to the first token, each beside mlx-lm's
# own code in one run on the same machine:
#
#     bash bench/finetune-gpu.sh OUT
#
# Environment: LMX (the lmx binary, default target/release/lmx), PYTHON (with MLX and mlx-lm,
# default python3), STEPS (default 100), LAYERS (blocks adapted, default 16), DEVICE (lmx's
# --device, default gpu), PRESET (make_finetune_inputs.py's, default tinyllama), ROWS (which
# rows to run, default "lora qlora load").
# Both trainers: the last 16 blocks' linear layers (mlx-lm's default keys), rank 8, scale 20,
# batch 4, examples of exactly 512 tokens (so neither pads), learning rate 1e-5.
set -u
out=${1:?output folder}
mkdir -p "$out"
lmx=${LMX:-target/release/lmx}
python=${PYTHON:-python3}
steps=${STEPS:-100}
layers=${LAYERS:-16}
device=${DEVICE:-gpu}
here=$(dirname "$0")
work=$(mktemp -d)

"$python" "$here/make_finetune_inputs.py" "$work/model" "$work/data" --length 512 \
    ${PRESET:+--preset "$PRESET"} > "$out/inputs.txt" 2>&1 || { cat "$out/inputs.txt"; exit 1; }
"$python" -c "from mlx_lm.convert import convert; convert('$work/model', '$work/model-4bit', \
quantize=True, q_bits=4, q_group_size=64)" >> "$out/inputs.txt" 2>&1

anchor() {  # name, model folder
    "$python" "$here/finetune_anchor.py" "$2" "$work/data" --iters "$steps" --batch 4 \
        --rank 8 --layers "$layers" --report 10 --json "$out/$1.jsonl" > "$out/$1.txt" 2>&1
    echo "exit status $?" >> "$out/$1.txt"
}
lmx_lora() {  # name, model folder
    "$lmx" --device "$device" lora --init "$2" --data "$work/data" --out "$work/run-$1" \
        --steps "$steps" --batch-size 4 --seq-len 511 --lr 1e-5 --warmup 0 --precision bfloat16 \
        --eval-every 0 --checkpoint-every 0 --rank 8 --scale 20 --num-layers "$layers" --sample 0 --quiet \
        > "$out/$1.txt" 2>&1
    echo "exit status $?" >> "$out/$1.txt"
    cp "$work/run-$1/metrics.jsonl" "$out/$1-metrics.jsonl" 2>/dev/null
}

rows=" ${ROWS:-lora qlora load} "
case $rows in *" lora "*)
    anchor mlx-lm-lora "$work/model"
    lmx_lora lmx-lora "$work/model"
esac
case $rows in *" qlora "*)
    anchor mlx-lm-qlora "$work/model-4bit"
    lmx_lora lmx-qlora "$work/model-4bit"
esac
case $rows in *" load "*) for i in 1 2; do
    "$python" "$here/measure.py" mlx-lm-load -- "$python" "$here/generate_anchor_load.py" \
        "$work/model" >> "$out/load.jsonl"
    "$python" "$here/measure.py" lmx-load -- "$lmx" --device "$device" generate \
        --model "$work/model" --prompt "w1 w2 w3 w4" --max-tokens 1 >> "$out/load.jsonl"
done; esac
rm -rf "$work"
