//! Arrays the host makes, copied to where a CUDA device's kernels read them fast.
//!
//! MLX's CUDA allocator keeps every array the host makes, and every array of at most 8 bytes, in
//! memory the host reaches: managed memory, or pinned host memory where the device has no
//! concurrent managed access (the GPU machines lmx is measured on). A kernel's read of it then
//! crosses PCIe: a microsecond or more of latency on the path of all that follows, and a
//! fraction of the device's bandwidth for a weight read whole. A traced decode step's position
//! is such an array, read by every layer's attention, and so is every tensor read from a file.
//! A copy made by a device operation, into an array of more than 8 bytes, is in device memory
//! (docs/benchmarks.md, "Sixth session of 2026-11-29").

use crate::cuda;
use crate::error::Result;
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::ops::{broadcast_to, concatenate_flat, zeros_dtype};
use mlx_rs::Array;

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

/// `x` copied, bit for bit, by a device operation into an array of more than 8 bytes, and a
/// view of the copy (a slice and a reshape share its buffer; an index would gather into a new
/// array as small as `x`).
fn device_copy(x: &Array) -> Result<Array> {
    if x.nbytes() <= SCALAR_POOL_BYTES {
        // One copy kernel: `x` broadcast to four rows, made contiguous; its first row.
        let mut rows = vec![4];
        rows.extend_from_slice(x.shape());
        let copy = broadcast_to(x, &rows)?.contiguous()?;
        return Ok(copy.index(0..1).reshape(x.shape())?);
    }
    // Four rows of a weight would be four times its memory: `x` and one more element instead.
    let copy = concatenate_flat(&[x.clone(), zeros_dtype(&[1], x.dtype())?])?;
    Ok(copy.index(0..x.size() as i32).reshape(x.shape())?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::bf16;

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
