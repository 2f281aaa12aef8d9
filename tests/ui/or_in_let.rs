include!("../support/mlp.rs");

#[lmx::step]
fn loss(params: &Mlp<Tensor>, x: &Tensor, config: &Config) -> Result<Tensor> {
    let loss = mlp(params, x)?.mean()?;
    let skip = looks_diverged(&loss) || !config.check;
    let _ = skip;
    Ok(loss)
}
