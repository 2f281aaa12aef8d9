// What mlx-c 0.7.0 does not expose and lmx needs: an array's identity (MLX's `array::id()`, the
// address of the description its copies share), which stays the same for every handle to one
// array and is never another array's while any handle to it lives; and where a view's rows lie
// in the array it views.
#include <cstdint>
#include <string_view>

#include "mlx/c/private/array.h"
#include "mlx/primitives.h"

extern "C" uintptr_t lmx_array_id(mlx_array a) {
  return mlx_array_get_(a).id();
}

namespace {

using mlx::core::array;

// The product of `shape`'s sizes from axis `from` on.
int64_t size_from(const mlx::core::Shape& shape, size_t from) {
  int64_t n = 1;
  for (size_t i = from; i < shape.size(); ++i) n *= shape[i];
  return n;
}

// Whether `axes` keeps the row-major order of an array of `shape`'s values: the axes of more than
// one value stay in their order (moving an axis of one value moves no value).
bool keeps_order(const std::vector<int>& axes, const mlx::core::Shape& shape) {
  int last = -1;
  for (int axis : axes) {
    if (shape[axis] == 1) continue;
    if (axis < last) return false;
    last = axis;
  }
  return true;
}

}  // namespace

// Where the rows of `a` (its first axis) lie in the array `*base` it is a view of, through
// reshapes and transposes that keep the values' row-major order and slices or splits of the
// last axis (every other axis past the first of one value): row `b`'s values, in row-major order,
// are `*base`'s flat values from `b * row_stride + offset` on, `*base` read row-major (as a
// kernel taking row-contiguous inputs reads it). The walk stops at the first step that does not
// keep the rows so, whose output is then the base (`a` itself, where that is the first). Returns
// false, and sets nothing, for a scalar or where MLX throws (no exception may reach Rust).
extern "C" bool lmx_array_rows_of(
    mlx_array a, mlx_array* base, int64_t* offset, int64_t* row_stride) try {
  array x = mlx_array_get_(a);
  if (x.ndim() == 0) return false;
  const int rows = x.shape(0);
  int64_t at = 0;
  while (x.has_primitive()) {
    // By name, then the class whose name it is: libmlx exports no type information to cast by.
    auto& p = x.primitive();
    const std::string_view name = p.name();
    const auto& in = x.inputs();
    if (in.size() != 1 || in[0].ndim() == 0 || in[0].shape(0) != rows) break;
    const auto& shape = in[0].shape();
    if (name == "Reshape") {
      // Same rows, each row's values in the same order.
    } else if (name == "Transpose") {
      const auto axes = static_cast<mlx::core::Transpose&>(p).state();
      if (axes.empty() || axes[0] != 0 || !keeps_order(axes, shape)) break;
    } else if (name == "Slice") {
      const auto [start, end, strides] = static_cast<mlx::core::Slice&>(p).state();
      const size_t last = shape.size() - 1;
      bool keeps = true;
      for (size_t i = 0; i < shape.size(); ++i) {
        const bool whole = start[i] == 0 && end[i] == shape[i];
        const bool one = i == 0 || i == last || shape[i] == 1;
        if (strides[i] != 1 || !one || (i != last && !whole)) keeps = false;
      }
      if (!keeps) break;
      at += start[last];
    } else if (name == "Split") {
      const auto [indices, axis] = static_cast<mlx::core::Split&>(p).state();
      const int last = static_cast<int>(shape.size()) - 1;
      const int split_axis = axis < 0 ? axis + last + 1 : axis;
      bool keeps = split_axis == last;
      for (int i = 1; i < last; ++i) {
        if (shape[i] != 1) keeps = false;
      }
      const auto outputs = x.outputs();
      size_t k = 0;
      while (k < outputs.size() && outputs[k].id() != x.id()) ++k;
      if (!keeps || k == outputs.size()) break;
      at += k == 0 ? 0 : indices[k - 1];
    } else {
      break;
    }
    x = in[0];
  }
  *offset = at;
  *row_stride = size_from(x.shape(), 1);
  *base = mlx_array_new_(x);
  return true;
} catch (...) {
  return false;
}
