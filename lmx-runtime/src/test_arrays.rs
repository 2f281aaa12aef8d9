//! Arrays for unit tests.

use mlx_rs::{Array, Dtype};

/// Standard normal values of `shape`, drawn in float32 and rounded to `dtype`.
pub(crate) fn normal(shape: &[i32], dtype: Dtype) -> Array {
    mlx_rs::random::normal::<f32>(shape, None, None, None)
        .and_then(|a| a.as_dtype(dtype))
        .expect("a normal draw of a valid shape")
}
