//! lmx's quantization against Python MLX's and against its own bound: the packed weights, scales
//! and biases equal `mx.quantize` of the same tensors (fixture `tests/fixtures/quantize_mlx.
//! safetensors`, by `tests/reference/quantized.py`) for every supported bits and group size;
//! dequantized values lie within half a quantization step (`scale / 2`) of the originals; a
//! quantized linear layer and embedding compute what their dequantized weights compute; and bad
//! settings or tensors are typed errors naming the layer.

use lmx_runtime::mlx_rs::{ops, Array, Dtype};
use lmx_runtime::nn::{self, EmbeddingParams, LinearParams};
use lmx_runtime::quant::{self, QuantError, Quantization, BITS, GROUP_SIZES};
use lmx_runtime::{Error, Result};
use std::collections::HashMap;
use std::path::PathBuf;

fn fixture() -> HashMap<String, Array> {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/quantize_mlx.safetensors");
    Array::load_safetensors(&path).unwrap_or_else(|err| panic!("{}: {err}", path.display()))
}

fn bits_of(a: &Array) -> Vec<u32> {
    match a.dtype() {
        Dtype::Uint32 => a.as_slice::<u32>().to_vec(),
        _ => a
            .as_dtype(Dtype::Float32)
            .unwrap()
            .as_slice::<f32>()
            .iter()
            .map(|v| v.to_bits())
            .collect(),
    }
}

#[test]
fn quantized_weights_equal_mlx_python_for_every_bits_and_group_size() -> Result<()> {
    let fixture = fixture();
    let mut checked = 0;
    for (prefix, input) in [("", "w"), ("bf16_", "w_bf16")] {
        let w = &fixture[input];
        for bits in BITS {
            for group_size in GROUP_SIZES {
                let key = format!("{prefix}{bits}_{group_size}");
                let (q, s, b) =
                    quant::quantize_weight(&key, w, Quantization::new(group_size, bits)?)?;
                for (part, ours) in [("weight", &q), ("scales", &s), ("biases", &b)] {
                    let theirs = &fixture[&format!("{key}.{part}")];
                    assert_eq!(ours.dtype(), theirs.dtype(), "{key}.{part}");
                    assert_eq!(ours.shape(), theirs.shape(), "{key}.{part}");
                    assert_eq!(bits_of(ours), bits_of(theirs), "{key}.{part}: bit for bit");
                }
                checked += 1;
            }
        }
    }
    assert_eq!(checked, 2 * 6 * 3);
    Ok(())
}

/// MLX's bound, as its own test states it (`errors <= |scales| + eps`): one step of the stored
/// scale, not half. MLX makes the group's extreme of larger magnitude exact (the offset) and
/// rounds the step so that zero is on the grid; the grid may then stop short of the other
/// extreme, whose values are clamped (up to 0.995 of a step at 2 bits on this fixture). Values
/// the grid spans round to the nearest point: within half a step.
#[test]
fn dequantized_values_lie_within_mlx_bound_and_half_a_step_inside_the_grid() -> Result<()> {
    let w = &fixture()["w"];
    let [rows, cols] = [w.shape()[0], w.shape()[1]];
    for bits in BITS {
        for group_size in GROUP_SIZES {
            let q = Quantization::new(group_size, bits)?;
            let (packed, scales, biases) = quant::quantize_weight("w", w, q)?;
            let back = ops::dequantize(&packed, &scales, &biases, group_size, bits)?;
            let grouped = |a: &Array| a.reshape(&[rows, cols / group_size, group_size]);
            let (w, back) = (grouped(w)?, grouped(&back)?);
            let error = ops::abs(&ops::subtract(&back, &w)?)?;
            let step = ops::expand_dims(&ops::abs(&scales)?, -1)?;
            let eps = Array::from_f32(1e-6);
            let beyond_mlx = ops::subtract(&error, &ops::add(&step, &eps)?)?;
            let worst = beyond_mlx.max(None)?.item_exact::<f32>();
            assert!(
                worst <= 0.0,
                "{bits} bits, groups of {group_size}: {worst} beyond a step"
            );
            // The grid's span: offset .. offset + (2^bits - 1) * scale, in either direction.
            let last = ops::add(
                &biases,
                &scales.multiply(Array::from_f32(((1 << bits) - 1) as f32))?,
            )?;
            let lo = ops::expand_dims(&ops::minimum(&biases, &last)?, -1)?;
            let hi = ops::expand_dims(&ops::maximum(&biases, &last)?, -1)?;
            let inside = w.ge(&lo)?.logical_and(&w.le(&hi)?)?;
            let half = ops::add(&step.multiply(Array::from_f32(0.5))?, &eps)?;
            let beyond_half = ops::subtract(&error, &half)?;
            let worst = ops::select(&inside, &beyond_half, Array::from_f32(-1.0))?
                .max(None)?
                .item_exact::<f32>();
            assert!(
                worst <= 0.0,
                "{bits} bits, groups of {group_size}: {worst} beyond half a step inside the grid"
            );
            assert!(
                error.mean(None)?.item_exact::<f32>() > 0.0,
                "{bits} bits must lose something"
            );
        }
    }
    Ok(())
}

fn random(shape: &[i32], seed: u64) -> Result<Array> {
    let key = lmx_runtime::mlx_rs::random::key(seed)?;
    Ok(lmx_runtime::mlx_rs::random::normal::<f32>(
        shape, None, None, &key,
    )?)
}

fn max_abs_diff(a: &Array, b: &Array) -> f32 {
    ops::abs(ops::subtract(a, b).unwrap())
        .unwrap()
        .max(None)
        .unwrap()
        .item_exact::<f32>()
}

