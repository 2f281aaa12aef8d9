#!/usr/bin/env bash
# Regenerates the fixtures of tests/models_reference.rs in tests/fixtures/:
#   1. `cargo run --example export_tiny` initialises every bundled model at `tiny` from a fixed
#      seed and writes its parameters (<model>_tiny.safetensors, by dotted tree names) and fixed
#      tokens (<model>_tiny_io.safetensors);
#   2. tests/reference/models.py, independent Python MLX implementations, loads those weights by
#      name, runs forward on the tokens and adds the logits to <model>_tiny_io.safetensors.
#
# Needs Python MLX 0.32.2 (the version the Rust side builds): by default from /tmp/pymlx
#   python3 -m pip install --target /tmp/pymlx mlx==0.32.2 mlx-cpu==0.32.2
# or set PYMLX to another folder for PYTHONPATH. LD_PRELOAD is cleared for Python so that it
# uses the BLAS its wheel ships.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
fixtures="$root/tests/fixtures"
cd "$root"
cargo run --quiet --example export_tiny -- "$fixtures"
env -u LD_PRELOAD PYTHONPATH="${PYMLX:-/tmp/pymlx}" python3 tests/reference/models.py "$fixtures"
