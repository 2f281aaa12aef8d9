//! The sum of an array's squares, in float32, read once.
//!
//! MLX's `sum(square(x.astype(float32)))` writes the float32 squares before it sums them: a
//! bfloat16 array's traffic five times over (its read, then twice its size written and read
//! again), on every step for the data-parallel step's averaged gradients. Here each thread reads
//! 16 bytes at a time (where the array's address allows), adds the squares in float32, and each
//! block's threads add theirs as [`pack_with_squares`](super::pack_with_squares)'s do; MLX adds
//! the blocks' sums.

use super::kernel::{with_kernel, Inputs, Kernel, Launch, TemplateArg};
use super::pack::BLOCK_SUM;
use super::sums::pack_width;
use crate::error::Result;
use mlx_rs::{Array, Dtype};

thread_local! {
    static SQUARES: Result<Kernel> = Kernel::new(
        "lmx_squares",
        (&["x"], Inputs::RowContiguous),
        &["squares"],
        "",
        &format!("{BODY}{BLOCK_SUM}"),
    );
}

/// Threads per block.
const THREADS: i32 = 256;

/// Most blocks: each walks the array with a grid-sized stride, so a few per multiprocessor
/// keep the memory busy.
const MAX_BLOCKS: i32 = 1024;

/// Each thread's sum of squares over its grid-strided vectors of `V` values (then the values
/// past the last whole vector), or value by value where `x` is not 16-byte aligned. The block
/// sum follows ([`BLOCK_SUM`], which closes this body's opening brace).
const BODY: &str = r#"
  size_t n = 1;
  for (int axis = 0; axis < x_ndim; ++axis) {
    n *= x_shape[axis];
  }
  const size_t first = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  float sum = 0.f;
  {
    size_t scalar_from = 0;
    if ((reinterpret_cast<size_t>(x) % 16) == 0) {
      const size_t vectors = n / V;
      const uint4* from = reinterpret_cast<const uint4*>(x);
      for (size_t i = first; i < vectors; i += stride) {
        const uint4 vector = from[i];
        const T* values = reinterpret_cast<const T*>(&vector);
#pragma unroll
        for (int j = 0; j < V; ++j) {
          const float value = static_cast<float>(values[j]);
          sum += value * value;
        }
      }
      scalar_from = vectors * V;
    }
    for (size_t i = scalar_from + first; i < n; i += stride) {
      const float value = static_cast<float>(x[i]);
      sum += value * value;
    }
"#;

/// Whether the kernel sums `x`'s squares: a non-empty floating-point array.
pub(crate) fn squares_fit(x: &Array) -> bool {
    matches!(x.dtype(), Dtype::Float32 | Dtype::Float16 | Dtype::Bfloat16) && x.size() > 0
}

/// The sum of `x`'s squares, a float32 scalar. Callers check [`squares_fit`].
pub(crate) fn squares(x: &Array) -> Result<Array> {
    let vectors = x.size().div_ceil(pack_width(x.dtype()) as usize);
    let blocks = vectors
        .div_ceil(THREADS as usize)
        .clamp(1, MAX_BLOCKS as usize) as i32;
    let mut partials = with_kernel(&SQUARES, |kernel| {
        kernel.launch(
            std::slice::from_ref(x),
            &Launch {
                outputs: &[(&[blocks], Dtype::Float32)],
                grid: (blocks * THREADS, 1, 1),
                block: (THREADS, 1, 1),
                template: &[
                    TemplateArg::Type("T", x.dtype()),
                    TemplateArg::Int("V", pack_width(x.dtype())),
                ],
            },
        )
    })?;
    Ok(partials.remove(0).sum(false)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use mlx_rs::ops::indexing::IndexOp;

    /// The sum of squares of arrays aligned and not (a slice one value in), with and without a
    /// tail past the last whole vector, in every float dtype, equals float64's.
    #[test]
    fn squares_equal_float64_sums() {
        if !crate::cuda::available() {
            return;
        }
        for dtype in [Dtype::Float32, Dtype::Float16, Dtype::Bfloat16] {
            for n in [1, 7, 8, 4096, 300_001] {
                let whole = mlx_rs::random::normal::<f32>(&[n + 1], None, None, None)
                    .unwrap()
                    .as_dtype(dtype)
                    .unwrap();
                for x in [whole.index(..n), whole.index(1..)] {
                    assert!(squares_fit(&x));
                    let values: Vec<f32> = x.as_dtype(Dtype::Float32).unwrap().as_slice().to_vec();
                    let want: f64 = values.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
                    let got = f64::from(squares(&x).unwrap().item_cast::<f32>());
                    assert!(
                        (got - want).abs() <= 1e-5 * want.max(1.0),
                        "{dtype:?} {n}: {got} {want}"
                    );
                }
            }
        }
    }

    #[test]
    fn only_non_empty_floats_fit() {
        assert!(squares_fit(&Array::from_slice(&[1.0f32], &[1])));
        assert!(!squares_fit(&Array::from_slice(&[1i32], &[1])));
        assert!(!squares_fit(&Array::from_slice::<f32>(&[], &[0])));
    }
}
