#!/bin/bash
# The training objectives' performance row (issue 23): a DPO step and a GRPO update of lmx
# (`lmx train --step dpo`, `--step grpo`) beside the same losses in Python MLX written lmxlab's
# way (bench/objectives_anchor_mlx.py: mlx-lm's llama, a frozen reference copy, mx.compile'd
# value_and_grad and AdamW), in one run on one machine, at the same size, precision, batch and
# sequence length, on random weights:
#
#     bash bench/objectives-gpu.sh OUT            # TinyLlama-1.1B's shape, bfloat16, on the GPU
#     SIZE=tiny DEVICE=cpu bash bench/objectives-gpu.sh OUT   # a CPU check of the commands
#
# Target: lmx's DPO step and GRPO update at least 1.3x the anchor's (its ms over lmx's).
# DPO: BATCH pairs a step, each a chosen and a rejected row of SEQ ids (the first PROMPT ids a
# prompt, masked), so that both forward 2 x BATCH x SEQ ids through the policy and the reference.
# GRPO: PROMPTS prompts of PROMPT ids a step, GROUP completions of MAX_TOKENS ids each (lmx
# samples them from the policy; the anchor draws random ids), rows of PROMPT + MAX_TOKENS ids:
# the update (loss, gradients, optimizer) is timed apart from lmx's rollouts (its metrics'
# submit_ms + wait_ms; build_ms is the rollouts' time, reported beside it). lmx's rewards
# (`--reward length`) are 0 here, since a random model of 32000 ids rarely samples a byte:
# that changes the loss's values, not the update's work (the gradient is computed all the same).
# Environment: OBJECTIVES (which rows to run, default "dpo grpo"), LMX (default
# target/release/lmx), PYTHON (with MLX and mlx-lm, default python3), DEVICE (gpu or cpu,
# default gpu), SIZE (1b or tiny, default 1b: the defaults below), STEPS (timed DPO steps and
# anchor steps, default 20; lmx's first 5 DPO steps and the anchor's 5 warm-up steps are left
# out), GRPO_STEPS (lmx's timed GRPO updates, default 6, after 2 left out), DTYPE (bfloat16),
# and the size: VOCAB, D_MODEL, LAYERS, HEADS, KV_HEADS, D_FF (SIZE=1b: TinyLlama-1.1B's 32000,
# 2048, 22, 32, 4, 5632), CTX (lmx's model context, 2048), BATCH, SEQ, PROMPT, PROMPTS, GROUP,
# MAX_TOKENS (SIZE=1b: 4, 512, 32, 4, 8, 96). OUT gets each run's output, lmx's metrics.jsonl
# and summary.txt, one line a row.
# TRACE=1 also records each run's GPU timeline with CUPTI (bench/cupti_trace.c) and writes
# profile.txt, each run's kernels summarized by bench/trace_summary.py (traced steps run slower):
# the last half of each run, but of lmx's GRPO run its last update alone.
set -u
out=${1:?output folder}
mkdir -p "$out"
lmx=${LMX:-target/release/lmx}
python=${PYTHON:-python3}
device=${DEVICE:-gpu}
steps=${STEPS:-20}
grpo_steps=${GRPO_STEPS:-6}
objectives=${OBJECTIVES:-dpo grpo}
dtype=${DTYPE:-bfloat16}
case ${SIZE:-1b} in
1b)
    vocab=${VOCAB:-32000} d_model=${D_MODEL:-2048} layers=${LAYERS:-22} heads=${HEADS:-32}
    kv_heads=${KV_HEADS:-4} d_ff=${D_FF:-5632} batch=${BATCH:-4} seq=${SEQ:-512}
    prompt=${PROMPT:-32} prompts=${PROMPTS:-4} group=${GROUP:-8} max_tokens=${MAX_TOKENS:-96}
    ctx=${CTX:-2048}
    ;;
