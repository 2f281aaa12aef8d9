#!/bin/bash
# GPU timelines of the training step, lmx and the Python MLX anchor alike, through CUPTI
# (bench/cupti_trace.c, built here on the GPU machine against its own CUPTI), each summarized by
# bench/trace_summary.py. On the GPU machine, after ../shared/gpu's call 1:
#
#     source .gpu/p2/assemble.sh && bash .gpu-bin/unpack.sh && \
#         LMX=.gpu-bin/lmx ANCHORS=.gpu-bin bash bench/gpu-profile.sh $OUT [CONFIG...]
#
# CONFIG defaults to tiny and small; every row is compiled, at 16 x 256 (gpt2: 16 x 1024), in
# DTYPE (bfloat16 unless set: bfloat16 or float32). The summaries land in OUT/profile.txt, the
# traces in OUT/traces.tar.xz.
set -u
out=${1:?output folder}
shift
configs=${*:-tiny small}
mkdir -p "$out"
lmx=${LMX:-target/release/lmx}
anchors=${ANCHORS:-../shared/bench}
python=${PYTHON:-python3}
dtype=${DTYPE:-bfloat16}
here=$(dirname "$0")
work=$(mktemp -d)

source "$here/cupti-build.sh"

for config in $configs; do
    case $config in
    gpt2) common=(--batch 16 --seq 1024 --steps 20 --warmup 5) ;;
    *) common=(--batch 16 --seq 256 --steps 40 --warmup 10) ;;
    esac
    # Untimed: MLX's CUDA backend compiles its kernels on first use.
    "$lmx" --device gpu bench train --configs "$config" --modes compiled --dtypes "$dtype" \
        "${common[@]:0:4}" --steps 2 --warmup 1 > /dev/null 2>&1
    # The tracer follows one process: trace the process that trains (`--one-row`, which prints
    # its row as one JSON line), not the `bench train` that would start it.
    LMX_TRACE_OUT=$work/lmx-$config.tsv LD_PRELOAD=$work/trace.so "$lmx" --device gpu bench train \
        --one-row --configs "$config" --modes compiled --dtypes "$dtype" "${common[@]}" \
        > "$work/lmx-$config.json" 2> "$work/lmx-$config.err" \
        || echo "lmx $config failed (exit $?), see lmx-$config.err in the traces" >> "$out/profile.txt"
    LMX_TRACE_OUT=$work/anchor-$config.tsv LD_PRELOAD=$work/trace.so "$python" \
        "$anchors/anchor_mlx.py" --config "$config" --compile 1 --dtype "$dtype" --device gpu \
        "${common[@]}" > "$work/anchor-$config.json" 2> "$work/anchor-$config.err" \
        || echo "the anchor $config failed (exit $?), see anchor-$config.err" >> "$out/profile.txt"
    for side in lmx anchor; do
        ms=$("$python" -c "import json,sys; print(json.loads([l for l in open(sys.argv[1]) \
            if l.startswith('{')][-1])['median_ms'])" "$work/$side-$config.json" 2>/dev/null)
        {
            echo "=== $side $config $dtype compiled ${common[1]}x${common[3]}: median ${ms:-?} ms/step (traced)"
            "$python" "$here/trace_summary.py" "$work/$side-$config.tsv" ${ms:+--step-ms "$ms"}
            echo
        } >> "$out/profile.txt" 2>&1
    done
done
tar -C "$work" -cJf "$out/traces.tar.xz" .
cat "$out/profile.txt"
