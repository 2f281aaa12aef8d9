include!("../support/mlp.rs");

#[lmx::step]
fn loss(params: &Mlp<Tensor>, x: &Tensor, config: &Config) -> Result<Tensor> {
    let loss = mlp(params, x)?.mean()?;
    if config.check && looks_diverged(&loss) {
        return loss.negative();
    }
    Ok(loss)
}
