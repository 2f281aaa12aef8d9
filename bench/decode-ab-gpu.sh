#!/bin/bash
# Batch-1 decoding of two lmx builds, alternated (issue 22's rows, where a change to decoding is
# weighed): `lmx bench generate` at the generation table's settings (GPT-2 124M and
# TinyLlama-1.1B shapes, bfloat16, 128-token prompt, 256 new tokens, three timed runs a process),
# one process at a time, each pinned to the same cores, the builds' order swapped every round,
# since this host's processes of one binary spread by up to 30% (docs/benchmarks.md, "Third
# session of 2026-11-28"); then the medians of each build's processes. The first process of each
# build is untimed: MLX and lmx compile their kernels in it.
#
#     bash bench/decode-ab-gpu.sh OUT LMX_A LMX_B
#
# Environment: ROUNDS (default 3), CORES (taskset's list, default 4-7), MODELS (default
# gpt2,llama), PYTHON (default python3), ARGS_A and ARGS_B (more `bench generate` options for
# one side, split at whitespace: one binary's bfloat16 against its 4-bit decoding is
# `ARGS_B="--bits 4" bash bench/decode-ab-gpu.sh OUT lmx lmx`). OUT gets each process's JSON lines (A-r1.jsonl, ...)
# and summary.txt.
set -u
out=${1:?output folder}
a=${2:?the first lmx binary}
b=${3:?the second lmx binary}
mkdir -p "$out"
rounds=${ROUNDS:-3}
cores=${CORES:-4-7}
python=${PYTHON:-python3}
generate() {  # binary, then the rest of the arguments
    local binary=$1
    shift
    taskset -c "$cores" "$binary" --device gpu bench generate --models "${MODELS:-gpt2,llama}" \
        --dtypes bfloat16 --prompt 128 --tokens 256 --repeats 3 --llama-preset tinyllama-1.1b "$@"
}
read -ra args_a <<< "${ARGS_A:-}"
read -ra args_b <<< "${ARGS_B:-}"
generate "$a" "${args_a[@]}" > "$out/A-warm.txt" 2>&1
generate "$b" "${args_b[@]}" > "$out/B-warm.txt" 2>&1
for round in $(seq "$rounds"); do
    order="A B"
    [ $((round % 2)) = 0 ] && order="B A"
    for side in $order; do
        if [ "$side" = A ]; then
            generate "$a" "${args_a[@]}" --json "$out/A-r$round.jsonl" > "$out/A-r$round.txt" 2>&1
        else
            generate "$b" "${args_b[@]}" --json "$out/B-r$round.jsonl" > "$out/B-r$round.txt" 2>&1
        fi
        echo "exit status $?" >> "$out/$side-r$round.txt"
    done
done
"$python" - "$out" <<'SUMMARY' | tee "$out/summary.txt"
import glob, json, os, statistics, sys
out = sys.argv[1]
rates = {}
for path in sorted(glob.glob(os.path.join(out, "[AB]-r*.jsonl"))):
    side = os.path.basename(path).split("-")[0]
    for line in open(path):
        row = json.loads(line)
        if row.get("impl") == "lmx":
            rates.setdefault((row["model"], side), []).append(row["decode_tokens_per_s"])
for model in sorted({model for model, _ in rates}):
    a, b = rates.get((model, "A"), []), rates.get((model, "B"), [])
    cells = [f"{side} {statistics.median(r):.1f} ({', '.join(f'{x:.1f}' for x in r)})"
             for side, r in (("A", a), ("B", b)) if r]
    ratio = f", B/A {statistics.median(b) / statistics.median(a):.3f}" if a and b else ""
    print(f"{model}: decode tokens/s " + "; ".join(cells) + ratio)
SUMMARY
