//! Helpers shared by the runtime's integration tests.

use lmx_runtime::Array;
use mlx_rs::{random, Dtype};

/// Normal values of `shape`, rounded to `dtype`.
pub fn normal(shape: &[i32], seed: u64, dtype: Dtype) -> Array {
    let key = random::key(seed).unwrap();
    random::normal::<f32>(shape, None, None, &key)
        .unwrap()
        .as_dtype(dtype)
        .unwrap()
}

/// The values of `a` as float64, row-major.
pub fn values(a: &Array) -> Vec<f64> {
    let a = a.as_dtype(Dtype::Float32).unwrap();
    a.as_slice::<f32>().iter().map(|&v| v as f64).collect()
}
