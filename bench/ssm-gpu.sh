#!/bin/bash
# Recurrent layers' training tokens/s (issue 24): lmx's models/mamba2.lmx (the chunked `ssd`
# scan, in the compiled step) against mlx-lm's own Mamba-2, and models/qwen3_next.lmx with dense
# MLPs (Gated DeltaNet layers, the chunked `gated_delta`, and gated attention every 4th layer)
# against mlx-lm's own `qwen3_next` at the same settings, in Python MLX
# (bench/ssm_anchor_mlx.py), one GPU, in one call on the GPU machine with MLX's CUDA build staged
# (../shared/gpu/README.md):
#
#     bash bench/ssm-gpu.sh OUT
#
# Each size is trained by lmx (median tokens/s of steps 11 on, from its metrics.jsonl) and by the
# anchor (median of its timed steps), in bfloat16 over random-weight models of the published
# shapes, batch x sequence tokens a step; summary.txt holds the table.
# Environment: LMX (default target/release/lmx), PYTHON (default python3, with mlx and mlx-lm),
# STEPS (default 40), SIZES (default "mamba2-130m:768:24 mamba2-370m:1024:48": preset, d_model,
# layers), BATCH (default 8), SEQ (default 1024), DTYPE (bfloat16 or float32); DELTANET (default
# "deltanet:1024:8": name, d_model, layers; "" for none) at DELTA_SEQ positions (default 512:
# mlx-lm's gated delta rule runs one position after another outside Metal, which its compiled
# step unrolls), VOCAB (default 32000), the rest of its shape fixed below (8 attention heads of
# 128, 2 key/value heads, a quarter of them rotated; 8 DeltaNet key heads and 16 value heads of
# 64; MLP 2816 wide; chunks of 64).
# A tiny check on the CPU: LMX_DEVICE=cpu SIZES=tiny:64:2 DELTANET=deltanet-tiny:64:4 BATCH=2
# SEQ=64 DELTA_SEQ=64 VOCAB=257 STEPS=12 DTYPE=float32.
set -u
out=${1:?output folder}
mkdir -p "$out"
lmx=${LMX:-target/release/lmx}
python=${PYTHON:-python3}
steps=${STEPS:-40}
batch=${BATCH:-8}
seq=${SEQ:-1024}
dtype=${DTYPE:-bfloat16}
device=${LMX_DEVICE:-gpu}
sizes=${SIZES-"mamba2-130m:768:24 mamba2-370m:1024:48"}
deltanet=${DELTANET-"deltanet:1024:8"}
delta_seq=${DELTA_SEQ:-512}
vocab=${VOCAB:-32000}
here=$(dirname "$0")
work=$(mktemp -d)
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null
  "$python" -c "import mlx.core as mx, mlx_lm; print('mlx', mx.__version__, 'mlx-lm', mlx_lm.__version__, mx.default_device())"
} > "$out/machine.txt" 2>&1

run() {  # name, then the command
    local name=$1
    shift
    local started=$(date +%s)
    "$@" > "$out/$name.txt" 2>&1
    echo "exit status $? after $(($(date +%s) - started)) s" >> "$out/$name.txt"
}

for size in $sizes; do
    IFS=: read -r preset d_model layers <<< "$size"
    # The tiny preset's own shape (state 16, heads 16 wide, two groups, chunks of 16), its
    # vocabulary widened to the byte tokenizer's 257 ids in both.
    shape=()
    settings=()
    if [ "$preset" = tiny ]; then
        shape=(--vocab 257 --state 16 --head-dim 16 --groups 2)
        settings=(--set vocab=257)
    fi
    precision=$([ "$dtype" = bfloat16 ] && echo bfloat16 || echo float32)
    run "lmx-$preset" "$lmx" train --device "$device" --model mamba2 --preset "$preset" \
        --tokenizer byte --data data/shakespeare.txt --seq-len "$seq" --batch-size "$batch" \
        --precision "$precision" --steps "$steps" --eval-every 0 --checkpoint-every 0 --quiet \
        --sample 0 "${settings[@]}" --out "$work/$preset"
    cp "$work/$preset/metrics.jsonl" "$out/lmx-$preset.jsonl" 2>/dev/null
    run "anchor-$preset" "$python" "$here/ssm_anchor_mlx.py" --d-model "$d_model" \
        --layers "$layers" "${shape[@]}" --batch "$batch" --seq "$seq" --steps "$((steps - 10))" \
        --warmup 10 --dtype "$dtype"
