//! Mixtral's sparse experts against its dense reference (`experts = dense`: every expert on
//! every token, the unchosen ones weighted 0): the same logits and the same gradients for every
//! parameter, at the `tiny` preset, with enough tokens that the gathered rows are sorted by
//! expert.

use lmx::models::mixtral::{self, Experts, Mixtral};
use lmx::runtime::mlx_rs::transforms::value_and_grad_with_argnums;
use lmx::runtime::mlx_rs::{error::Exception, random};
use lmx::runtime::model::{Context, LanguageModel, TrainingStep};
use lmx::runtime::tree;
use lmx::runtime::{Array, Error, Result};

fn max_difference(a: &Array, b: &Array) -> f32 {
    assert_eq!(a.shape(), b.shape());
    a.subtract(b)
        .unwrap()
        .abs()
        .unwrap()
        .max(false)
        .unwrap()
        .item_exact::<f32>()
}

/// The loss and the gradient of every parameter, in tree order, with `experts`.
fn loss_and_grads(
    params: &<Mixtral as LanguageModel>::Params,
    experts: Experts,
    batch: &[Array],
) -> Vec<Array> {
    let mut config = Mixtral::preset("tiny").unwrap();
    config.experts = experts;
    let template = params.clone();
    let batch = batch.to_vec();
    let loss = move |leaves: &[Array]| -> std::result::Result<Vec<Array>, Exception> {
        let params = tree::rebuild(&template, leaves.to_vec()).map_err(Error::into_exception)?;
        let loss =
            mixtral::Train::loss(&params, &config, &batch, None).map_err(Error::into_exception)?;
        Ok(vec![loss])
    };
    let leaves = tree::flatten(params);
    let every: Vec<i32> = (0..leaves.len() as i32).collect();
    let (values, grads) = value_and_grad_with_argnums(loss, &every)(&leaves).unwrap();
    values.into_iter().chain(grads).collect()
}

#[test]
fn sparse_experts_equal_the_dense_reference_in_logits_and_gradients() -> Result<()> {
    let sparse = Mixtral::preset("tiny").unwrap();
    assert_eq!(sparse.experts, Experts::Sparse, "the default is sparse");
    let mut dense = sparse.clone();
    dense.experts = Experts::Dense;
    let params = Mixtral::init(&sparse, 3)?;
    // 4 x 16 tokens, 2 experts each: 128 gathered rows, sorted by expert.
    let key = random::key(7)?;
    let tokens = random::randint::<_, i32>(0, 256, &[4, 16], &key)?;
    let targets = random::randint::<_, i32>(0, 256, &[4, 16], &random::key(8)?)?;
    let logits = |config| Mixtral::forward(&params, config, &tokens, &mut Context::evaluation());
    let (a, b) = (logits(&sparse)?, logits(&dense)?);
    let scale = b.abs()?.max(false)?.item_exact::<f32>();
    assert!(max_difference(&a, &b) <= 1e-5 * scale, "logits differ");

    let batch = [tokens, targets];
    let s = loss_and_grads(&params, Experts::Sparse, &batch);
    let d = loss_and_grads(&params, Experts::Dense, &batch);
    let names = tree::names(&params);
    assert_eq!(s.len(), names.len() + 1);
    for (i, (x, y)) in s.iter().zip(&d).enumerate() {
        let what = if i == 0 { "the loss" } else { &names[i - 1] };
        let scale = y.abs()?.max(false)?.item_exact::<f32>().max(1e-3);
        let error = max_difference(x, y);
        assert!(
            error <= 1e-4 * scale,
            "{what}: differs by {error} (scale {scale})"
        );
    }
    // Every expert's weights get a gradient: the routing reaches them all.
    let expert_grads = names
        .iter()
        .zip(&s[1..])
        .filter(|(n, _)| n.contains("switch_mlp"));
    for (name, g) in expert_grads {
        let per_expert = g.abs()?.sum_axes(&[1, 2], false)?;
        let least = per_expert.min(false)?.item_exact::<f32>();
        assert!(least > 0.0, "{name}: an expert got no gradient");
    }
    Ok(())
}
