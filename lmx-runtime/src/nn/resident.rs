//! Arrays the host makes, copied into device memory where a CUDA device's kernels read them.
//!
//! MLX's CUDA allocator keeps every array the host makes, and every array of at most 8 bytes
//! (its pool of scalars), in memory the host reaches: managed memory, or pinned host memory where
//! the device has no concurrent managed access (the GPU machines lmx is measured on), which a
//! kernel reads across PCIe. A traced decode step's position is such an array, read by every
//! layer's attention, and so are a rotation's rates and every tensor read from a file. A copy
//! made by a device operation into an array of more than 8 bytes gets device memory, unless
//! MLX's buffer cache hands it a freed host buffer of the same size: the cache reuses buffers by
//! size alone, so a loader clears it once the host-made sources are freed
//! ([`release_host_buffers`]). Measured in docs/benchmarks.md, "Sixth session of 2026-11-29".

use crate::cuda;
use crate::error::Result;
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::ops::{broadcast_to, concatenate_flat, zeros_dtype};
use mlx_rs::transforms::eval;
use mlx_rs::Array;
use std::cell::RefCell;
use std::collections::HashMap;

/// The most bytes of an array MLX's CUDA allocator keeps in its pool of scalars.
const SCALAR_POOL_BYTES: usize = 8;

/// `x` (a position, a loaded weight), as an array in device memory on a CUDA device; `x` itself
/// elsewhere. Unevaluated: the copy runs with whatever evaluates it.
pub(crate) fn device_resident(x: &Array) -> Result<Array> {
    if cuda::available() {
        device_copy(x)
    } else {
        Ok(x.clone())
    }
}

thread_local! {
    /// [`device_constant`]'s arrays, by their values' bits.
    static CONSTANTS: RefCell<HashMap<Vec<u32>, Array>> = RefCell::new(HashMap::new());
}

/// `values` (a rotation's rates) as a float32 array that every kernel reading it finds in device
/// memory on a CUDA device: made once per thread for each distinct `values` and evaluated then,
/// even inside a trace, so that a compiled step captures it as a constant (unevaluated, the copy
/// would be an operation of every call).
pub(crate) fn device_constant(values: &[f32]) -> Result<Array> {
    constant(values, device_resident)
}

/// Frees MLX's cached buffers on a CUDA device, once host-made arrays (a file's tensors, copied
/// into device memory) are freed: the cache would otherwise hand their host buffers to later
/// device allocations of their sizes.
pub(crate) fn release_host_buffers() -> Result<()> {
    if cuda::available() {
        mlx_rs::memory::clear_cache()?;
    }
    Ok(())
}

/// [`device_constant`] with the copy given (the tests give [`device_copy`], which the CPU runs).
/// Inside a primitive's gradient MLX keeps every array's graph, so a constant first made there
/// would be copied again by every replay: the rates are first made by the forward pass.
fn constant(values: &[f32], resident: fn(&Array) -> Result<Array>) -> Result<Array> {
    let key: Vec<u32> = values.iter().map(|value| value.to_bits()).collect();
    if let Some(array) = CONSTANTS.with(|constants| constants.borrow().get(&key).cloned()) {
        return Ok(array);
    }
    let array = resident(&Array::from_slice(values, &[values.len() as i32]))?;
    // Made from no traced input, the array is no tracer: MLX evaluates it inside a trace.
    eval([&array])?;
    CONSTANTS.with(|constants| constants.borrow_mut().insert(key, array.clone()));
    Ok(array)
}

/// `x` copied, bit for bit, by a device operation into an array of more than 8 bytes, and a
/// view of the copy (a slice and a reshape share its buffer; an index would gather into a new
/// array as small as `x`).
fn device_copy(x: &Array) -> Result<Array> {
    if x.nbytes() <= SCALAR_POOL_BYTES {
        // One copy kernel: `x` broadcast to rows of more than 8 bytes in all, made contiguous;
        // its first row.
        let mut rows = vec![(SCALAR_POOL_BYTES / x.nbytes().max(1) + 1) as i32];
        rows.extend_from_slice(x.shape());
        let copy = broadcast_to(x, &rows)?.contiguous()?;
        return Ok(copy.index(0..1).reshape(x.shape())?);
    }
    // Rows of a weight would be that many copies of it: `x` and one more element instead.
    let copy = concatenate_flat(&[x.clone(), zeros_dtype(&[1], x.dtype())?])?;
    Ok(copy.index(0..x.size() as i32).reshape(x.shape())?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::bf16;
    use mlx_rs::transforms::compile::compile;

    /// The rates' device copy, made and evaluated inside a compiled function's trace (MLX
    /// allows it: the copy is no tracer): the trace and its replays compute with its values, and
    /// it is kept for the next trace.
    #[test]
    fn a_constant_made_inside_a_trace_serves_its_replays() -> Result<()> {
        let values = [0.5f32, 0.25, 0.125, 1.0 / 3.0];
        let scaled =
            move |inputs: &[Array]| -> std::result::Result<Vec<Array>, mlx_rs::error::Exception> {
                let rates = constant(&values, device_copy).map_err(crate::Error::into_exception)?;
                Ok(vec![inputs[0].multiply(&rates)?])
            };
        let mut compiled = compile(scaled, false);
        for scale in [2.0f32, -3.0, 7.5] {
            let x = Array::from_slice(&[scale; 4], &[4]);
            let out = compiled(&[x])?.remove(0);
            let expected: Vec<f32> = values.iter().map(|value| value * scale).collect();
            assert_eq!(out.as_slice::<f32>(), expected.as_slice());
        }
        let key: Vec<u32> = values.iter().map(|value| value.to_bits()).collect();
        let made = CONSTANTS.with(|constants| constants.borrow().get(&key).cloned());
        let made = made.expect("the constant is kept");
        assert_eq!(made.as_slice::<f32>(), values.as_slice());
        Ok(())
    }

    #[test]
    fn a_copy_keeps_the_bits_shape_and_dtype() -> Result<()> {
        let floats = [
            f32::NAN,
            -0.0,
            f32::MIN_POSITIVE / 8.0,
            1.5,
            -3.25,
            f32::INFINITY,
        ];
        let cases = [
            Array::from_int(37),
            Array::from_slice(&[3i32, 0], &[2]),
            Array::from_slice(&[3i32, 0, 5], &[3]),
            Array::from_slice(&[7u32, u32::MAX, 0, 1, 2, 3], &[2, 3]),
            Array::from_slice(&floats, &[3, 2]),
            Array::from_slice(&floats.map(bf16::from_f32), &[6]),
            Array::from_slice::<f32>(&[], &[0, 4]),
        ];
        for x in cases {
            let copy = device_copy(&x)?;
            assert_eq!(copy.shape(), x.shape());
            assert_eq!(copy.dtype(), x.dtype());
            // MLX gives no slice of an empty array.
            let bits = |a: &Array| -> Result<Vec<u8>> {
                if a.size() == 0 {
                    return Ok(Vec::new());
                }
                Ok(a.reshape(&[-1])?.view::<u8>()?.as_slice::<u8>().to_vec())
            };
            assert_eq!(bits(&copy)?, bits(&x)?);
        }
        Ok(())
    }
}
