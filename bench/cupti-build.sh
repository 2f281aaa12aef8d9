# Sourced by the GPU profiling scripts: builds bench/cupti_trace.c against the CUPTI of the Python
# package `nvidia` (PyTorch's CUDA libraries; the GPU machine has no CUDA toolkit of its own) into
# $work/trace.so and puts that CUPTI on LD_LIBRARY_PATH. Needs $python, $here and $work.
nvidia=$("$python" -c "import nvidia, os; print(list(nvidia.__path__)[0])") \
    || { echo "no Python package nvidia (PyTorch's CUDA libraries) to take CUPTI from"; exit 1; }
# The header and the library of one CUPTI: the folder that holds both.
include=$(dirname "$(find -L "$nvidia/" -name cupti_activity.h | head -1)")
cupti=$(cd "$include/../lib" && pwd)
library=$(find "$cupti/" -maxdepth 1 -name 'libcupti.so*' | sort | head -1)
cuda_include=$(dirname "$(find /usr/local/cuda*/ /usr/include "$nvidia/" -path '*crt/host_defines.h' \
    2>/dev/null | head -1)")/..
gcc -shared -fPIC -O2 -I"$include" -I"$cuda_include" "$here/cupti_trace.c" -o "$work/trace.so" \
    "$library" \
    || { echo "cannot build the tracer"; exit 1; }
export LD_LIBRARY_PATH=$cupti${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
