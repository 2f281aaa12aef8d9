//! Gathered sparse experts (`nn::switch_glu`) against a dense reference that runs every expert
//! on every token and masks the unchosen ones, in values and in gradients, on both of its paths
//! (rows sorted by expert, and not); and the balancing loss's gradient (`nn::balance`) against
//! MLX's own differentiation of the loss.

use lmx_runtime::error::Error;
use lmx_runtime::nn;
use mlx_rs::error::Exception;
use mlx_rs::transforms::value_and_grad_with_argnums;
use mlx_rs::{random, Array, Dtype};

const EXPERTS: i32 = 4;
const D: i32 = 8;
const HIDDEN: i32 = 12;
const D_OUT: i32 = 6;

fn normal(shape: &[i32], key: u64) -> Array {
    random::normal::<f32>(shape, None, None, &random::key(key).unwrap()).unwrap()
}

/// `k` distinct experts per token of `[.., EXPERTS]` random scores, as a router chooses them.
fn choices(lead: &[i32], k: i32, key: u64) -> Array {
    let mut shape = lead.to_vec();
    shape.push(EXPERTS);
    nn::top_k(&normal(&shape, key), k).unwrap().1
}

/// Every expert's SwiGLU on every token, the unchosen ones masked out: `[.., k, D_OUT]`.
fn dense(
    x: &Array,
    idx: &Array,
    gate: &Array,
    up: &Array,
    down: &Array,
) -> lmx_runtime::Result<Array> {
    let mut y: Option<Array> = None;
    for e in 0..EXPERTS {
        let pick = |w: &Array| w.take_axis(Array::from_int(e), 0);
        let h = nn::silu(&x.matmul(pick(gate)?.t())?)?.multiply(x.matmul(pick(up)?.t())?)?;
        // [.., D_OUT] for every token, broadcast over its k choices and masked.
        let out = h.matmul(pick(down)?.t())?.expand_dims(-2)?;
        let mask = idx
            .eq(&Array::from_int(e).as_dtype(idx.dtype())?)?
            .as_dtype(Dtype::Float32)?
            .expand_dims(-1)?;
        let term = out.multiply(&mask)?;
        y = Some(match y {
            Some(y) => y.add(&term)?,
            None => term,
        });
    }
    Ok(y.expect("at least one expert"))
}

type Layer = fn(&Array, &Array, &Array, &Array, &Array) -> lmx_runtime::Result<Array>;

/// The layer's output and the gradients of `sum(y * r)` in `x`, `gate`, `up` and `down`.
fn value_and_grads(layer: Layer, inputs: &[Array], idx: &Array, r: &Array) -> Vec<Array> {
    let (idx, r) = (idx.clone(), r.clone());
    let objective = move |a: &[Array]| -> Result<Vec<Array>, Exception> {
        let y = layer(&a[0], &idx, &a[1], &a[2], &a[3]).map_err(Error::into_exception)?;
        Ok(vec![y.multiply(&r)?.sum(false)?, y])
    };
    let (values, grads) = value_and_grad_with_argnums(objective, &[0, 1, 2, 3])(inputs).unwrap();
    let mut out = vec![values[1].clone()];
    out.extend(grads);
    out
}

fn max_difference(a: &Array, b: &Array) -> f32 {
    assert_eq!(a.shape(), b.shape());
    let d = a.subtract(b).unwrap().abs().unwrap().max(false).unwrap();
    d.item_exact::<f32>()
}

/// The sparse layer equals the dense reference on `lead` tokens with `k` choices each.
fn sparse_equals_dense(lead: &[i32], k: i32) {
    let mut x_shape = lead.to_vec();
    x_shape.push(D);
    let inputs = [
        normal(&x_shape, 1),
        normal(&[EXPERTS, HIDDEN, D], 2),
        normal(&[EXPERTS, HIDDEN, D], 3),
        normal(&[EXPERTS, D_OUT, HIDDEN], 4),
    ];
    let idx = choices(lead, k, 5);
    let mut out_shape = lead.to_vec();
    out_shape.extend([k, D_OUT]);
    let r = normal(&out_shape, 6);
    let sparse = value_and_grads(nn::switch_glu, &inputs, &idx, &r);
    let reference = value_and_grads(dense, &inputs, &idx, &r);
    assert_eq!(sparse[0].shape(), &out_shape[..]);
    for (i, what) in ["output", "dx", "d gate", "d up", "d down"]
        .iter()
        .enumerate()
    {
        let scale = reference[i]
            .abs()
            .unwrap()
            .max(false)
            .unwrap()
            .item_exact::<f32>();
        let error = max_difference(&sparse[i], &reference[i]);
        assert!(
            error <= 1e-5 * scale.max(1.0),
            "{what} with {lead:?} tokens, top {k}: differs by {error} (scale {scale})"
        );
    }
}

