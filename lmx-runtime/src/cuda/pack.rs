//! One kernel that copies many arrays, one after another, into a flat buffer, and sums their
//! squares on the way.
//!
//! MLX's `concatenate` launches one copy per input on CUDA; for a model's gradients that is a
//! launch per parameter, and at small sizes a step's time is its launches. This kernel reads
//! every input in one launch: block row `k` of the grid copies input `k` to its place. While it
//! holds each value it adds its square, in float32, to its block's partial sum, so the gradient
//! norm needs neither another pass over the flat buffer nor a float32 copy of it (at GPT-2's size
//! the squares of a bfloat16 gradient alone are 500 MB). Its source names the inputs' sizes and
//! places, so it is made once for each layout (a model's gradients have one) and kept for the
//! thread's lifetime.
//!
//! An input whose size and place in the flat buffer are whole multiples of 16 bytes is copied
//! 16 bytes a load and store (when its own address is 16-byte aligned, as MLX's allocations
//! are): with one value a load, the copy of a bfloat16 model's gradients ran well under the
//! GPU's bandwidth.

use super::kernel::{Inputs, Kernel, Launch, TemplateArg};
use super::sums::pack_width;
use crate::error::{Error, Result};
use mlx_rs::{Array, Dtype};
use std::cell::RefCell;
use std::collections::HashMap;
use std::fmt::Write;
use std::rc::Rc;

/// Threads per block.
const THREADS: i32 = 256;

/// Most blocks that copy one input; larger inputs are walked with a grid-sized stride.
const MAX_BLOCKS_PER_INPUT: i32 = 256;

thread_local! {
    /// The kernels made so far, by their source.
    static KERNELS: RefCell<HashMap<String, Rc<Kernel>>> = RefCell::new(HashMap::new());
}

/// `arrays`, each read in row-major order, one after another in a flat array of `dtype` (every
/// array must have that dtype), and the sum of the squares of their values, in float32.
pub(crate) fn pack_with_squares(
    arrays: &[Array],
    dtype: Dtype,
    weight: Option<&Array>,
) -> Result<(Array, Array)> {
    if let Some(other) = arrays.iter().find(|array| array.dtype() != dtype) {
        return Err(Error::Layout(format!(
            "cannot pack a {:?} array among {dtype:?} ones",
            other.dtype()
        )));
    }
    let sizes: Vec<usize> = arrays.iter().map(Array::size).collect();
    let total: usize = sizes.iter().sum();
    let largest = sizes.iter().copied().max().unwrap_or(0);
    let blocks = largest
        .div_ceil(THREADS as usize)
        .clamp(1, MAX_BLOCKS_PER_INPUT as usize);
    let kernel = kernel_for(&sizes, pack_width(dtype) as usize, weight.is_some())?;
    let total = i32::try_from(total)
        .map_err(|_| Error::Layout(format!("cannot pack {total} values: over 2^31")))?;
    let partials = [blocks as i32 * arrays.len() as i32];
    let mut inputs = arrays.to_vec();
    if let Some(weight) = weight {
        inputs.push(weight.as_dtype(Dtype::Float32)?.reshape(&[1])?);
    }
    let mut out = kernel.launch(
        &inputs,
        &Launch {
            outputs: &[(&[total], dtype), (&partials, Dtype::Float32)],
            grid: (blocks as i32 * THREADS, arrays.len() as i32, 1),
            block: (THREADS, 1, 1),
            template: &[TemplateArg::Type("T", dtype)],
        },
    )?;
    let partials = out.pop().expect("the kernel has two outputs");
    Ok((out.remove(0), partials.sum(false)?))
}

