// What mlx-c 0.7.0 does not expose and lmx needs: an array's identity (MLX's `array::id()`, the
// address of the description its copies share), which stays the same for every handle to one
// array and is never another array's while any handle to it lives.
#include "mlx/c/private/array.h"

extern "C" uintptr_t lmx_array_id(mlx_array a) {
  return mlx_array_get_(a).id();
}