#[test]
fn few_tokens_gathered_in_place_equal_the_masked_dense_experts() {
    // 3 x 2 = 6 rows: below `SORT_FROM`, the rows are gathered unsorted.
    const { assert!(6 < nn::SORT_FROM) };
    sparse_equals_dense(&[1, 3], 2);
}

#[test]
fn many_tokens_sorted_by_expert_equal_the_masked_dense_experts() {
    // 2 x 40 x 2 = 160 rows: sorted by expert, then put back in order.
    const { assert!(160 >= nn::SORT_FROM) };
    sparse_equals_dense(&[2, 40], 2);
    sparse_equals_dense(&[2, 40], 1);
}

#[test]
fn balance_is_the_identity_whose_gradient_adds_the_balancing_loss() {
    let probs = nn::softmax(&normal(&[2, 5, EXPERTS], 7), -1).unwrap();
    let idx = nn::top_k(&probs, 2).unwrap().1;
    let y = normal(&[2, 5, D], 8);
    let r = normal(&[2, 5, D], 9);
    let coef = 0.25;

    let (i, rr) = (idx.clone(), r.clone());
    let objective = move |a: &[Array]| -> Result<Vec<Array>, Exception> {
        let out = nn::balance(&a[0], &a[1], &i, coef).map_err(Error::into_exception)?;
        Ok(vec![out.multiply(&rr)?.sum(false)?, out])
    };
    let (values, grads) =
        value_and_grad_with_argnums(objective, &[0, 1])(&[y.clone(), probs.clone()]).unwrap();
    assert_eq!(max_difference(&values[1], &y), 0.0, "the output is y");
    assert_eq!(max_difference(&grads[0], &r), 0.0, "dy passes through");

    // MLX's own gradient of the loss, which is linear in the mean probabilities.
    let i = idx.clone();
    let loss = move |a: &[Array]| -> Result<Vec<Array>, Exception> {
        Ok(vec![
            nn::balance_loss(&a[0], &i).map_err(Error::into_exception)?
        ])
    };
    let (_, reference) =
        value_and_grad_with_argnums(loss, &[0])(std::slice::from_ref(&probs)).unwrap();
    let expected = reference[0].multiply(Array::from_f32(coef)).unwrap();
    assert!(max_difference(&grads[1], &expected) <= 1e-7);
    assert!(
        expected
            .abs()
            .unwrap()
            .max(false)
            .unwrap()
            .item_exact::<f32>()
            > 0.0
    );
}

#[test]
fn balancing_loss_is_the_switch_transformers_by_hand() {
    // Two tokens, three experts, one choice each: token 0 picks expert 1, token 1 expert 1.
    let probs = Array::from_slice(&[0.2f32, 0.7, 0.1, 0.3, 0.6, 0.1], &[2, 3]);
    let idx = Array::from_slice(&[1i32, 1], &[2, 1]);
    // f = [0, 1, 0]; P = [0.25, 0.65, 0.1]; loss = 3 * (1 * 0.65) = 1.95.
    let loss = nn::balance_loss(&probs, &idx).unwrap().item_exact::<f32>();
    assert!((loss - 1.95).abs() < 1e-6, "{loss}");
    // Balanced: each expert once out of three tokens, any probabilities averaging 1/3: 1.
    let probs = Array::from_slice(&[1.0f32 / 3.0; 9], &[3, 3]);
    let idx = Array::from_slice(&[0i32, 1, 2], &[3, 1]);
    let loss = nn::balance_loss(&probs, &idx).unwrap().item_exact::<f32>();
    assert!((loss - 1.0).abs() < 1e-6, "{loss}");
}

