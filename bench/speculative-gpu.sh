#!/bin/bash
# Speculative decoding on text where the draft agrees often (issue 22's speculative row): a GPT-2
# target and a much smaller GPT-2 draft of the same byte vocabulary, both trained briefly by
# `lmx train` on the bundled data/shakespeare.txt, so that they learn the same frequent patterns;
# then `lmx generate` of the target alone (greedy) and drafted by the draft (`--draft`, its
# acceptance rate printed), each run twice (the first of each pays its traces), their texts
# compared (greedy speculative output must be the target's own) and their decode rates set
# side by side.
#
#     bash bench/speculative-gpu.sh OUT
#
# Environment: LMX (the lmx binary, default target/release/lmx), DEVICE (default gpu), STEPS
# (training steps of each model, default 600), BATCH (default 32), TOKENS (tokens generated,
# default 200: within the models' context of 256), DRAFT_TOKENS (default 4), TARGET_SET and
# DRAFT_SET (the models' --set NAME=VALUE settings over the `bytes` preset; defaults GPT-2 124M's
# width and depth for the target, 2 layers of width 256 for the draft).
# At a tiny size on the CPU (a check of the script, not a measurement):
#
#     LMX=target/debug/lmx DEVICE=cpu STEPS=60 BATCH=8 TOKENS=60 \
#         TARGET_SET="d_model=128 n_layers=4 n_heads=4" DRAFT_SET="d_model=32 n_layers=1 n_heads=2" \
#         bash bench/speculative-gpu.sh /tmp/spec
#
# On the GPU machine, staged by bench/gpu-stage-finetune.sh (the release lmx in .gpu-ft), with
# carry [".gpu/p2", ".gpu-ft"]:
#
#     source .gpu/p2/assemble.sh && LMX=.gpu-ft/lmx bash bench/speculative-gpu.sh $OUT/spec
set -u
out=${1:?output folder}
mkdir -p "$out"
lmx=${LMX:-target/release/lmx}
device=${DEVICE:-gpu}
steps=${STEPS:-600}
batch=${BATCH:-32}
tokens=${TOKENS:-200}
draft_tokens=${DRAFT_TOKENS:-4}
target_set=${TARGET_SET:-"d_model=768 n_layers=12 n_heads=12"}
draft_set=${DRAFT_SET:-"d_model=256 n_layers=2 n_heads=4"}
prompt="ROMEO:"

train() {  # run folder, then the settings
    local run=$1 sets=()
    for setting in $2; do sets+=(--set "$setting"); done
    "$lmx" --device "$device" train --model gpt2 --preset bytes --tokenizer byte --seq-len 256 \
        --batch-size "$batch" --steps "$steps" --quiet --sample 0 "${sets[@]}" --out "$run" \
        > "$run.log" 2>&1 || { echo "training $run failed:"; tail -5 "$run.log"; exit 1; }
}
train "$out/target" "$target_set"
train "$out/draft" "$draft_set"

generate() {  # name, then generate's extra flags
    local name=$1
    shift
    "$lmx" --device "$device" generate --run "$out/target" --prompt "$prompt" --temperature 0 \
        --max-tokens "$tokens" "$@" > "$out/$name.txt" 2> "$out/$name.err" \
        || { echo "$name failed:"; tail -5 "$out/$name.err"; exit 1; }
}
for round in 1 2; do
    generate "plain$round"
    generate "speculative$round" --draft "$out/draft" --draft-tokens "$draft_tokens"
done

rate() { grep -o 'decode [0-9.]* tok/s' "$1" | tail -1 | awk '{print $2}'; }
echo "target: $target_set; draft: $draft_set; $steps steps each, $tokens tokens, $draft_tokens drafted at a time"
for round in 1 2; do
    plain=$(rate "$out/plain$round.err")
    spec=$(rate "$out/speculative$round.err")
    accepted=$(grep -o 'draft acceptance [^;]*' "$out/speculative$round.err" | tail -1)
    same=$(cmp -s "$out/plain$round.txt" "$out/speculative$round.txt" && echo yes || echo NO)
    echo "round $round: plain $plain tok/s, speculative $spec tok/s" \
        "($(awk -v s="$spec" -v p="$plain" 'BEGIN { printf "%.2fx", s / p }')), $accepted;" \
        "same text: $same"
done
