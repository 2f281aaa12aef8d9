#!/bin/bash
# Where the host thread's wall time goes in the compiled training step on the GPU, lmx and the
# Python anchor alike: bench/host_sampler.c (built here on the GPU machine) samples the thread
# that trains, and bench/host_profile.py summarizes its stacks. On the GPU machine, after
# ../shared/gpu's call 1:
#
#     source .gpu/p2/assemble.sh && bash .gpu-bin/unpack.sh && \
#         LMX=.gpu-bin/lmx ANCHORS=.gpu-bin bash bench/gpu-host-profile.sh $OUT [CONFIG...]
#
# CONFIG defaults to tiny and small, at 16 x 256 in DTYPE (float32 unless set). lmx runs in its
# default order (submit) and with --overlap off, the anchor's order. OUT receives stacks.tar.xz:
# the stacks, each run's JSON line, and the C and C++ runtime libraries the runs loaded, to read
# symbols from elsewhere (`python3 bench/host_profile.py STACKS --binary NAME=PATH`).
set -u
out=${1:?output folder}
shift
configs=${*:-tiny small}
mkdir -p "$out"
lmx=${LMX:-target/release/lmx}
anchors=${ANCHORS:-../shared/bench}
python=${PYTHON:-python3}
dtype=${DTYPE:-float32}
here=$(dirname "$0")
work=$(mktemp -d)

gcc -shared -fPIC -O2 "$here/host_sampler.c" -o "$work/sampler.so" -lrt \
    || { echo "cannot build the sampler"; exit 1; }

sampled() {  # name, then the command
    local name=$1
    shift
    LMX_SAMPLE_OUT=$work/$name.stacks LMX_SAMPLE_SKIP_S=${SKIP_S:-4} LD_PRELOAD=$work/sampler.so \
        "$@" > "$work/$name.json" 2> "$work/$name.err"
    echo "$name: exit status $?, $(grep -o '"median_ms": *[0-9.]*' "$work/$name.json")"
}

for config in $configs; do
    case $config in
    tiny) steps=1500 ;;
    *) steps=400 ;;
    esac
    common=(--configs "$config" --modes compiled --dtypes "$dtype" --batch 16 --seq 256)
    # Untimed: MLX's CUDA backend compiles its kernels on first use.
    "$lmx" --device gpu bench train "${common[@]}" --steps 2 --warmup 1 > /dev/null 2>&1
    sampled "lmx-$config" "$lmx" --device gpu bench train --one-row "${common[@]}" \
        --steps "$steps" --warmup 10
    sampled "lmx-off-$config" "$lmx" --device gpu bench train --one-row "${common[@]}" \
        --steps "$steps" --warmup 10 --overlap off
    sampled "anchor-$config" "$python" "$anchors/anchor_mlx.py" --config "$config" --compile 1 \
        --dtype "$dtype" --device gpu --batch 16 --seq 256 --steps "$steps" --warmup 10
done
mkdir -p "$work/libs"
for library in libc.so.6 libstdc++.so.6 libcudart.so.13; do
    path=$(ldd "$lmx" | awk -v name="$library" '$1 == name { print $3 }')
    [ -n "$path" ] && cp -L "$path" "$work/libs/"
done
tar -C "$work" -cJf "$out/stacks.tar.xz" .
