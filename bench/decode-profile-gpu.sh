#!/bin/bash
# Where batch-1 decoding's time goes on the GPU (issue 22's gap): CUPTI timelines
# (bench/cupti_trace.c) of `lmx bench generate` and of mlx-lm's `stream_generate`
# (bench/generate_mlx_lm.py) at the generation table's settings (bfloat16, batch 1, 128-token
# prompt, 256 new tokens, random weights), each summarized by bench/trace_summary.py: the
# kernels' share of a token's time and the GPU's idle time while the host builds the next token;
# then bench/host_sampler.c's stacks of lmx's decoding thread. On the GPU machine, staged by
# bench/gpu-stage-finetune.sh:
#
#     source .gpu/p2/assemble.sh && source .gpu-ft/unpack.sh && \
#         LMX=.gpu-ft/lmx bash bench/decode-profile-gpu.sh OUT
#
# MODELS (default "gpt2 llama"; llama is TinyLlama-1.1B's shape). OUT gets profile.txt and
# traces.tar.xz (the traces, the stacks, and the C and C++ runtime libraries the runs loaded, to
# read symbols elsewhere: `python3 bench/host_profile.py STACKS --binary lmx=target/release/lmx`).
set -u
out=${1:?output folder}
mkdir -p "$out"
lmx=${LMX:-target/release/lmx}
python=${PYTHON:-python3}
models=${MODELS:-gpt2 llama}
here=$(dirname "$0")
work=$(mktemp -d)
source "$here/cupti-build.sh"
gcc -shared -fPIC -O2 "$here/host_sampler.c" -o "$work/sampler.so" -lrt \
    || { echo "cannot build the sampler"; exit 1; }

shape() {  # generate_mlx_lm.py's flags for a model
    case $1 in
    gpt2) echo --model gpt2 --dim 768 --layers 12 --heads 12 --vocab 50257 --ctx 1024 ;;
    llama) echo --model llama --dim 2048 --layers 22 --heads 32 --kv-heads 4 --hidden 5632 \
        --vocab 32000 --ctx 2048 ;;
    esac
}
lmx_generate() {  # model, then the environment's settings before the command
    local model=$1
    shift
    env "$@" "$lmx" --device gpu bench generate --models "$model" --dtypes bfloat16 --prompt 128 \
        --tokens 256 --repeats 3 --llama-preset tinyllama-1.1b
}
for model in $models; do
    # Untimed: MLX's CUDA backend compiles its kernels on first use.
    lmx_generate "$model" > /dev/null 2>&1
    lmx_generate "$model" LMX_TRACE_OUT="$work/lmx-$model.tsv" LD_PRELOAD="$work/trace.so" \
        > "$work/lmx-$model.txt" 2>&1
    LMX_TRACE_OUT=$work/mlx-lm-$model.tsv LD_PRELOAD=$work/trace.so "$python" \
        "$here/generate_mlx_lm.py" $(shape "$model") --prompt 128 --tokens 256 --dtype bfloat16 \
        > "$work/mlx-lm-$model.txt" 2>&1
    lmx_generate "$model" LMX_SAMPLE_OUT="$work/lmx-$model.stacks" LMX_SAMPLE_SKIP_S=4 \
        LD_PRELOAD="$work/sampler.so" > "$work/lmx-$model-sampled.txt" 2>&1
    for side in lmx mlx-lm; do
        echo "=== $side $model"
        cat "$work/$side-$model.txt"
        "$python" "$here/trace_summary.py" "$work/$side-$model.tsv" --last 0.5 --top 25
        echo
    done >> "$out/profile.txt" 2>&1
    "$python" "$here/host_profile.py" "$work/lmx-$model.stacks" >> "$out/profile.txt" 2>&1
done
mkdir -p "$work/libs"
for library in libc.so.6 libstdc++.so.6 libcudart.so.13; do
    path=$(ldd "$lmx" | awk -v name="$library" '$1 == name { print $3 }')
    [ -n "$path" ] && cp -L "$path" "$work/libs/"
done
tar -C "$work" -cJf "$out/traces.tar.xz" .
cat "$out/profile.txt"