#[test]
fn a_compiled_step_differentiates_the_gathered_experts_and_the_balancing_loss() {
    // Scores, choices, experts and the balancing term in one compiled gradient, as a training
    // step traces them.
    let objective = |a: &[Array]| -> Result<Vec<Array>, Exception> {
        let (x, router, gate, up, down) = (&a[0], &a[1], &a[2], &a[3], &a[4]);
        let inner = || -> lmx_runtime::Result<Array> {
            let probs = nn::softmax(&x.matmul(router.t())?, -1)?;
            let (top, idx) = nn::top_k(&probs, 2)?;
            let y = nn::switch_glu(x, &idx, gate, up, down)?;
            let y = y.multiply(top.expand_dims(-1)?)?.sum_axis(-2, false)?;
            Ok(nn::balance(&y, &probs, &idx, 0.1)?.square()?.sum(false)?)
        };
        Ok(vec![inner().map_err(Error::into_exception)?])
    };
    let inputs = [
        normal(&[2, 40, D], 11),
        normal(&[EXPERTS, D], 12),
        normal(&[EXPERTS, HIDDEN, D], 13),
        normal(&[EXPERTS, HIDDEN, D], 14),
        normal(&[EXPERTS, D, HIDDEN], 15),
    ];
    let eager = value_and_grad_with_argnums(objective, &[0, 1, 2, 3, 4])(&inputs).unwrap();
    let mut step = mlx_rs::transforms::compile::compile(
        move |a: &[Array]| -> Result<Vec<Array>, Exception> {
            let (values, grads) = value_and_grad_with_argnums(objective, &[0, 1, 2, 3, 4])(a)?;
            Ok(values.into_iter().chain(grads).collect())
        },
        None,
    );
    let compiled = step(&inputs).unwrap();
    assert_eq!(max_difference(&compiled[0], &eager.0[0]), 0.0);
    for (c, e) in compiled[1..].iter().zip(&eager.1) {
        assert!(max_difference(c, e) <= 1e-5);
    }
}

#[test]
fn routing_by_hand_picks_the_top_two_and_weighs_them_renormalised() {
    // Three experts of one hidden unit over two features. Expert e's gate sees 10 (x0 + x1),
    // its up projection (e + 1) x0, its down projection 0.01 * [1, -1]: for x = [s, s] the
    // hidden unit is silu(20 s) (e + 1) s, about 20 s^2 (e + 1), and the output
    // 0.2 s^2 (e + 1) [1, -1].
    let gate = Array::from_slice(&[10.0f32, 10.0, 10.0, 10.0, 10.0, 10.0], &[3, 1, 2]);
    let up = Array::from_slice(&[1.0f32, 0.0, 2.0, 0.0, 3.0, 0.0], &[3, 1, 2]);
    let down = Array::from_slice(&[0.01f32, -0.01, 0.01, -0.01, 0.01, -0.01], &[3, 2, 1]);
    let x = Array::from_slice(&[1.0f32, 1.0, 2.0, 2.0], &[1, 2, 2]);
    // Token 0 prefers experts 1 and 2 (0.6, 0.3: weights 2/3, 1/3); token 1 experts 0 and 2
    // (0.5, 0.3: weights 5/8, 3/8).
    let probs = Array::from_slice(&[0.1f32, 0.6, 0.3, 0.5, 0.2, 0.3], &[1, 2, 3]);
    let (top, idx) = nn::top_k(&probs, 2).unwrap();
    let mut chosen: Vec<Vec<i32>> = idx
        .as_dtype(Dtype::Int32)
        .unwrap()
        .contiguous()
        .unwrap()
        .as_slice::<i32>()
        .chunks(2)
        .map(|c| c.to_vec())
        .collect();
    chosen.iter_mut().for_each(|c| c.sort());
    assert_eq!(chosen, vec![vec![1, 2], vec![0, 2]]);
    let weights = top.divide(top.sum_axis(-1, true).unwrap()).unwrap();
    let y = nn::switch_glu(&x, &idx, &gate, &up, &down).unwrap();
    assert_eq!(y.shape(), &[1, 2, 2, 2]);
    let y = y
        .multiply(weights.expand_dims(-1).unwrap())
        .unwrap()
        .sum_axis(-2, false)
        .unwrap()
        .contiguous()
        .unwrap();
    // Token 0: 2/3 * 0.4 + 1/3 * 0.6; token 1 (s = 2): 5/8 * 0.8 + 3/8 * 2.4.
    let expected = [0.466_666_7f32, -0.466_666_7, 1.4, -1.4];
    for (got, want) in y.as_slice::<f32>().iter().zip(expected) {
        assert!((got - want).abs() < 1e-5, "{:?}", y.as_slice::<f32>());
    }
}
