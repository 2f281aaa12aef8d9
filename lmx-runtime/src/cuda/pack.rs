//! One kernel that copies many arrays, one after another, into a flat buffer.
//!
//! MLX's `concatenate` launches one copy per input on CUDA; for a model's gradients that is a
//! launch per parameter, and at small sizes a step's time is its launches. This kernel reads
//! every input in one launch: block row `k` of the grid copies input `k` to its place. Its source
//! names the inputs' sizes and places, so it is made once for each layout (a model's gradients
//! have one) and kept for the thread's lifetime.

use super::kernel::{Kernel, Launch, TemplateArg};
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
/// array must have that dtype).
pub(crate) fn pack(arrays: &[Array], dtype: Dtype) -> Result<Array> {
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
    let mut out = kernel.launch(
        arrays,
        &Launch {
            outputs: &[(&[total], dtype)],
            grid: (blocks as i32 * THREADS, arrays.len() as i32, 1),
            block: (THREADS, 1, 1),
            template: &[TemplateArg::Type("T", dtype)],
        },
    )?;
    Ok(out.remove(0))
}

/// The kernel for inputs of `sizes`, made on first use.
fn kernel_for(sizes: &[usize]) -> Result<Rc<Kernel>> {
    let body = source(sizes);
    if let Some(kernel) = KERNELS.with(|kernels| kernels.borrow().get(&body).cloned()) {
        return Ok(kernel);
    }
    let inputs: Vec<String> = (0..sizes.len()).map(|index| format!("in{index}")).collect();
    let inputs: Vec<&str> = inputs.iter().map(String::as_str).collect();
    let kernel = Rc::new(Kernel::new("lmx_pack", &inputs, &["out"], "", &body)?);
    KERNELS.with(|kernels| kernels.borrow_mut().insert(body, kernel.clone()));
    Ok(kernel)
}

/// The kernel's body: a case per input, copying it with a grid-sized stride.
fn source(sizes: &[usize]) -> String {
    let mut body = String::from(
        "  const size_t first = size_t(blockIdx.x) * blockDim.x + threadIdx.x;\n  \
         const size_t stride = size_t(gridDim.x) * blockDim.x;\n  \
         switch (blockIdx.y) {\n",
    );
    let mut offset = 0;
    for (index, size) in sizes.iter().enumerate() {
        let _ = writeln!(
            body,
            "  case {index}:\n    for (size_t i = first; i < {size}; i += stride) {{\n      \
             out[{offset} + i] = in{index}[i];\n    }}\n    break;"
        );
        offset += size;
    }
    body.push_str("  }\n");
    body
}
