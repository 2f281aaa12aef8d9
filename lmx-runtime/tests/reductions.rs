//! Column sums against float64 references computed here, on the default device: MLX's ops on the
//! CPU, lmx's own kernels on MLX's CUDA backend (`tests/gpu.sh`).

use lmx_runtime::nn;
use lmx_runtime::Array;
use mlx_rs::{random, Dtype};

/// Normal values of `shape`, rounded to `dtype`.
fn normal(shape: &[i32], seed: u64, dtype: Dtype) -> Array {
    let key = random::key(seed).unwrap();
    random::normal::<f32>(shape, None, None, &key)
        .unwrap()
        .as_dtype(dtype)
        .unwrap()
}

/// The values of `a` as float64, row-major.
fn values(a: &Array) -> Vec<f64> {
    let a = a.as_dtype(Dtype::Float32).unwrap();
    a.as_slice::<f32>().iter().map(|&v| v as f64).collect()
}

/// The largest difference between `got` and `expected`, over the largest `|expected|`.
fn relative_error(got: &Array, expected: &[f64]) -> f64 {
    let got = values(got);
    assert_eq!(got.len(), expected.len());
    let scale = expected.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    let worst = got
        .iter()
        .zip(expected)
        .fold(0.0f64, |m, (g, e)| m.max((g - e).abs()));
    worst / scale
}

/// Float32 sums are rounded once, to the result's precision.
fn bound(dtype: Dtype) -> f64 {
    match dtype {
        Dtype::Float32 => 1e-5,
        _ => 1e-2,
    }
}

#[test]
fn column_sums_accumulate_in_float32_whatever_the_precision() {
    // Rows and columns that no block or warp size divides; a three-axis input is summed over its
    // first two.
    for (shape, dtype) in [
        (vec![1000, 70], Dtype::Float32),
        (vec![1000, 70], Dtype::Bfloat16),
        (vec![4, 1000, 70], Dtype::Bfloat16),
        (vec![16384, 96], Dtype::Bfloat16),
    ] {
        // Shifted away from zero so that the sums are large and rounding in the working
        // precision would show: in bfloat16, adding 1 to a sum above 256 is lost.
        let x = normal(&shape, 7, Dtype::Float32)
            .add(Array::from_f32(1.0))
            .unwrap()
            .as_dtype(dtype)
            .unwrap();
        let columns = *shape.last().unwrap() as usize;
        let mut expected = vec![0.0f64; columns];
        for (i, v) in values(&x).into_iter().enumerate() {
            expected[i % columns] += v;
        }
        let sums = nn::column_sum(&x).unwrap();
        assert_eq!(sums.shape(), [columns as i32]);
        assert_eq!(sums.dtype(), dtype);
        let error = relative_error(&sums, &expected);
        assert!(
            error < bound(dtype),
            "{shape:?} {dtype:?}: relative error {error}"
        );
    }
}
