#!/bin/bash
# The data-parallel table of docs/benchmarks.md, on a machine of two GPUs (nvidia-h100-x2) with
# MLX's CUDA build staged as ../shared/gpu/README.md says, in one call:
#
#     source .gpu/p2/assemble.sh && bash bench/dp-gpu.sh OUT
#
# 1. Equivalence with NCCL: the tiny model in float32, 20 steps, one GPU at batch 8 against two
#    ranks at batch 8 (4 rows each), with and without the sharded optimizer state (and sharded
#    with two micro-batches per update), all with MLX_ENABLE_TF32=0: MLX's CUDA backend
#    multiplies float32 matrices in TF32 unless told not to, and TF32 rounds differently for
#    different row counts; then the same two runs with TF32 on, as users get them by default.
# 2. GPT-2 124M (`--preset gpt2`: vocabulary 50,304, as the anchor's; byte tokens of
#    data/shakespeare.txt) in bfloat16 at 16 x 1024 per GPU: one GPU, two GPUs (gradients summed
#    in the step, on the flat state), two GPUs with the optimizer state sharded (ZeRO-1), two
#    GPUs with the gradients summed between the step's functions (per-parameter state), two GPUs
#    with them summed during the backward pass (`--reduce overlap`);
#    tokens/s of steps 21 on (their tokens over metrics.jsonl's elapsed time from step 20 to the
#    last: the per-step rates swing between pipelined steps, 26 to 49 ms a step around a 35 ms
#    mean, so their median is no estimate of the run's rate) and peak memory of rank 0.
# 3. The Python MLX anchor (bench/dp_anchor_mlx.py: the same GPT-2, all_sum over the gradients
#    inside its compiled step) on one GPU and on two, started with mlx.launch's environment.
# Environment: LMX (default .gpu-dp/lmx), PYTHON (default python3), STEPS (GPT-2 steps, default 150),
# ANCHOR (default bench/dp_anchor_mlx.py).
set -u
out=${1:?output folder}
mkdir -p "$out"
lmx=${LMX:-.gpu-dp/lmx}
python=${PYTHON:-python3}
steps=${STEPS:-150}
work=$(mktemp -d)
export NCCL_NVLS_ENABLE=0
# MLX's NCCL backend opens libnccl at run time: the machine has it among PyTorch's nvidia-* wheels.
nccl=$(find -L /tmp/mlxcuda/nvidia /usr/local/lib /usr/lib -name 'libnccl.so*' 2>/dev/null | head -1)
[ -n "$nccl" ] && export LD_LIBRARY_PATH=$(dirname "$nccl"):$LD_LIBRARY_PATH
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; echo "nccl: $nccl"; } \
    > "$out/machine.txt" 2>&1

run() {  # name, then the command
    local name=$1
    shift
    local started=$(date +%s)
    "$@" > "$out/$name.txt" 2>&1
    echo "exit status $? after $(($(date +%s) - started)) s" >> "$out/$name.txt"
}
data=data/shakespeare.txt
tiny="--device gpu --preset tiny-bytes --seq-len 64 --steps 20 --eval-every 0 --checkpoint-every 0
      --quiet --sample 0 --data $data --batch-size 8"
MLX_ENABLE_TF32=0 run tiny-1 "$lmx" train $tiny --out "$work/tiny-1"
MLX_ENABLE_TF32=0 run tiny-2 "$lmx" launch -n 2 --backend nccl -- train $tiny --out "$work/tiny-2"
MLX_ENABLE_TF32=0 run tiny-2z "$lmx" launch -n 2 --backend nccl --shard-optimizer -- \
    train $tiny --out "$work/tiny-2z"
MLX_ENABLE_TF32=0 run tiny-2za "$lmx" launch -n 2 --backend nccl --shard-optimizer -- \
    train $tiny --accumulate 2 --out "$work/tiny-2za"
MLX_ENABLE_TF32=0 run tiny-2o "$lmx" launch -n 2 --backend nccl --reduce overlap --bucket-mb 0.05 \
    -- train $tiny --out "$work/tiny-2o"
