//! A test's check that two forms of one function (padded and unpadded) agree in value and in
//! every gradient.

use crate::error::{Error, Result};
use mlx_rs::random;
use mlx_rs::transforms::value_and_grad_with_argnums as value_and_grad;
use mlx_rs::Array;

/// Asserts that `plain` and `other`, over random normal arguments of `shapes`, give the same
/// output and the same gradients in every argument (through `sum(f(args) * r)` for a random `r`
/// of the output's shape, so that every output is weighed differently), within `tolerance`.
pub(crate) fn assert_same_values_and_gradients(
    shapes: &[&[i32]],
    plain: fn(&[Array]) -> Result<Array>,
    other: fn(&[Array]) -> Result<Array>,
    tolerance: f64,
) {
    let normal = |shape: &[i32], seed: u64| {
        random::normal::<f32>(shape, None, None, &random::key(seed).unwrap()).unwrap()
    };
    let args: Vec<Array> = (0..)
        .zip(shapes)
        .map(|(seed, shape)| normal(shape, seed))
        .collect();
    let output = plain(&args).unwrap();
    let r = normal(output.shape(), 99);
    let argnums: Vec<i32> = (0..args.len() as i32).collect();
    let run = |f: fn(&[Array]) -> Result<Array>| {
        let r = r.clone();
        let objective = move |args: &[Array]| {
            let y = f(args).map_err(Error::into_exception)?;
            Ok(vec![y.multiply(&r)?.sum(false)?])
        };
        value_and_grad(objective, &argnums)(&args).unwrap()
    };
    let ((value, grads), (other_value, other_grads)) = (run(plain), run(other));
    let close = |a: &Array, b: &Array| {
        a.shape() == b.shape() && a.all_close(b, tolerance, tolerance, None).unwrap()
    };
    assert!(close(&value[0], &other_value[0]));
    for (plain, other) in grads.iter().zip(&other_grads) {
        assert!(close(plain, other), "{plain:?} against {other:?}");
    }
}
