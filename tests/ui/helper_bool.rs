include!("../support/mlp.rs");

#[lmx::step]
fn loss(params: &Mlp<Tensor>, x: &Tensor) -> Result<Tensor> {
    let loss = mlp(params, x)?.mean()?;
    if looks_diverged(&loss) {
        return loss.negative();
    }
    Ok(loss)
}
