#!/bin/bash
# Runs test binaries on the GPU machine (MLX's CUDA backend), where `cargo test` cannot run: stage
# them here with bench/gpu-stage.sh, carry them over with MLX's CUDA build
# (../shared/gpu/README.md), then
#
#     bash tests/gpu.sh OUT BINARY[@FILTER,...]...
#
# A filter keeps the tests whose names contain it, as `cargo test FILTER` does: the root crate's
# one integration executable runs the modules that touch the device,
# `.gpu-bin/t_integration@generation::,models_reference::,llama_two_front_ends::,dropout::,flat_state::`.
#
# Each binary runs alone, one test at a time (MLX is not thread-safe; `cargo test` gets this from
# .cargo/config.toml), with float32 matrix products in float32: MLX's CUDA backend otherwise
# computes them in TF32 (MLX_ENABLE_TF32, on by default), about 1e-3 relative error, and the tests
# compare with float32 references to 1e-4. The output of every binary lands in OUT/tests.txt.
# Each binary gets TEST_TIMEOUT seconds (default 300): a debug build compiling its kernels on a
# cold cache needs more for the integration binary's model modules.
set -u
out=${1:?output folder}
shift
mkdir -p "$out"
: > "$out/tests.txt"
export RUST_TEST_THREADS=1 MLX_ENABLE_TF32=0
failed=0
for argument in "$@"; do
    binary=${argument%%@*}
    filters=()
    [ "$binary" != "$argument" ] && IFS=, read -ra filters <<< "${argument#*@}"
    echo "== $argument" >> "$out/tests.txt"
    timeout "${TEST_TIMEOUT:-300}" "$binary" "${filters[@]}" >> "$out/tests.txt" 2>&1
    status=$?
    echo "exit status $status" >> "$out/tests.txt"
    [ $status -eq 0 ] || failed=1
done
grep -E "^== |^test result|^exit status|FAILED|panicked" "$out/tests.txt"
exit $failed
