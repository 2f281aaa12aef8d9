//! The gradient of layer normalisation in one pass over the rows.
//!
//! MLX's own backward pass takes three kernels: one writes `dx` and a full-size bfloat16 copy of
//! `g * x_hat`, then two column sums (in bfloat16) reduce that copy and `g` to the weight's and
//! the bias's gradients. This kernel reads `x` and `g` once, writes `dx`, and keeps each block's
//! float32 sums of `g * x_hat` and `g` for the rows it handled; the total of those partial sums
//! (`sums::total`) gives both gradients.

use super::kernel::{with_kernel, Inputs, Kernel, Launch, TemplateArg};
use super::sums::{total, vector_width};
use crate::error::{Error, Result};
use mlx_rs::{Array, Dtype};

/// The widest row the kernel takes: each of a warp's 32 threads keeps `columns / 32` values of its
/// row, of its gradient and of its two sums in registers (the weight is in shared memory).
pub(crate) const LAYER_NORM_MAX_COLUMNS: i32 = 1024;

/// Warps per block, one row at a time each: few enough that several blocks fit on a
/// multiprocessor beside each other's registers.
const WARPS: i32 = 4;

/// Most blocks: bounds the partial sums, two rows of `columns` floats per block.
const MAX_BLOCKS: i32 = 512;

const HEADER: &str = r#"
__device__ __forceinline__ float lmx_warp_sum(float value) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) {
    value += __shfl_xor_sync(0xffffffff, value, offset);
  }
  return value;
}
"#;

/// `dx` for `y = (x - mean) * rstd * w + b` and the upstream gradient `g`, with
/// `partials[block] = [sum of g * x_hat, sum of g]` over the block's rows. A warp takes a row at a
/// time; thread `lane` holds the `VEC` neighbouring columns starting at `(32 k + lane) VEC`, for
/// `k < N`, read and written at once where the rows are aligned. The statistics are recomputed in
/// float32 as the forward pass computed them (two passes for the variance). The weight waits in
/// shared memory, which then gathers the warps' sums.
const BODY: &str = r#"
  struct alignas(sizeof(T) * VEC) Pack {
    T v[VEC];
  };
  constexpr int M = N * VEC;
  const int rows = x_shape[0];
  const int columns = x_shape[1];
  const float eps = __int_as_float(EPS_BITS);
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const int warps = blockDim.x / 32;
  const bool aligned = (reinterpret_cast<size_t>(x) | reinterpret_cast<size_t>(g) |
                        reinterpret_cast<size_t>(dx)) % sizeof(Pack) == 0;
  // The block's weight, and then its sums, in shared memory.
  __shared__ float shared[2 * 32 * M];
  for (int c = threadIdx.x; c < columns; c += blockDim.x) {
    shared[c] = static_cast<float>(w[c]);
  }
  __syncthreads();
  float dw[M], db[M];
#pragma unroll
  for (int i = 0; i < M; ++i) {
    dw[i] = 0.f;
    db[i] = 0.f;
  }
  for (int r = blockIdx.x * warps + warp; r < rows; r += gridDim.x * warps) {
    const size_t row = static_cast<size_t>(r) * columns;
    // Value i = k VEC + j of this thread is column (32 k + lane) VEC + j.
    float xv[M], gv[M];
#pragma unroll
    for (int k = 0; k < N; ++k) {
      const int c = (32 * k + lane) * VEC;
      if (c < columns && aligned) {
        const Pack xp = *reinterpret_cast<const Pack*>(x + row + c);
        const Pack gp = *reinterpret_cast<const Pack*>(g + row + c);
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          xv[k * VEC + j] = static_cast<float>(xp.v[j]);
          gv[k * VEC + j] = static_cast<float>(gp.v[j]);
        }
      } else {
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          xv[k * VEC + j] = c < columns ? static_cast<float>(x[row + c + j]) : 0.f;
          gv[k * VEC + j] = c < columns ? static_cast<float>(g[row + c + j]) : 0.f;
        }
      }
    }
    float sum = 0.f;
#pragma unroll
    for (int i = 0; i < M; ++i) {
      sum += xv[i];
    }
    const float mean = lmx_warp_sum(sum) / columns;
    float squares = 0.f;
#pragma unroll
    for (int i = 0; i < M; ++i) {
      const float d = (32 * (i / VEC) + lane) * VEC < columns ? xv[i] - mean : 0.f;
      squares += d * d;
    }
    const float rstd = rsqrtf(lmx_warp_sum(squares) / columns + eps);
    float mean_gw = 0.f, mean_gw_xhat = 0.f;
