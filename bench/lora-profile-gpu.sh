#!/bin/bash
# GPU timelines of a LoRA step, lmx's and mlx-lm's, through CUPTI (bench/cupti_trace.c), each
# summarized by bench/trace_summary.py: the kernels' share of the step and the GPU's idle time
# while the host builds the next piece of work. The inputs are bench/finetune-gpu.sh's (a LLaMA of
# TinyLlama-1.1B's configuration, random bfloat16 weights, 512-token examples), as are the
# settings (batch 4, rank 8, scale 20, the last 16 blocks). On the GPU machine, after
# ../shared/gpu's call 1:
#
#     source .gpu/p2/assemble.sh && source .gpu-ft/unpack.sh && \
#         LMX=.gpu-ft/lmx bash bench/lora-profile-gpu.sh OUT
#
# QUANTIZE=1 profiles QLoRA (the model quantized to 4 bits by mlx-lm's `convert`) instead.
set -u
out=${1:?output folder}
mkdir -p "$out"
lmx=${LMX:-target/release/lmx}
python=${PYTHON:-python3}
steps=${STEPS:-40}
here=$(dirname "$0")
work=$(mktemp -d)
source "$here/cupti-build.sh"

"$python" "$here/make_finetune_inputs.py" "$work/model" "$work/data" --length 512 \
    > "$out/inputs.txt" 2>&1 || { cat "$out/inputs.txt"; exit 1; }
model=$work/model
if [ "${QUANTIZE:-0}" = 1 ]; then
    "$python" -c "from mlx_lm.convert import convert; convert('$work/model', '$work/model-4bit', \
quantize=True, q_bits=4, q_group_size=64)" >> "$out/inputs.txt" 2>&1
    model=$work/model-4bit
fi

LMX_TRACE_OUT=$work/lmx.tsv LD_PRELOAD=$work/trace.so "$lmx" --device gpu lora --init "$model" \
    --data "$work/data" --out "$work/run" --steps "$steps" --batch-size 4 --seq-len 511 \
    --lr 1e-5 --warmup 0 --precision bfloat16 --eval-every 0 --checkpoint-every 0 --rank 8 \
    --scale 20 --num-layers 16 --sample 0 --quiet > "$out/lmx.txt" 2>&1
LMX_TRACE_OUT=$work/anchor.tsv LD_PRELOAD=$work/trace.so "$python" "$here/finetune_anchor.py" \
    "$model" "$work/data" --iters "$steps" --batch 4 --rank 8 --layers 16 --report 10 \
    > "$out/anchor.txt" 2>&1

ms_of() {  # a run's median ms per step of 4 x 511 tokens: lmx's metrics.jsonl or mlx-lm's line
    "$python" - "$@" <<'PY'
import json, statistics, sys
path = sys.argv[1]
try:
    if path.endswith(".jsonl"):
        rows = [json.loads(l) for l in open(path)]
        tok = statistics.median(r["tokens_per_s"] for r in rows
                                if r.get("kind") == "step" and r["step"] > 10)
    else:
        tok = [json.loads(l) for l in open(path) if l.startswith("{")][-1]["median_tokens_per_s"]
    print(round(4 * 511 / tok * 1e3, 3))
except Exception:
    pass
PY
}
{
    ms=$(ms_of "$work/run/metrics.jsonl")
    echo "=== lmx: median ${ms:-?} ms/step (traced)"
    "$python" "$here/trace_summary.py" "$work/lmx.tsv" --last 0.6 ${ms:+--step-ms "$ms"} --top 25
    echo
    ms=$(ms_of "$out/anchor.txt")
    echo "=== mlx-lm: median ${ms:-?} ms/step (traced)"
    "$python" "$here/trace_summary.py" "$work/anchor.tsv" --last 0.6 ${ms:+--step-ms "$ms"} --top 25
} > "$out/profile.txt" 2>&1
tar -C "$work" --exclude='model*' --exclude='data' -cJf "$out/traces.tar.xz" .
cat "$out/profile.txt"