run tiny-tf32-1 "$lmx" train $tiny --out "$work/tiny-tf32-1"
run tiny-tf32-2 "$lmx" launch -n 2 --backend nccl -- train $tiny --out "$work/tiny-tf32-2"
for run in tiny-1 tiny-2 tiny-2z tiny-2za tiny-2o tiny-tf32-1 tiny-tf32-2; do
    cp "$work/$run/metrics.jsonl" "$out/$run.jsonl" 2>/dev/null
done

gpt="--device gpu --preset gpt2 --tokenizer byte --seq-len 1024 --precision bfloat16 --steps $steps
     --eval-every 0 --checkpoint-every 0 --quiet --sample 0 --data $data"
run gpt2-1 "$lmx" train $gpt --batch-size 16 --out "$work/gpt2-1"
run gpt2-2 "$lmx" launch -n 2 --backend nccl -- train $gpt --batch-size 32 --out "$work/gpt2-2"
run gpt2-2z "$lmx" launch -n 2 --backend nccl --shard-optimizer -- train $gpt --batch-size 32 \
    --out "$work/gpt2-2z"
run gpt2-2a "$lmx" launch -n 2 --backend nccl --reduce after-step -- train $gpt --batch-size 32 \
    --out "$work/gpt2-2a"
run gpt2-2o "$lmx" launch -n 2 --backend nccl --reduce overlap -- train $gpt --batch-size 32 \
    --out "$work/gpt2-2o"
for run in gpt2-1 gpt2-2 gpt2-2z gpt2-2a gpt2-2o; do cp "$work/$run/metrics.jsonl" "$out/$run.jsonl" 2>/dev/null; done

anchor="${ANCHOR:-bench/dp_anchor_mlx.py} --batch 16 --seq 1024 --steps 30 --warmup 5 --dtype bfloat16"
run anchor-1 "$python" $anchor
port=$((20000 + RANDOM % 20000))
for rank in 0 1; do
    MLX_RANK=$rank MLX_WORLD_SIZE=2 NCCL_HOST_IP=127.0.0.1 NCCL_PORT=$port CUDA_VISIBLE_DEVICES=$rank \
        "$python" $anchor > "$out/anchor-2-rank$rank.txt" 2>&1 &
done
wait

"$python" - "$out" > "$out/summary.txt" 2>&1 <<'PY'
import json, sys
out = sys.argv[1]
def steps(name):
    try:
        return [json.loads(l) for l in open(f"{out}/{name}.jsonl") if '"step"' in l]
    except OSError:
        return []
def losses(name):
    return [s["loss"] for s in steps(name) if s.get("kind") == "step"]
for base, names in (("tiny-1", ("tiny-2", "tiny-2z", "tiny-2za", "tiny-2o")), ("tiny-tf32-1", ("tiny-tf32-2",))):
    one = losses(base)
    for name in names:
        other = losses(name)
        diff = max((abs(a - b) for a, b in zip(one, other)), default=float("nan"))
        print(f"{name}: {len(other)} steps, max |loss - {base}'s| = {diff:.3g}")
for name in ("gpt2-1", "gpt2-2", "gpt2-2z", "gpt2-2a", "gpt2-2o"):
    rows = [s for s in steps(name) if s.get("kind") == "step"]
    if len(rows) > 20:
        tokens = (16 if name == "gpt2-1" else 32) * 1024 * (len(rows) - 20)
        tok = tokens / (rows[-1]["elapsed_s"] - rows[19]["elapsed_s"])
        mem = max(s["peak_memory_mib"] for s in rows)
        print(f"{name}: {tok:,.0f} tokens/s, peak {mem:,.0f} MiB (rank 0), last loss {rows[-1]['loss']:.4f}")
    else:
        print(f"{name}: fewer than 21 steps")
for name in ("anchor-1", "anchor-2-rank0"):
    try:
        print(name, open(f"{out}/{name}.txt").read().strip().splitlines()[-2:])
    except OSError:
        pass
PY
cat "$out/summary.txt"
rm -rf "$work"
