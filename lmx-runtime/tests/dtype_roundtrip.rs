//! Arrays of every stored dtype survive a safetensors round trip bit for bit, and a dtype that
//! differs from the model's is named in the error.

use half::{bf16, f16};
use lmx_runtime::checkpoint::{load_tree, save_tree};
use lmx_runtime::nn::LinearParams;
use lmx_runtime::{Error, Result};
use mlx_rs::{Array, Dtype};

fn round_trip(tree: &Vec<LinearParams>) -> Result<Vec<LinearParams>> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tree.safetensors");
    save_tree(&path, tree)?;
    load_tree(&path, tree)
}

#[test]
fn half_precision_values_round_trip_exactly() -> Result<()> {
    // Exactly representable: small integers, powers of two, and each format's extremes.
    let halves = [
        0.0,
        -0.0,
        1.0,
        -2.5,
        0.099_975_586,
        65504.0,
        -6.103_515_6e-5,
        1023.5,
    ];
    let f16s: Vec<f16> = halves.iter().map(|&v| f16::from_f32(v)).collect();
    let brains = [
        0.0,
        1.0,
        -2.5,
        0.099_609_375,
        3.389_531_4e38,
        -1.175_494_4e-38,
        256.0,
        7.0,
    ];
    let bf16s: Vec<bf16> = brains.iter().map(|&v| bf16::from_f32(v)).collect();
    for (value, back) in f16s.iter().zip(halves) {
        assert_eq!(value.to_f32(), back, "the test's float16 values are exact");
    }
    for (value, back) in bf16s.iter().zip(brains) {
        assert_eq!(value.to_f32(), back, "the test's bfloat16 values are exact");
    }
    let tree = vec![LinearParams::new(
        Array::from_slice(&f16s, &[2, 4]),
        Some(Array::from_slice(&bf16s, &[8])),
    )];
    let back = round_trip(&tree)?;
    assert_eq!(back[0].weight.dtype(), Dtype::Float16);
    assert_eq!(back[0].weight.shape(), &[2, 4]);
    let bits = |values: &[f16]| values.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(back[0].weight.as_slice::<f16>()), bits(&f16s));
    let bias = back[0].bias.as_ref().unwrap();
    assert_eq!(bias.dtype(), Dtype::Bfloat16);
    let bits = |values: &[bf16]| values.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(bias.as_slice::<bf16>()), bits(&bf16s));
    Ok(())
}

#[test]
fn float32_and_integer_values_round_trip_exactly() -> Result<()> {
    let floats = [f32::MIN_POSITIVE, -0.0, 1.0 / 3.0, f32::MAX, -1.5e-42, 0.1];
    let ints = [i32::MIN, -1, 0, 1, i32::MAX, 12345];
    let uints = [0, 1, u32::MAX, 0x8000_0000, 42, 7];
    let tree = vec![
        LinearParams::new(
            Array::from_slice(&floats, &[3, 2]),
            Some(Array::from_slice(&ints, &[6])),
        ),
        LinearParams::new(Array::from_slice(&uints, &[1, 2, 3]), None),
    ];
    let back = round_trip(&tree)?;
    let bits: Vec<u32> = back[0]
        .weight
        .as_slice::<f32>()
        .iter()
        .map(|v| v.to_bits())
        .collect();
    assert_eq!(bits, floats.iter().map(|v| v.to_bits()).collect::<Vec<_>>());
    assert_eq!(back[0].bias.as_ref().unwrap().as_slice::<i32>(), ints);
    assert_eq!(back[1].weight.as_slice::<u32>(), uints);
    assert_eq!(back[1].weight.shape(), &[1, 2, 3]);
    assert!(back[1].bias.is_none());
    Ok(())
}

#[test]
fn scalars_and_transposed_views_round_trip() -> Result<()> {
    let matrix = Array::from_slice(&[1.0_f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]);
    let transposed = matrix.transpose()?;
    let tree = vec![LinearParams::new(transposed, Some(Array::from_f32(2.5)))];
    let back = round_trip(&tree)?;
    assert_eq!(back[0].weight.shape(), &[3, 2]);
    assert_eq!(
        back[0].weight.as_slice::<f32>(),
        [1.0, 4.0, 2.0, 5.0, 3.0, 6.0]
    );
    let scalar = back[0].bias.as_ref().unwrap();
    assert_eq!(scalar.shape(), &[] as &[i32]);
    assert_eq!(scalar.item_exact::<f32>(), 2.5);
    Ok(())
}

#[test]
fn a_dtype_mismatch_names_the_tensor_and_both_dtypes() -> Result<()> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tree.safetensors");
    let weight = Array::from_slice(&[1.0_f32, 2.0], &[1, 2]);
    save_tree(&path, &vec![LinearParams::new(weight.clone(), None)])?;
    let template = vec![LinearParams::new(weight.as_dtype(Dtype::Bfloat16)?, None)];
    match load_tree(&path, &template) {
        Err(Error::Checkpoint { path: at, message }) => {
            assert_eq!(at, path);
            assert_eq!(
                message,
                "0.weight: checkpoint has float32, model expects bfloat16"
            );
        }
        other => panic!("expected a dtype mismatch, got {:?}", other.map(|_| ())),
    }
    Ok(())
}

#[test]
fn unsupported_dtypes_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tree.safetensors");
    let tree = vec![LinearParams::new(
        Array::from_slice(&[1_i64, 2], &[2]),
        None,
    )];
    let err = save_tree(&path, &tree).unwrap_err().to_string();
    assert!(err.contains("0.weight") && err.contains("Int64"), "{err}");
    assert!(!path.exists());
}
