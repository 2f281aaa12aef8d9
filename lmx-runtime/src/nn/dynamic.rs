//! Updates at a position given as an array, for traced functions that must not depend on it
//! (mlx-rs wraps only MLX's static-offset `slice_update`; mlx-c has the dynamic form).

use crate::error::{Error, Result};
use mlx_rs::error::Exception;
use mlx_rs::{Array, Stream};

/// `src` with `update` written at `start` along `axis` (`src[.., start : start + n, ..] =
/// update` for `update`'s length `n` there), `start` an int32 scalar that may be a traced input.
/// `update` has `src`'s rank and, on every other axis, its size.
///
/// An update one slot long (a decoded token's keys) is a scatter at `start` broadcast over the
/// update: one kernel on MLX's CUDA backend, where its dynamic slice update launches two (the
/// offset's, then a strided copy), per buffer and layer of every decoded token.
pub fn slice_update_dynamic(
    src: &Array,
    update: &Array,
    start: &Array,
    axis: i32,
) -> Result<Array> {
    let rank = update.ndim() as i32;
    let along = if axis < 0 { axis + rank } else { axis };
    if (0..rank).contains(&along) && update.dim(along) == 1 {
        let places = start
            .as_dtype(mlx_rs::Dtype::Int32)?
            .reshape(&vec![1; update.ndim()])?;
        let places = mlx_rs::ops::broadcast_to(&places, update.shape())?;
        return Ok(src.put_along_axis(&places, update, along)?);
    }
    let stream = Stream::thread_local_or_default();
    let start = start.reshape(&[1])?;
    // SAFETY: every handle is live for the call; mlx-c writes a new array into `result` on
    // success, which `from_ptr` then owns, and frees nothing it was given.
    unsafe {
        let mut result = mlx_sys::mlx_array_new();
        let status = mlx_sys::mlx_slice_update_dynamic(
            &mut result,
            src.as_ptr(),
            update.as_ptr(),
            start.as_ptr(),
            [axis].as_ptr(),
            1,
            stream.as_ptr(),
        );
        if status != 0 {
            mlx_sys::mlx_array_free(result);
            return Err(Error::Mlx(Exception::custom(format!(
                "MLX could not write a {:?} update into a {:?} array along axis {axis}",
                update.shape(),
                src.shape()
            ))));
        }
        Ok(Array::from_ptr(result))
    }
}

/// `arrays` as arrays that are evaluated only after `after` (MLX's `depends`): the same buffers,
/// for what an operation of `after` wrote into them in place, which MLX's graph does not see.
pub(crate) fn after(arrays: &[Array], after: &[Array]) -> Result<Vec<Array>> {
    let handles = |arrays: &[Array]| arrays.iter().map(Array::as_ptr).collect::<Vec<_>>();
    let (inputs, dependencies) = (handles(arrays), handles(after));
    // SAFETY: the vectors copy the handles they are given (each array gains a reference) and
    // are freed here; `arrays_of` takes its own references out of the result.
    unsafe {
        let inputs = mlx_sys::mlx_vector_array_new_data(inputs.as_ptr(), inputs.len());
        let dependencies =
            mlx_sys::mlx_vector_array_new_data(dependencies.as_ptr(), dependencies.len());
        let mut output = mlx_sys::mlx_vector_array_new();
        let status = mlx_sys::mlx_depends(&mut output, inputs, dependencies);
        mlx_sys::mlx_vector_array_free(inputs);
        mlx_sys::mlx_vector_array_free(dependencies);
        let result = match status {
            0 => super::custom_vjp::arrays_of(output),
            _ => Err(Error::Mlx(Exception::custom(
                "MLX could not order arrays after others",
            ))),
        };
        mlx_sys::mlx_vector_array_free(output);
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mlx_rs::ops::indexing::TryIndexMutOp;

    /// The update lands where the array offset says, as a static slice update puts it.
    #[test]
    fn writes_at_the_offset_the_array_holds() -> Result<()> {
        let src = mlx_rs::ops::zeros::<f32>(&[1, 2, 6, 3])?;
        let update = mlx_rs::ops::ones::<f32>(&[1, 2, 2, 3])?;
        let written = slice_update_dynamic(&src, &update, &Array::from_int(3), 2)?;
        let per_slot = written.sum_axes(&[0, 1, 3], false)?;
        assert_eq!(per_slot.as_slice::<f32>(), [0.0, 0.0, 0.0, 6.0, 6.0, 0.0]);
        Ok(())
    }

    /// A one-slot update (the scatter) lands at the offset the array holds, its values in place,
    /// along a negative axis too, and inside a compiled function whose offset is an input.
    #[test]
    fn a_one_slot_update_lands_at_the_offset() -> Result<()> {
        let src = mlx_rs::ops::zeros::<f32>(&[1, 2, 6, 3])?;
        let update = Array::from_iter(1..=6, &[1, 2, 1, 3]).as_dtype(mlx_rs::Dtype::Float32)?;
        let expected = |slot: i32| -> Result<Array> {
            let mut want = src.clone();
            want.try_index_mut((.., .., slot..slot + 1, ..), &update)?;
            Ok(want)
        };
        for (slot, axis) in [(0, 2), (4, 2), (5, -2)] {
            let written = slice_update_dynamic(&src, &update, &Array::from_int(slot), axis)?;
            assert!(written.eq_values(expected(slot)?)?, "slot {slot}");
        }
        let mut traced = mlx_rs::transforms::compile::compile(
            |inputs: &[Array]| -> std::result::Result<Vec<Array>, Exception> {
                slice_update_dynamic(&inputs[0], &inputs[1], &inputs[2], 2)
                    .map(|written| vec![written])
                    .map_err(|err| Exception::custom(err.to_string()))
            },
            false,
        );
        for slot in [1, 3] {
            let written = traced(&[src.clone(), update.clone(), Array::from_int(slot)])
                .map_err(Error::Mlx)?;
            assert!(written[0].eq_values(expected(slot)?)?, "traced {slot}");
        }
        Ok(())
    }
}
