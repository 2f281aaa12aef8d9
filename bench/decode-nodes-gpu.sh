#!/bin/bash
# What one decoded token asks of the GPU, kernel by kernel: MLX writes every CUDA graph it
# launches as a DOT file (MLX_SAVE_CUDA_GRAPHS_DOT_FILE); two decodes of 32 and 64 tokens after
# the same 128-token prompt differ by 32 tokens of each of `lmx bench generate`'s two generations
# (an untimed one, then the timed one), so the difference of their nodes over 64 is a token's.
#
#     bash bench/decode-nodes-gpu.sh OUT LMX [bench generate's options, e.g. --bits 4]
#
# Environment: MODEL (default llama, at TinyLlama-1.1B's shape), CORES (taskset's list, default
# 4-7). Prints the graphs and the nodes a token, then the kernels a token by name.
set -u
out=${1:?output folder}
lmx=${2:?the lmx binary}
shift 2
for tokens in 32 64; do
    dir=$out/$tokens
    rm -rf "$dir" && mkdir -p "$dir"
    MLX_SAVE_CUDA_GRAPHS_DOT_FILE=$dir/g taskset -c "${CORES:-4-7}" "$lmx" --device gpu bench generate \
        --models "${MODEL:-llama}" --dtypes bfloat16 --prompt 128 --tokens $tokens --repeats 1 \
        --llama-preset tinyllama-1.1b "$@" > "$dir.log" 2>&1 || { cat "$dir.log"; exit 1; }
done
python3 - "$out" <<'COUNT'
import collections, glob, re, sys
def kernel(label):
    parts = [p.strip() for p in re.split(r"\\n|\n", label) if p.strip()]
    name = next((p for p in parts if p.startswith("_Z")), None)
    if name is None:
        return None
    own = re.search(r"custom_kernel_(lmx_[a-z_]+?)_[0-9a-f]{16}", name)
    if own:
        return own.group(1)
    mlx = re.search(r"cu\d+([A-Za-z0-9_]+?)I", name)
    return "mlx " + (mlx.group(1) if mlx else name[:60])
def count(dir):
    graphs = glob.glob(dir + "/g_*.dot")
    kernels = collections.Counter()
    for path in graphs:
        for label in re.findall(r'label="([^"]*)"', open(path).read()):
            name = kernel(label)
            if name:
                kernels[name] += 1
    return len(graphs), kernels
(g32, k32), (g64, k64) = count(sys.argv[1] + "/32"), count(sys.argv[1] + "/64")
print(f"graphs a token {(g64 - g32) / 64:.2f}, kernels a token {(sum(k64.values()) - sum(k32.values())) / 64:.1f}")
for name in sorted(k64, key=lambda n: k32[n] - k64[n]):
    if k64[name] != k32[name]:
        print(f"{(k64[name] - k32[name]) / 64:7.2f}  {name}")
COUNT
