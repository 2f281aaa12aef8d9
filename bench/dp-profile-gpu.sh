#!/bin/bash
# GPU timelines of one rank of a two-GPU data-parallel step, lmx and the Python MLX anchor alike,
# through CUPTI (bench/cupti_trace.c, built here against the machine's CUPTI), each summarized by
# bench/trace_summary.py: where rank 0's step goes besides the one-GPU step's kernels. On the
# two-GPU machine, after ../shared/gpu's call 1:
#
#     source .gpu/p2/assemble.sh && LMX=.gpu-ft/lmx bash bench/dp-profile-gpu.sh OUT
#
# The ranks are started by hand with `lmx launch`'s environment (MLX_RANK, MLX_WORLD_SIZE,
# NCCL_HOST_IP, NCCL_PORT, CUDA_VISIBLE_DEVICES, LMX_DISTRIBUTED_BACKEND), so that each has a
# trace of its own. GPT-2 124M (`--preset gpt2`), bfloat16, 16 x 1024 per GPU, 25 steps.
set -u
out=${1:?output folder}
mkdir -p "$out"
lmx=${LMX:-.gpu-ft/lmx}
python=${PYTHON:-python3}
here=$(dirname "$0")
work=$(mktemp -d)
export NCCL_NVLS_ENABLE=0
nccl=$(find -L /tmp/mlxcuda/nvidia /usr/local/lib /usr/lib -name 'libnccl.so*' 2>/dev/null | head -1)
[ -n "$nccl" ] && export LD_LIBRARY_PATH=$(dirname "$nccl"):$LD_LIBRARY_PATH

source "$here/cupti-build.sh"

gpt="--device gpu --preset gpt2 --tokenizer byte --seq-len 1024 --precision bfloat16 --steps 25
     --eval-every 0 --checkpoint-every 0 --quiet --sample 0 --data data/shakespeare.txt"
anchor="$here/dp_anchor_mlx.py --batch 16 --seq 1024 --steps 20 --warmup 5 --dtype bfloat16"
two() {  # name, then the command; both ranks traced
    local name=$1
    shift
    local port=$((20000 + RANDOM % 20000))
    for rank in 0 1; do
        MLX_RANK=$rank MLX_WORLD_SIZE=2 NCCL_HOST_IP=127.0.0.1 NCCL_PORT=$port \
            CUDA_VISIBLE_DEVICES=$rank LMX_DISTRIBUTED_BACKEND=nccl \
            LMX_TRACE_OUT=$work/$name-rank$rank.tsv LD_PRELOAD=$work/trace.so \
            "$@" > "$work/$name-rank$rank.txt" 2>&1 &
    done
    wait
}
# Untimed first: MLX's CUDA backend compiles its kernels on first use.
"$lmx" train $gpt --steps 3 --batch-size 16 --out "$work/warm" > /dev/null 2>&1
LMX_TRACE_OUT=$work/lmx-1.tsv LD_PRELOAD=$work/trace.so "$lmx" train $gpt --batch-size 16 \
    --out "$work/lmx-1" > "$work/lmx-1.txt" 2>&1
two lmx-2 "$lmx" train $gpt --batch-size 32 --out "$work/lmx-2"
LMX_TRACE_OUT=$work/anchor-1.tsv LD_PRELOAD=$work/trace.so "$python" $anchor \
    > "$work/anchor-1.txt" 2>&1
two anchor-2 "$python" $anchor

ms_of() {  # a run's median ms per step: lmx's metrics.jsonl (and its global batch's rows) or
    # the anchor's JSON line
    "$python" - "$@" <<'PY'
import json, statistics, sys
path = sys.argv[1]
try:
    if path.endswith(".jsonl"):
        rows = [json.loads(l) for l in open(path)]
        rows = [r for r in rows if r.get("kind") == "step" and r["step"] > 10]
        tok = statistics.median(r["tokens_per_s"] for r in rows)
        print(round(int(sys.argv[2]) * 1024 / tok * 1e3, 3))
    else:
        print([json.loads(l) for l in open(path) if l.startswith("{")][-1]["median_ms"])
except Exception:
    pass
PY
}
{
    for run in lmx-1 lmx-2 anchor-1 anchor-2; do
        case $run in
        lmx-1) ms=$(ms_of "$work/lmx-1/metrics.jsonl" 16); trace=lmx-1 ;;
        lmx-2) ms=$(ms_of "$work/lmx-2/metrics.jsonl" 32); trace=lmx-2-rank0 ;;
        anchor-1) ms=$(ms_of "$work/anchor-1.txt"); trace=anchor-1 ;;
        anchor-2) ms=$(ms_of "$work/anchor-2-rank0.txt"); trace=anchor-2-rank0 ;;
        esac
        echo "=== $run: median ${ms:-?} ms/step (traced)"
        "$python" "$here/trace_summary.py" "$work/$trace.tsv" ${ms:+--step-ms "$ms"}
        echo
    done
} > "$out/profile.txt" 2>&1
tar -C "$work" --exclude='*/checkpoints' -cJf "$out/traces.tar.xz" .
cat "$out/profile.txt"