done

for size in $deltanet; do
    IFS=: read -r name d_model layers <<< "$size"
    shape=(--heads 8 --kv-heads 2 --head-dim 128 --rope-dims 32 --lin-k-heads 8 --lin-v-heads 16
        --lin-k-dim 64 --lin-v-dim 64 --d-ff 2816 --attn-every 4)
    settings=()
    for pair in n_heads=8 n_kv_heads=2 head_dim=128 rope_dims=32 lin_k_heads=8 lin_v_heads=16 \
        lin_k_dim=64 lin_v_dim=64 d_ff=2816 attn_every=4 chunk=64 n_experts=0 tie=false; do
        settings+=(--set "$pair")
    done
    precision=$([ "$dtype" = bfloat16 ] && echo bfloat16 || echo float32)
    run "lmx-$name" "$lmx" train --device "$device" --model qwen3_next --preset dense-tiny \
        "${settings[@]}" --set "vocab=$vocab" --set "d_model=$d_model" --set "n_layers=$layers" \
        --set "ctx=$delta_seq" --tokenizer byte --data data/shakespeare.txt --seq-len "$delta_seq" \
        --batch-size "$batch" --precision "$precision" --steps "$steps" --eval-every 0 \
        --checkpoint-every 0 --quiet --sample 0 --out "$work/$name"
    cp "$work/$name/metrics.jsonl" "$out/lmx-$name.jsonl" 2>/dev/null
    # mlx-lm's step-by-step gated delta rule makes more CUDA graphs a step than MLX keeps by
    # default (400): at the default its first steps stop with "Cache thrashing is happening".
    MLX_CUDA_GRAPH_CACHE_SIZE=${MLX_CUDA_GRAPH_CACHE_SIZE:-4000} \
        run "anchor-$name" "$python" "$here/ssm_anchor_mlx.py" --family qwen3_next --vocab "$vocab" \
            --d-model "$d_model" --layers "$layers" "${shape[@]}" --batch "$batch" \
            --seq "$delta_seq" --steps "$((steps - 10))" --warmup 10 --dtype "$dtype"
done

"$python" - "$out" "$sizes $deltanet" > "$out/summary.txt" 2>&1 <<'PY'
import json, statistics, sys
out, sizes = sys.argv[1], sys.argv[2].split()
print(f"{'preset':<14} {'lmx tok/s':>12} {'mlx-lm tok/s':>13} {'ratio':>7}  lmx peak MiB / anchor peak MiB")
for size in sizes:
    preset = size.split(":")[0]
    try:
        rows = [json.loads(l) for l in open(f"{out}/lmx-{preset}.jsonl")]
        rows = [r for r in rows if r.get("kind") == "step" and r["step"] > 10]
        ours = statistics.median(r["tokens_per_s"] for r in rows)
        our_mem = max(r.get("peak_memory_mib", 0) for r in rows)
    except (OSError, ValueError, KeyError, statistics.StatisticsError):
        ours, our_mem = float("nan"), float("nan")
    try:
        line = [l for l in open(f"{out}/anchor-{preset}.txt") if l.startswith("{")][-1]
        anchor = json.loads(line)
        theirs, their_mem = anchor["tokens_per_s"], anchor["peak_memory_mib"]
    except (OSError, IndexError, ValueError, KeyError):
        theirs, their_mem = float("nan"), float("nan")
    print(f"{preset:<14} {ours:>12,.0f} {theirs:>13,.0f} {ours / theirs:>7.2f}  {our_mem:,.0f} / {their_mem:,.0f}")
PY
cat "$out/summary.txt"
rm -rf "$work"