/// The kernel for inputs of `sizes` of which `lanes` values fill 16 bytes, made on first use.
fn kernel_for(sizes: &[usize], lanes: usize, weighted: bool) -> Result<Rc<Kernel>> {
    let body = source(sizes, lanes, weighted);
    if let Some(kernel) = KERNELS.with(|kernels| kernels.borrow().get(&body).cloned()) {
        return Ok(kernel);
    }
    let mut inputs: Vec<String> = (0..sizes.len()).map(|index| format!("in{index}")).collect();
    if weighted {
        inputs.push("weight".to_owned());
    }
    let inputs: Vec<&str> = inputs.iter().map(String::as_str).collect();
    let kernel = Rc::new(Kernel::new(
        "lmx_pack",
        (&inputs, Inputs::RowContiguous),
        &["out", "squares"],
        "",
        &body,
    )?);
    KERNELS.with(|kernels| kernels.borrow_mut().insert(body, kernel.clone()));
    Ok(kernel)
}

/// Bytes a vectorised load or store moves.
const VECTOR_BYTES: usize = 16;

/// The kernel's body: a case per input, copying it with a grid-sized stride (each value times
/// `weight[0]`, a float32, when `weighted`) and adding the squares of what it writes; then each
/// block's sum of squares, through its warps, into `squares[block]`. `lanes` values fill a
/// vector; an input whose size and offset are whole vectors is copied by vectors where its
/// address allows.
fn source(sizes: &[usize], lanes: usize, weighted: bool) -> String {
    let mut body = String::from(
        "  const size_t first = size_t(blockIdx.x) * blockDim.x + threadIdx.x;\n  \
         const size_t stride = size_t(gridDim.x) * blockDim.x;\n  \
         float sum = 0.f;\n",
    );
    if weighted {
        body.push_str("  const float weight_value = weight[0];\n");
    }
    body.push_str("  switch (blockIdx.y) {\n");
    let weigh = |value: &str| {
        if weighted {
            format!("static_cast<T>(static_cast<float>({value}) * weight_value)")
        } else {
            value.to_owned()
        }
    };
    let mut offset = 0;
    for (index, size) in sizes.iter().enumerate() {
        let scalar = format!(
            "for (size_t i = first; i < {size}; i += stride) {{\n      \
             const T value = {read};\n      \
             out[{offset} + i] = value;\n      \
             sum += static_cast<float>(value) * static_cast<float>(value);\n    }}",
            read = weigh(&format!("in{index}[i]")),
        );
        if lanes > 1 && size % lanes == 0 && offset % lanes == 0 {
            let vectors = size / lanes;
            let _ = writeln!(
                body,
                "  case {index}:\n    \
                 if ((reinterpret_cast<size_t>(in{index}) % {VECTOR_BYTES}) == 0) {{\n      \
                 const uint4* from = reinterpret_cast<const uint4*>(in{index});\n      \
                 uint4* to = reinterpret_cast<uint4*>(out + {offset});\n      \
                 for (size_t i = first; i < {vectors}; i += stride) {{\n        \
                 uint4 vector = from[i];\n        \
                 T* values = reinterpret_cast<T*>(&vector);\n        \
                 #pragma unroll\n        \
                 for (int j = 0; j < {lanes}; ++j) {{\n          \
                 {weighed}const float value = static_cast<float>(values[j]);\n          \
                 sum += value * value;\n        }}\n        \
                 to[i] = vector;\n      }}\n    \
                 }} else {{\n    {scalar}\n    }}\n    break;",
                weighed = if weighted {
                    format!("values[j] = {};\n          ", weigh("values[j]"))
                } else {
                    String::new()
                },
            );
        } else {
            let _ = writeln!(body, "  case {index}:\n    {scalar}\n    break;");
        }
        offset += size;
    }
    body.push_str(BLOCK_SUM);
    body
}

/// The end of the kernel's body: the block's threads add their sums, each warp by shuffles, then
/// the first warp the warps' sums, in a fixed order.
pub(super) const BLOCK_SUM: &str = r#"  }
  __shared__ float warp_sums[32];
  for (int shift = 16; shift > 0; shift /= 2) {
    sum += __shfl_down_sync(0xffffffff, sum, shift);
  }
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  if (lane == 0) {
    warp_sums[warp] = sum;
  }
  __syncthreads();
  if (warp == 0) {
    sum = lane < blockDim.x / 32 ? warp_sums[lane] : 0.f;
    for (int shift = 16; shift > 0; shift /= 2) {
      sum += __shfl_down_sync(0xffffffff, sum, shift);
    }
    if (lane == 0) {
      squares[size_t(blockIdx.y) * gridDim.x + blockIdx.x] = sum;
    }
  }