tiny)
    vocab=${VOCAB:-512} d_model=${D_MODEL:-64} layers=${LAYERS:-2} heads=${HEADS:-4}
    kv_heads=${KV_HEADS:-2} d_ff=${D_FF:-172} batch=${BATCH:-2} seq=${SEQ:-32}
    prompt=${PROMPT:-8} prompts=${PROMPTS:-2} group=${GROUP:-4} max_tokens=${MAX_TOKENS:-16}
    ctx=${CTX:-256}
    ;;
*)
    echo "SIZE is 1b or tiny, not ${SIZE}" >&2
    exit 2
    ;;
esac
here=$(dirname "$0")
work=$(mktemp -d)

{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null \
    || echo "no nvidia-smi"; "$lmx" --version; } > "$out/machine.txt" 2>&1

# The inputs lmx reads, in bytes (`--tokenizer byte`: one byte, one id): pairs whose prompt is
# PROMPT ids and whose responses fill their SEQ ids, and prompts of PROMPT ids.
"$python" - "$work" "$prompt" "$seq" <<'PY'
import json, random, string, sys
work, prompt, seq = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rng = random.Random(0)
text = lambda n: "".join(rng.choice(string.ascii_lowercase) for _ in range(n))
with open(f"{work}/prefs.jsonl", "w") as f:
    for _ in range(64):
        f.write(json.dumps({"prompt": text(prompt), "chosen": text(seq), "rejected": text(seq)}) + "\n")
with open(f"{work}/prompts.jsonl", "w") as f:
    for _ in range(64):
        f.write(json.dumps({"prompt": text(prompt), "answer": "a"}) + "\n")
PY

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
lmx_train() {  # name, steps, then the objective's settings
    local name=$1 count=$2
    shift 2
    run "$name" "$lmx" --device "$device" train --model llama --preset tiny \
        --set vocab="$vocab" --set ctx="$ctx" \
        --set d_model="$d_model" --set n_layers="$layers" --set n_heads="$heads" \
        --set n_kv_heads="$kv_heads" --set d_ff="$d_ff" --tokenizer byte "$@" \
        --precision "$dtype" --steps "$count" --lr 1e-6 --warmup 0 --eval-every 0 \
        --checkpoint-every 0 --sample 0 --quiet --out "$work/$name"
    cp "$work/$name/metrics.jsonl" "$out/$name.jsonl" 2>/dev/null
}
anchor() {  # name, then the objective's settings
    local name=$1
    shift
    run "$name" "$python" "$here/objectives_anchor_mlx.py" "$@" --vocab "$vocab" \
        --d-model "$d_model" --layers "$layers" --heads "$heads" --kv-heads "$kv_heads" \
        --d-ff "$d_ff" --prompt-len "$prompt" --steps "$steps" --warmup 5 --dtype "$dtype" \
        --device "$device"
}

case " $objectives " in *" dpo "*)
    lmx_train lmx-dpo $((steps + 5)) --step dpo --data "$work/prefs.jsonl" --seq-len "$seq" \
        --batch-size "$batch"
    anchor mlx-dpo dpo --batch "$batch" --seq "$seq"
esac
case " $objectives " in *" grpo "*)
    lmx_train lmx-grpo $((grpo_steps + 2)) --step grpo --data "$work/prompts.jsonl" \
        --reward length --group "$group" --seq-len "$max_tokens" --batch-size "$prompts"
    anchor mlx-grpo grpo --prompts "$prompts" --group "$group" --width $((prompt + max_tokens))
esac

"$python" - "$out" "$batch" "$seq" "$prompts" "$group" "$prompt" "$max_tokens" \
    > "$out/summary.txt" 2>&1 <<'PY'
import json, os, statistics, sys
out = sys.argv[1]
batch, seq, prompts, group, prompt, max_tokens = map(int, sys.argv[2:])
def steps(name, skip):
    try:
        rows = [json.loads(l) for l in open(f"{out}/{name}.jsonl") if '"kind":"step"' in l]
    except OSError:
        return []
    return rows[skip:] if len(rows) > skip else []
