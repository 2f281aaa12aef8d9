//! Updates at a position given as an array, for traced functions that must not depend on it
//! (mlx-rs wraps only MLX's static-offset `slice_update`; mlx-c has the dynamic form).

use crate::error::{Error, Result};
use mlx_rs::error::Exception;
use mlx_rs::{Array, Stream};

/// `src` with `update` written at `start` along `axis` (`src[.., start : start + n, ..] =
/// update` for `update`'s length `n` there), `start` an int32 scalar that may be a traced input.
/// `update` has `src`'s rank and, on every other axis, its size.
pub fn slice_update_dynamic(
    src: &Array,
    update: &Array,
    start: &Array,
    axis: i32,
) -> Result<Array> {
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
