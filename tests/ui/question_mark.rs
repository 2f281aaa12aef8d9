include!("../support/mlp.rs");

#[lmx::step]
fn loss(params: &Mlp<Tensor>, x: &Tensor) -> Result<Tensor> {
    let loss = mlp(params, x)?.mean()?;
    let finite: bool = loss.is_finite()?.try_into()?;
    let _ = finite;
    Ok(loss)
}