#[test]
fn quantized_layers_compute_what_their_dequantized_weights_compute() -> Result<()> {
    let q = Quantization::new(32, 4)?;
    let x = random(&[2, 3, 64], 1)?;
    let weight = random(&[48, 64], 2)?;
    let bias = random(&[48], 3)?;
    let mut layers = vec![LinearParams::new(weight, Some(bias.clone()))];
    let report = quant::quantize_tree(&mut layers, q)?;
    assert_eq!(report.quantized, ["0"]);
    let l = &layers[0];
    let dense = ops::dequantize(
        &l.weight,
        l.scales.as_ref().unwrap(),
        l.biases.as_ref().unwrap(),
        32,
        4,
    )?;
    let want = ops::add(&ops::matmul(&x, &dense.transpose()?)?, &bias)?;
    let got = nn::linear(l, &x)?;
    assert!(
        max_abs_diff(&got, &want) <= 1e-4,
        "linear: {}",
        max_abs_diff(&got, &want)
    );

    let mut table = vec![EmbeddingParams::new(random(&[40, 64], 4)?)];
    quant::quantize_tree(&mut table, q)?;
    let e = &table[0];
    let dense = ops::dequantize(
        &e.weight,
        e.scales.as_ref().unwrap(),
        e.biases.as_ref().unwrap(),
        32,
        4,
    )?;
    let ids = Array::from_slice(&[0_i32, 7, 39, 7], &[2, 2]);
    let rows = nn::embedding(e, &ids)?;
    assert_eq!(rows.shape(), &[2, 2, 64]);
    assert_eq!(
        max_abs_diff(&rows, &dense.take_axis(&ids, 0)?),
        0.0,
        "embedding rows"
    );
    let head = nn::embedding_as_linear(e, &x)?;
    let want = ops::matmul(&x, &dense.transpose()?)?;
    assert!(
        max_abs_diff(&head, &want) <= 1e-4,
        "tied head: {}",
        max_abs_diff(&head, &want)
    );

    // Dequantizing gives back the same dense weights and a plain layer.
    quant::dequantize_tree(&mut table)?;
    assert!(table[0].scales.is_none() && table[0].quantization.is_none());
    assert_eq!(max_abs_diff(&table[0].weight, &dense), 0.0);
    Ok(())
}

#[test]
fn layers_whose_rows_do_not_divide_into_groups_stay_dense() -> Result<()> {
    let mut layers = vec![
        LinearParams::new(random(&[8, 64], 1)?, None),
        LinearParams::new(random(&[8, 96], 2)?, None),
    ];
    let report = quant::quantize_tree(&mut layers, Quantization::new(64, 8)?)?;
    assert_eq!(report.quantized, ["0"]);
    assert_eq!(report.skipped, ["1"]);
    assert_eq!(layers[0].weight.dtype(), Dtype::Uint32);
    assert_eq!(layers[0].weight.shape(), &[8, 16]);
    assert_eq!(layers[1].weight.dtype(), Dtype::Float32);
    assert_eq!(quant::logical_parameter_count(&layers), 8 * 64 + 8 * 96);
    assert_eq!(
        quant::tree_bytes(&layers),
        8 * 16 * 4 + 2 * 8 * 4 + 8 * 96 * 4
    );
    Ok(())
}

#[test]
fn unsupported_settings_and_wrong_tensors_are_typed_errors_naming_the_layer() -> Result<()> {
    assert_eq!(Quantization::new(64, 7), Err(QuantError::Bits { bits: 7 }));
    assert_eq!(
        Quantization::new(48, 4),
        Err(QuantError::GroupSize { group_size: 48 })
    );
    let err = Quantization::new(16, 4).unwrap_err().to_string();
    assert_eq!(
        err,
        "a group size of 16 is not supported: it must be 32, 64 or 128"
    );

    let w = random(&[4, 96], 0)?;
    match quant::quantize_weight(
        "model.layers.0.mlp.down_proj",
        &w,
        Quantization::new(64, 4)?,
    ) {
        Err(Error::Quantization(err)) => assert_eq!(
            err.to_string(),
            "model.layers.0.mlp.down_proj: its rows of 96 values do not divide into groups of 64"
        ),
        other => panic!("expected an indivisible-rows error, got {other:?}"),
    }

    let q = Quantization::new(32, 4)?;
    let mut layers = vec![LinearParams::new(random(&[8, 64], 1)?, None)];
    quant::quantize_tree(&mut layers, q)?;
    quant::check_tree(&layers)?;
    layers[0].scales = Some(ops::zeros::<f32>(&[8, 4])?);
    match quant::check_tree(&layers) {
        Err(Error::Quantization(err)) => assert_eq!(
            err.to_string(),
            "0.scales has shape [8, 4]; 4-bit groups of 32 need [8, 2]"
        ),
        other => panic!("expected a shape error, got {other:?}"),
    }
    Ok(())
}

#[test]
fn a_refused_layer_leaves_the_whole_tree_as_it_was() -> Result<()> {
    let mut layers = vec![
        LinearParams::new(random(&[8, 64], 1)?, None),
        LinearParams::new(Array::zeros::<i32>(&[8, 64])?, None),
    ];
    let before = layers.clone();
    match quant::quantize_tree(&mut layers, Quantization::new(64, 4)?) {
        Err(Error::Quantization(err)) => assert_eq!(
            err.to_string(),
            "1: its weight is Int32; only floating-point weights quantize"
        ),
        other => panic!("expected a dtype error, got {other:?}"),
    }
    assert!(layers[0].quantization.is_none());
    assert!(layers[0].weight.eq_values(&before[0].weight)?);
    Ok(())
}