def row(name, tokens, ms, rows):
    peak = max(r.get("peak_memory_mib") or 0 for r in rows)
    return {"name": name, "median_ms": ms, "tokens_per_s": tokens / ms * 1e3, "peak_memory_mib": peak,
            "last_loss": rows[-1]["loss"]}
def anchor(name):
    try:
        lines = [l for l in open(f"{out}/{name}.txt") if l.startswith("{")]
        r = json.loads(lines[-1])
    except (OSError, IndexError, ValueError):
        return None
    r["name"] = f"{name} step" if name.endswith("dpo") else f"{name} update"
    return r
dpo_tokens = 2 * batch * seq
rollout_rows, width = prompts * group, prompt + max_tokens
results, notes = [], []
# lmx's DPO step: its time from its tokens/s (start to the next step's start); 5 warm up.
dpo = steps("lmx-dpo", 5)
lmx_dpo = dpo and row("lmx-dpo step", dpo_tokens,
                      statistics.median(dpo_tokens / r["tokens_per_s"] * 1e3 for r in dpo), dpo)
# lmx's GRPO update: building and running the compiled step, apart from the rollouts.
grpo = steps("lmx-grpo", 2)
lmx_grpo = None
if grpo and any(r.get("submit_ms") or r.get("wait_ms") for r in grpo):
    lmx_grpo = row("lmx-grpo update", rollout_rows * width,
                   statistics.median(r["submit_ms"] + r["wait_ms"] for r in grpo), grpo)
    rollout_ms = statistics.median(r["build_ms"] for r in grpo)
    notes.append(f"lmx-grpo rollouts  {rollout_ms:9.2f} ms/update  "
                 f"{rollout_rows * max_tokens / rollout_ms * 1e3:10.0f} generated tokens/s  "
                 f"({rollout_rows} completions of {max_tokens} tokens)")
elif grpo:
    whole = statistics.median(rollout_rows * width / r["tokens_per_s"] * 1e3 for r in grpo)
    notes.append(f"lmx-grpo: this lmx reports no update time apart from its rollouts "
                 f"(rollouts and update together: {whole:.2f} ms/update)")
for name, ours, theirs in [("dpo step", lmx_dpo, anchor("mlx-dpo")),
                           ("grpo update", lmx_grpo, anchor("mlx-grpo"))]:
    key = name.split()[0]
    if not any(os.path.exists(f"{out}/{who}-{key}.txt") for who in ("lmx", "mlx")):
        continue  # not run (OBJECTIVES)
    for r, label in [(ours, f"lmx-{name}"), (theirs, f"mlx-{name}")]:
        if not r:
            print(f"{label:18} no result (see {out})")
        else:
            print(f"{r['name']:18} {r['median_ms']:9.2f} ms/step  {r['tokens_per_s']:10.0f} tokens/s"
                  f"  peak {r['peak_memory_mib']:.0f} MiB  last loss {r['last_loss']:.4g}")
    if ours and theirs:
        ratio = theirs["median_ms"] / ours["median_ms"]
        print(f"{name}: lmx is {ratio:.2f}x the anchor (target at least 1.3x): "
              f"{'met' if ratio >= 1.3 else 'NOT met'}")
for note in notes:
    print(note)
PY
if [ "${TRACE:-0}" = 1 ]; then
    for name in lmx-dpo mlx-dpo lmx-grpo mlx-grpo; do
        [ -f "$work/$name.tsv" ] || continue
        echo "=== $name"
        # lmx's GRPO run alternates rollouts and updates: its last update is what follows the
        # last rollout's decoding kernels.
        window=(--last 0.5)
        [ "$name" = lmx-grpo ] && window=(--last 1 --after decode_attention)
        "$python" "$here/trace_summary.py" "$work/$name.tsv" "${window[@]}" --top 40
        echo
    done > "$out/profile.txt" 2>&1
fi
cat "$out/summary.txt"
rm -rf "$work"
