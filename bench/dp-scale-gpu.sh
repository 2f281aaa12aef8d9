#!/bin/bash
# Data-parallel scaling (issue 26; docs/benchmarks.md "Scaling to four GPUs"): GPT-2 124M and
# Llama 3.2 1B in bfloat16 on 1, 2 and 4 GPUs of one host (NCCL), with and without the optimizer
# state sharded, and the tiny model's losses on 1 and 4 ranks at the same global batch. On the
# GPU machine with MLX's CUDA build staged (../shared/gpu/README.md) and a release lmx in .gpu-ft
# (bench/gpu-stage-finetune.sh; xz it to fit the carry), carry [".gpu/p2", ".gpu-ft"]:
#
#     source .gpu/p2/assemble.sh && bash bench/dp-scale-gpu.sh
#
# Writes $OUT/scale.tgz (each run's output and metrics) and prints the summary.
set -u
[ -x .gpu-ft/lmx ] || xz -dk .gpu-ft/lmx.xz
lmx=${LMX:-.gpu-ft/lmx}
o=/tmp/scale; mkdir -p $o; w=$(mktemp -d)
trap 'tar -C /tmp -czf $OUT/scale.tgz scale' EXIT
export NCCL_NVLS_ENABLE=0
nccl=$(find -L /tmp/mlxcuda/nvidia /usr/local/lib /usr/lib -name 'libnccl.so*' 2>/dev/null | head -1)
[ -n "$nccl" ] && export LD_LIBRARY_PATH=$(dirname "$nccl"):$LD_LIBRARY_PATH
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > $o/machine.txt
run() { local name=$1; shift; local t=$(date +%s); timeout 150 "$@" > $o/$name.txt 2>&1; echo "exit $? after $(($(date +%s)-t)) s" >> $o/$name.txt; cp $w/$name/metrics.jsonl $o/$name.jsonl 2>/dev/null; }
data=data/shakespeare.txt
tiny="--device gpu --preset tiny-bytes --seq-len 64 --steps 20 --eval-every 0 --checkpoint-every 0 --quiet --sample 0 --data $data --batch-size 16"
run tiny-1 $lmx train $tiny --out $w/tiny-1
run tiny-4 $lmx launch -n 4 --backend nccl -- train $tiny --out $w/tiny-4
gpt="--device gpu --preset 124m --tokenizer byte --seq-len 1024 --precision bfloat16 --steps 25 --eval-every 0 --checkpoint-every 0 --quiet --sample 0 --data $data"
run gpt2-1 $lmx train $gpt --batch-size 16 --out $w/gpt2-1
run gpt2-2 $lmx launch -n 2 --backend nccl -- train $gpt --batch-size 32 --out $w/gpt2-2
run gpt2-4 $lmx launch -n 4 --backend nccl -- train $gpt --batch-size 64 --out $w/gpt2-4
run gpt2-4z $lmx launch -n 4 --backend nccl --shard-optimizer -- train $gpt --batch-size 64 --out $w/gpt2-4z
ll="--device gpu --model llama --preset llama-3.2-1b --tokenizer byte --seq-len 1024 --precision bfloat16 --steps 15 --eval-every 0 --checkpoint-every 0 --quiet --sample 0 --data $data"
run llama-1 $lmx train $ll --batch-size 4 --out $w/llama-1
run llama-4 $lmx launch -n 4 --backend nccl -- train $ll --batch-size 16 --out $w/llama-4
run llama-4z $lmx launch -n 4 --backend nccl --shard-optimizer -- train $ll --batch-size 16 --out $w/llama-4z
python3 - $o <<'PY'
import json, statistics, sys
o = sys.argv[1]
def steps(n):
    try: return [json.loads(l) for l in open(f"{o}/{n}.jsonl") if '"kind": "step"' in l or '"kind":"step"' in l]
    except OSError: return []
one = [s["loss"] for s in steps("tiny-1")]
four = [s["loss"] for s in steps("tiny-4")]
print("tiny-4 max |loss - 1 GPU|:", max((abs(a-b) for a,b in zip(one, four)), default=None), len(four))
for n in ["gpt2-1","gpt2-2","gpt2-4","gpt2-4z","llama-1","llama-4","llama-4z"]:
    r = [s for s in steps(n) if s["step"] > 5]
    if r: print(n, f"{statistics.median(s['tokens_per_s'] for s in r):,.0f} tok/s", f"peak {max(s['peak_memory_mib'] for s in r):,.0f} MiB", f"loss {r[-1]['loss']:.4f}")
    else: print(n, "no steps", open(f"{o}/{n}.txt").read()[-300:])
PY
