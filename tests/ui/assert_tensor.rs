include!("../support/mlp.rs");

#[lmx::step]
fn loss(params: &Mlp<Tensor>, x: &Tensor) -> Result<Tensor> {
    assert!(x.ndim() == 2, "a batch of vectors");
    let loss = mlp(params, x)?.mean()?;
    debug_assert!(!looks_diverged(&loss));
    Ok(loss)
}
