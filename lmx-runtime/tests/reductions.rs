//! Column sums and the layer norm's gradient against float64 references computed here, on the
//! default device: MLX's ops on the CPU, lmx's own kernels on MLX's CUDA backend (`tests/gpu.sh`).

mod support;

use lmx_runtime::nn::{self, LayerNormParams};
use lmx_runtime::{cuda, Array};
use mlx_rs::error::Exception;
use mlx_rs::transforms::value_and_grad_with_argnums;
use mlx_rs::Dtype;
use support::{normal, values};

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
    // Rows and columns that no block or warp size divides; rows that the kernels read a value
    // at a time (70 columns) or 16 bytes at a time (72, 96, 8); more rows than the kernel's
    // largest grid of row blocks covers evenly (70,000: its last blocks get none); a three-axis
    // input, summed over its first two.
    for (shape, dtype) in [
        (vec![1000, 70], Dtype::Float32),
        (vec![1000, 72], Dtype::Float32),
        (vec![1000, 70], Dtype::Bfloat16),
        (vec![4, 1000, 70], Dtype::Bfloat16),
        (vec![16384, 96], Dtype::Bfloat16),
        (vec![70_000, 8], Dtype::Float32),
        (vec![70_000, 8], Dtype::Bfloat16),
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

/// `[dx, dw, db]` of `sum(layer_norm(x) * g)` in float64, row by row.
fn layer_norm_gradients(x: &Array, w: &Array, g: &Array, eps: f64) -> [Vec<f64>; 3] {
    let columns = w.shape()[0] as usize;
    let (x, w, g) = (values(x), values(w), values(g));
    let mut dx = vec![0.0; x.len()];
    let (mut dw, mut db) = (vec![0.0; columns], vec![0.0; columns]);
    for row in 0..x.len() / columns {
        let range = row * columns..(row + 1) * columns;
        let (xr, gr) = (&x[range.clone()], &g[range.clone()]);
        let mean = xr.iter().sum::<f64>() / columns as f64;
        let var = xr.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / columns as f64;
        let rstd = 1.0 / (var + eps).sqrt();
        let xhat: Vec<f64> = xr.iter().map(|v| (v - mean) * rstd).collect();
        let gw: Vec<f64> = gr.iter().zip(&w).map(|(g, w)| g * w).collect();
        let mean_gw = gw.iter().sum::<f64>() / columns as f64;
        let mean_gw_xhat = gw.iter().zip(&xhat).map(|(a, b)| a * b).sum::<f64>() / columns as f64;
        for c in 0..columns {
            dx[range.start + c] = rstd * (gw[c] - mean_gw - xhat[c] * mean_gw_xhat);
            dw[c] += gr[c] * xhat[c];
            db[c] += gr[c];
        }
    }
    [dx, dw, db]
}

#[test]
fn the_layer_norm_gradient_matches_a_float64_reference() {
    // On the CPU this checks MLX's own gradient in float32; on CUDA, lmx's kernel in float32,
    // bfloat16 and float16, whose scale and shift gradients it sums in float32 (MLX's own sums
    // them in the half precision).
    let dtypes: &[Dtype] = if cuda::available() {
        &[Dtype::Float32, Dtype::Bfloat16, Dtype::Float16]
    } else {
        &[Dtype::Float32]
    };
    let eps = 1e-5f32;
    for &dtype in dtypes {
        for (shape, with_bias) in [
            (vec![1000, 70], true),
            (vec![1000, 70], false),
            (vec![3, 333, 768], true),
            (vec![4096, 64], false),
            (vec![8, 1024], true),
        ] {
            let columns = *shape.last().unwrap();
            let x = normal(&shape, 1, Dtype::Float32)
                .multiply(Array::from_f32(3.0))
                .unwrap()
                .add(Array::from_f32(0.5))
                .unwrap()
                .as_dtype(dtype)
                .unwrap();
            let w = normal(&[columns], 2, Dtype::Float32)
                .multiply(Array::from_f32(0.2))
                .unwrap()
                .add(Array::from_f32(1.0))
                .unwrap()
                .as_dtype(dtype)
                .unwrap();
            let b = normal(&[columns], 3, dtype);
            let g = normal(&shape, 4, dtype);
            let objective = |args: &[Array]| -> Result<Vec<Array>, Exception> {
                let params = LayerNormParams {
                    weight: args[2].clone(),
                    bias: args.get(3).cloned(),
                };
                let y = nn::layer_norm(&params, &args[1], eps).map_err(|e| e.into_exception())?;
                Ok(vec![y
                    .as_dtype(Dtype::Float32)?
                    .multiply(args[0].as_dtype(Dtype::Float32)?)?
                    .sum(false)?])
            };
            let mut args = vec![g.clone(), x.clone(), w.clone()];
            let mut argnums = vec![1, 2];
            if with_bias {
                args.push(b);
                argnums.push(3);
            }
            let (_, grads) = value_and_grad_with_argnums(objective, &argnums)(&args).unwrap();
            assert_eq!(grads.len(), argnums.len());
            let expected = layer_norm_gradients(&x, &w, &g, eps as f64);
            for (name, (got, want)) in ["dx", "dw", "db"].iter().zip(grads.iter().zip(&expected)) {
                assert_eq!(got.dtype(), dtype, "{name}");
                let error = relative_error(got, want);
                assert!(
                    error < bound(dtype),
                    "{name} of {shape:?} in {dtype:?} (bias: {with_bias}): relative error {error}"
                );
            }
        }
    }
}
