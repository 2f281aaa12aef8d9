//! Column sums of a matrix in two kernels: partial sums over blocks of rows, in float32, then
//! their total, added in a fixed order and rounded once to the matrix's precision.

use super::kernel::{with_kernel, Inputs, Kernel, Launch, TemplateArg};
use crate::error::Result;
use mlx_rs::{Array, Dtype};

/// Rows each block of [`PARTIALS`] sums: enough blocks to fill a large GPU at the batch sizes of
/// training (16,384 rows make 256 row blocks), few enough that their partial sums stay small.
const ROWS_PER_BLOCK: i32 = 64;

/// Most row blocks: bounds the partial sums that the total reads.
const MAX_ROW_BLOCKS: i32 = 1024;

/// Threads per block of [`PARTIALS`].
const THREADS_PER_BLOCK: i32 = 128;

/// `out[p, c]`: the sum of `x[r, c]` over the rows `r` of row block `p`, in float32. Each thread
/// walks `VEC` neighbouring columns down its block's rows, reading them at once (16 bytes where
/// `VEC` fills them and the rows are aligned; value by value otherwise), so a warp reads whole
/// cache lines of each row, with eight rows' reads in flight together.
const PARTIALS: &str = r#"
  struct alignas(sizeof(T) * VEC) Pack {
    T v[VEC];
  };
  constexpr int UNROLL = 8;
  const int rows = x_shape[0];
  const int columns = x_shape[1];
  const int c = (blockIdx.x * blockDim.x + threadIdx.x) * VEC;
  if (c >= columns) {
    return;
  }
  const int per_block = (rows + gridDim.y - 1) / gridDim.y;
  const int first = blockIdx.y * per_block;
  const int last = min(rows, first + per_block);
  const size_t stride = columns;
  const T* value = x + first * stride + c;
  float sum[VEC];
#pragma unroll
  for (int j = 0; j < VEC; ++j) {
    sum[j] = 0.f;
  }
  int r = first;
  if (reinterpret_cast<size_t>(x) % sizeof(Pack) == 0) {
    // UNROLL rows' loads in flight at once, then their sums.
    for (; r + UNROLL <= last; r += UNROLL, value += UNROLL * stride) {
      Pack packs[UNROLL];
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) {
        packs[u] = *reinterpret_cast<const Pack*>(value + u * stride);
      }
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) {
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          sum[j] += static_cast<float>(packs[u].v[j]);
        }
      }
    }
  }
  for (; r < last; ++r, value += stride) {
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      sum[j] += static_cast<float>(value[j]);
    }
  }
#pragma unroll
  for (int j = 0; j < VEC; ++j) {
    out[blockIdx.y * stride + c + j] = sum[j];
  }
"#;

/// `out[c]`: the sum of `partials[p, c]` over `p`, as `U`. A block of 32 x 8 threads takes 32
/// columns; its 8 rows of threads add every 8th partial each, then one row adds their 8 sums in
/// order: the same order on every run.
const TOTAL: &str = r#"
  __shared__ float sums[8][33];
  const int count = partials_shape[0];
  const int columns = partials_shape[1];
  const int c = blockIdx.x * 32 + threadIdx.x;
  float sum = 0.f;
  if (c < columns) {
    for (int p = threadIdx.y; p < count; p += 8) {
      sum += partials[p * static_cast<size_t>(columns) + c];
    }
  }
  sums[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y == 0 && c < columns) {
    float total = 0.f;
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      total += sums[k][threadIdx.x];
    }
    out[c] = static_cast<U>(total);
  }
"#;

thread_local! {
    static PARTIALS_KERNEL: Result<Kernel> =
        Kernel::new("lmx_column_partials", (&["x"], Inputs::RowContiguous), &["out"], "", PARTIALS);
    static TOTAL_KERNEL: Result<Kernel> = Kernel::new(
        "lmx_column_total",
        (&["partials"], Inputs::RowContiguous),
        &["out"],
        "",
        TOTAL,
    );
}

/// The sums of the columns of `x: [rows, columns]`, accumulated in float32, as `x`'s dtype.
pub(crate) fn column_sum(x: &Array) -> Result<Array> {
    let (rows, columns) = (x.shape()[0], x.shape()[1]);
    let blocks = ((rows + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK).clamp(1, MAX_ROW_BLOCKS);
    let vec = vector_width(x.dtype(), columns);
    let partials = with_kernel(&PARTIALS_KERNEL, |kernel| {
        kernel.launch(
            std::slice::from_ref(x),
            &Launch {
                outputs: &[(&[blocks, columns], Dtype::Float32)],
                grid: (round_up(columns / vec, THREADS_PER_BLOCK), blocks, 1),
                block: (THREADS_PER_BLOCK, 1, 1),
                template: &[
                    TemplateArg::Type("T", x.dtype()),
                    TemplateArg::Int("VEC", vec),
                ],
            },
        )
    })?;
    total(&partials[0], x.dtype())
}

/// The sums of the columns of `partials: [count, columns]` (float32), added in a fixed order, as
/// `dtype`.
pub(crate) fn total(partials: &Array, dtype: Dtype) -> Result<Array> {
    let columns = partials.shape()[1];
    let mut out = with_kernel(&TOTAL_KERNEL, |kernel| {
        kernel.launch(
            std::slice::from_ref(partials),
            &Launch {
                outputs: &[(&[columns], dtype)],
                grid: (round_up(columns, 32), 8, 1),
                block: (32, 8, 1),
                template: &[TemplateArg::Type("U", dtype)],
            },
        )
    })?;
    Ok(out.remove(0))
}

/// How many values of `dtype` fill 16 bytes, the widest load a thread makes at once.
pub(crate) fn pack_width(dtype: Dtype) -> i32 {
    use Dtype::*;
    match dtype {
        Bool | Uint8 | Int8 => 16,
        Uint16 | Int16 | Float16 | Bfloat16 => 8,
        Uint32 | Int32 | Float32 => 4,
        Uint64 | Int64 | Float64 | Complex64 => 2,
    }
}

/// How many neighbouring values of a row of `columns` values of `dtype` a thread reads at once:
/// [`pack_width`] where the row length is a multiple of it, so that every row starts aligned.
pub(crate) fn vector_width(dtype: Dtype, columns: i32) -> i32 {
    let width = pack_width(dtype);
    if columns % width == 0 {
        width
    } else {
        1
    }
}

/// `value` rounded up to a multiple of `step`.
fn round_up(value: i32, step: i32) -> i32 {
    (value + step - 1) / step * step
}