#pragma unroll
    for (int k = 0; k < N; ++k) {
      const int c = (32 * k + lane) * VEC;
      if (c < columns) {
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          const int i = k * VEC + j;
          const float gw = gv[i] * shared[c + j];
          mean_gw += gw;
          mean_gw_xhat += gw * (xv[i] - mean) * rstd;
        }
      }
    }
    mean_gw = lmx_warp_sum(mean_gw) / columns;
    mean_gw_xhat = lmx_warp_sum(mean_gw_xhat) / columns;
#pragma unroll
    for (int k = 0; k < N; ++k) {
      const int c = (32 * k + lane) * VEC;
      if (c < columns) {
        Pack pack;
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          const int i = k * VEC + j;
          const float xhat = (xv[i] - mean) * rstd;
          const float gw = gv[i] * shared[c + j];
          pack.v[j] = static_cast<T>(rstd * (gw - mean_gw - xhat * mean_gw_xhat));
          dw[i] += gv[i] * xhat;
          db[i] += gv[i];
        }
        if (aligned) {
          *reinterpret_cast<Pack*>(dx + row + c) = pack;
        } else {
#pragma unroll
          for (int j = 0; j < VEC; ++j) {
            dx[row + c + j] = pack.v[j];
          }
        }
      }
    }
  }
  // The block's warps add their sums in turn, then the block writes its row of partial sums.
  __syncthreads();
  for (int turn = 0; turn < warps; ++turn) {
    if (warp == turn) {
#pragma unroll
      for (int i = 0; i < M; ++i) {
        const int c = (32 * (i / VEC) + lane) * VEC + i % VEC;
        if (c < columns) {
          shared[c] = turn == 0 ? dw[i] : shared[c] + dw[i];
          shared[columns + c] = turn == 0 ? db[i] : shared[columns + c] + db[i];
        }
      }
    }
    __syncthreads();
  }
  float* out = partials + static_cast<size_t>(blockIdx.x) * 2 * columns;
  for (int i = threadIdx.x; i < 2 * columns; i += blockDim.x) {
    out[i] = shared[i];
  }
"#;

thread_local! {
    static KERNEL: Result<Kernel> = Kernel::new(
        "lmx_layer_norm_backward",
        (&["x", "w", "g"], Inputs::RowContiguous),
        &["dx", "partials"],
        HEADER,
        BODY,
    );
}

/// `[dx, dw, db]` of `layer_norm(x, w, b, eps)` over the last axis of `x: [rows, columns]` for
/// the upstream gradient `g` (read in `x`'s precision: another is rounded to it first); `dw` and
/// `db` in `w`'s dtype. `columns` is at most [`LAYER_NORM_MAX_COLUMNS`].
pub(crate) fn layer_norm_backward(x: &Array, w: &Array, g: &Array, eps: f32) -> Result<[Array; 3]> {
    let (rows, columns) = (x.shape()[0], x.shape()[1]);
    // The kernel reads `g` as `x`'s type. MLX's own operations hand a cotangent over in the
    // precision of the output it belongs to, so this costs nothing but for a cotangent made
    // otherwise.
    let g = &g.as_dtype(x.dtype())?;
    if columns > LAYER_NORM_MAX_COLUMNS {
        return Err(Error::Layout(format!(
            "the layer norm kernel takes rows of at most {LAYER_NORM_MAX_COLUMNS} values, not \
             {columns}"
        )));
    }
    let vec = vector_width(x.dtype(), columns);
    let chunks = (columns + 32 * vec - 1) / (32 * vec);
    let blocks = ((rows + 4 * WARPS - 1) / (4 * WARPS)).clamp(1, MAX_BLOCKS);
    let outputs = with_kernel(&KERNEL, |kernel| {
        kernel.launch(
            &[x.clone(), w.clone(), g.clone()],
            &Launch {
                outputs: &[
                    (&[rows, columns], x.dtype()),
                    (&[blocks, 2 * columns], Dtype::Float32),
                ],
                grid: (blocks * 32 * WARPS, 1, 1),
                block: (32 * WARPS, 1, 1),
                template: &[
                    TemplateArg::Type("T", x.dtype()),
                    TemplateArg::Type("W", w.dtype()),
                    TemplateArg::Int("N", chunks),
                    TemplateArg::Int("VEC", vec),
                    TemplateArg::Int("EPS_BITS", eps.to_bits() as i32),
                ],
            },
        )
    })?;
    let [dx, partials]: [Array; 2] = outputs
        .try_into()
        .map_err(|_| Error::Layout("the layer norm kernel returned the wrong outputs".into()))?;
    let sums = total(&partials, w.dtype())?;
    let halves = sums.split_equal(2, 0)?;
    Ok([dx, halves[0].clone(), halves[1].clone()])
}
