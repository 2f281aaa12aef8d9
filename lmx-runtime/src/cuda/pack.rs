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

use super::kernel::{Inputs, Kernel, Launch, TemplateArg};
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
pub(crate) fn pack_with_squares(arrays: &[Array], dtype: Dtype) -> Result<(Array, Array)> {
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
    let kernel = kernel_for(&sizes)?;
    let total = i32::try_from(total)
        .map_err(|_| Error::Layout(format!("cannot pack {total} values: over 2^31")))?;
    let partials = [blocks as i32 * arrays.len() as i32];
    let mut out = kernel.launch(
        arrays,
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

/// The kernel for inputs of `sizes`, made on first use.
fn kernel_for(sizes: &[usize]) -> Result<Rc<Kernel>> {
    let body = source(sizes);
    if let Some(kernel) = KERNELS.with(|kernels| kernels.borrow().get(&body).cloned()) {
        return Ok(kernel);
    }
    let inputs: Vec<String> = (0..sizes.len()).map(|index| format!("in{index}")).collect();
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

/// The kernel's body: a case per input, copying it with a grid-sized stride and adding the
/// squares; then each block's sum of squares, through its warps, into `squares[block]`.
fn source(sizes: &[usize]) -> String {
    let mut body = String::from(
        "  const size_t first = size_t(blockIdx.x) * blockDim.x + threadIdx.x;\n  \
         const size_t stride = size_t(gridDim.x) * blockDim.x;\n  \
         float sum = 0.f;\n  \
         switch (blockIdx.y) {\n",
    );
    let mut offset = 0;
    for (index, size) in sizes.iter().enumerate() {
        let _ = writeln!(
            body,
            "  case {index}:\n    for (size_t i = first; i < {size}; i += stride) {{\n      \
             const T value = in{index}[i];\n      \
             out[{offset} + i] = value;\n      \
             sum += static_cast<float>(value) * static_cast<float>(value);\n    }}\n    break;"
        );
        offset += size;
    }
    body.push_str(BLOCK_SUM);
    body
}

/// The end of the kernel's body: the block's threads add their sums, each warp by shuffles, then
/// the first warp the warps' sums, in a fixed order.
const BLOCK_SUM: &str = r#"  }
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