"#;

#[cfg(test)]
mod tests {
    use super::*;
    use mlx_rs::ops::indexing::IndexOp;

    /// Inputs that fill whole vectors at vector offsets get the vector path; a size or an
    /// offset off the vector's edge keeps the value-by-value copy (bfloat16: 8 lanes).
    #[test]
    fn only_whole_vectors_at_vector_offsets_are_copied_by_vectors() {
        let body = source(&[16, 5, 8, 24], 8, false);
        let vectorised = |index: usize| {
            let case = format!("case {index}:");
            let start = body.find(&case).expect("every input has a case");
            let rest = &body[start..];
            let end = rest.find("break;").expect("a case ends");
            rest[..end].contains("uint4")
        };
        // 16 at 0 and 24 at 29 (after 5 and 8 values): the second has an odd offset.
        assert_eq!(
            (0..4).map(vectorised).collect::<Vec<_>>(),
            [true, false, false, false]
        );
        assert!(source(&[8, 8], 4, false).contains("j < 4"));
        assert!(!source(&[8, 8], 1, false).contains("uint4"));
        assert!(!source(&[8, 8], 4, false).contains("weight"));
        assert!(source(&[8, 8], 4, true).contains("* weight_value"));
    }

    /// The packed buffer equals the inputs' concatenation (weighed or not) and the sum of
    /// squares its sum in float64, for inputs on and off the vector path: sizes on and off 8
    /// values, an input whose address is off 16 bytes (a slice one value in), float32 and
    /// bfloat16.
    #[test]
    fn packs_like_concatenate_and_sums_the_squares() {
        if !crate::cuda::available() {
            return;
        }
        for dtype in [Dtype::Float32, Dtype::Bfloat16] {
            let whole = mlx_rs::random::normal::<f32>(&[4096 + 1], None, None, None)
                .unwrap()
                .as_dtype(dtype)
                .unwrap();
            let misaligned = whole.index(1..).reshape(&[64, 64]).unwrap();
            let shapes: [&[i32]; 4] = [&[3000], &[7, 13], &[40, 8], &[5]];
            let arrays: Vec<Array> = shapes
                .iter()
                .map(|shape| {
                    mlx_rs::random::normal::<f32>(*shape, None, None, None)
                        .unwrap()
                        .as_dtype(dtype)
                        .unwrap()
                })
                .chain([misaligned])
                .collect();
            let flats: Vec<Array> = arrays.iter().map(|a| a.reshape(&[-1]).unwrap()).collect();
            let whole = mlx_rs::ops::concatenate(&flats, 0).unwrap();
            for weight in [None, Some(0.3f32)] {
                let weight = weight.map(Array::from_f32);
                let (flat, squares) = pack_with_squares(&arrays, dtype, weight.as_ref()).unwrap();
                // Weighed in float32 and rounded once, as MLX multiplies a bfloat16 array by a
                // float32 scalar and casts back.
                let want = match &weight {
                    Some(weight) => whole
                        .as_dtype(Dtype::Float32)
                        .unwrap()
                        .multiply(weight)
                        .unwrap()
                        .as_dtype(dtype)
                        .unwrap(),
                    None => whole.clone(),
                };
                assert_eq!(flat.dtype(), dtype);
                assert!(
                    flat.eq_values(&want).unwrap(),
                    "{dtype:?} weighed {:?}",
                    weight.is_some()
                );
                let values = want.as_dtype(Dtype::Float32).unwrap();
                let want_squares: f64 = values
                    .as_slice::<f32>()
                    .iter()
                    .map(|v| f64::from(*v) * f64::from(*v))
                    .sum();
                let got = f64::from(squares.item_exact::<f32>());
                assert!(
                    (got - want_squares).abs() <= 1e-5 * want_squares,
                    "{dtype:?}: {got} against {want_squares}"
                );
            }
        }
    }
}
