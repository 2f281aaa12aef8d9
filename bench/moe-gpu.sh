#!/bin/bash
# Sparse Mixtral (8 experts, top 2) training steps, in one run on one machine: lmx's sparse
# experts (`switch_glu`, MLX's gather_mm), lmx's dense reference (`--set experts=dense`: every
# expert on every token, the unchosen ones weighted 0) and mlx-lm's own Mixtral (its SwitchGLU)
# through bench/moe_anchor_mlx.py, at the same size, precision, batch and optimizer:
#
#     bash bench/moe-gpu.sh OUT
#
# Targets (issue 24): the sparse step at most 40% of the dense step's time, and ahead of mlx-lm.
# Environment: LMX (default target/release/lmx), PYTHON (with MLX and mlx-lm, default python3),
# DEVICE (lmx's --device, default gpu), STEPS (timed steps, default 20; lmx's first 5 are left
# out of its median, the anchor runs 5 more first), and the size: VOCAB 32000, D_MODEL 1024,
# LAYERS 8, HEADS 16, KV_HEADS 4, D_FF 3584, EXPERTS 8, TOP_K 2, BATCH 8, SEQ 1024, DTYPE
# bfloat16 (about 0.8B parameters, of which a token uses about 0.3B). OUT gets each run's output,
# lmx's metrics.jsonl, and summary.txt.
# TRACE=1 also records each run's GPU timeline with CUPTI (bench/cupti_trace.c) and writes
# profile.txt, each run's kernels summarized by bench/trace_summary.py (traced steps run slower).
set -u
out=${1:?output folder}
mkdir -p "$out"
lmx=${LMX:-target/release/lmx}
python=${PYTHON:-python3}
device=${DEVICE:-gpu}
steps=${STEPS:-20}
vocab=${VOCAB:-32000} d_model=${D_MODEL:-1024} layers=${LAYERS:-8} heads=${HEADS:-16}
kv_heads=${KV_HEADS:-4} d_ff=${D_FF:-3584} experts=${EXPERTS:-8} top_k=${TOP_K:-2}
batch=${BATCH:-8} seq=${SEQ:-1024} dtype=${DTYPE:-bfloat16}
here=$(dirname "$0")
work=$(mktemp -d)

{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null \
    || echo "no nvidia-smi"; "$lmx" --version; } > "$out/machine.txt" 2>&1

[ "${TRACE:-0}" = 1 ] && source "$here/cupti-build.sh"
run() {  # name, then the command
    local name=$1
    shift
    local started=$(date +%s)
    if [ "${TRACE:-0}" = 1 ]; then
        LMX_TRACE_OUT=$work/$name.tsv LD_PRELOAD=$work/trace.so "$@" > "$out/$name.txt" 2>&1
    else
        "$@" > "$out/$name.txt" 2>&1
    fi
    echo "exit status $? after $(($(date +%s) - started)) s" >> "$out/$name.txt"
}
lmx_train() {  # name, then extra settings
    local name=$1
    shift
    run "$name" "$lmx" --device "$device" train --model mixtral --preset tiny \
        --set vocab="$vocab" --set ctx="$seq" --set d_model="$d_model" --set n_layers="$layers" \
        --set n_heads="$heads" --set n_kv_heads="$kv_heads" --set d_ff="$d_ff" \
        --set n_experts="$experts" --set experts_per_token="$top_k" "$@" \
        --tokenizer byte --data data/shakespeare.txt --seq-len "$seq" --batch-size "$batch" \
        --precision "$dtype" --steps $((steps + 5)) --warmup 0 --eval-every 0 \
        --checkpoint-every 0 --sample 0 --quiet --out "$work/$name"
    cp "$work/$name/metrics.jsonl" "$out/$name.jsonl" 2>/dev/null
}

lmx_train lmx-sparse
lmx_train lmx-dense --set experts=dense
run mlx-lm "$python" "$here/moe_anchor_mlx.py" --vocab "$vocab" --d-model "$d_model" \
    --layers "$layers" --heads "$heads" --kv-heads "$kv_heads" --d-ff "$d_ff" \
    --experts "$experts" --top-k "$top_k" --batch "$batch" --seq "$seq" --steps "$steps" \
    --warmup 5 --dtype "$dtype"

"$python" - "$out" "$batch" "$seq" > "$out/summary.txt" 2>&1 <<'PY'
import json, statistics, sys
out, batch, seq = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def lmx(name):
    try:
        rows = [json.loads(l) for l in open(f"{out}/{name}.jsonl") if '"kind":"step"' in l]
    except OSError:
        return None
    # Each step's time from its tokens/s (start to the next step's start); the first 5 warm up.
    ms = [batch * seq / r["tokens_per_s"] * 1e3 for r in rows[5:] if r.get("tokens_per_s")]
    if not ms:
        return None
    return {"median_ms": statistics.median(ms), "steps": len(ms),
            "peak_memory_mib": max(r.get("peak_memory_mib") or 0 for r in rows),
            "last_loss": rows[-1]["loss"]}
def anchor():
    try:
        lines = [l for l in open(f"{out}/mlx-lm.txt") if l.startswith("{")]
        return json.loads(lines[-1])
    except (OSError, IndexError, ValueError):
        return None
rows = {"lmx sparse": lmx("lmx-sparse"), "lmx dense": lmx("lmx-dense"), "mlx-lm sparse": anchor()}
for name, r in rows.items():
    if r is None:
        print(f"{name:14} no result (see {out})")
    else:
        print(f"{name:14} {r['median_ms']:9.2f} ms/step  {batch * seq / r['median_ms'] * 1e3:10.0f} tokens/s"
              f"  peak {r['peak_memory_mib']:.0f} MiB  last loss {r['last_loss']:.3f}")
sparse, dense, anchor_row = rows["lmx sparse"], rows["lmx dense"], rows["mlx-lm sparse"]
if sparse and dense:
    ratio = sparse["median_ms"] / dense["median_ms"]
    print(f"sparse / dense step time: {ratio:.1%} (target at most 40%): {'met' if ratio <= 0.4 else 'NOT met'}")
if sparse and anchor_row:
    ratio = sparse["median_ms"] / anchor_row["median_ms"]
    print(f"lmx sparse / mlx-lm step time: {ratio:.2f} (target below 1): {'met' if ratio < 1 else 'NOT met'}")
PY
if [ "${TRACE:-0}" = 1 ]; then
    for name in lmx-sparse lmx-dense mlx-lm; do
        echo "=== $name"
        "$python" "$here/trace_summary.py" "$work/$name.tsv" --last 0.5 --top 25
        echo
    done > "$out/profile.txt" 2>&1
fi
cat "$out/summary.txt"
rm -rf "$work"
