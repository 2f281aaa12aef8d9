include!("../support/mlp.rs");

#[lmx::step]
fn loss(params: &Mlp<Tensor>, x: &Tensor) -> Result<Tensor> {
    let loss = mlp(params, x)?.mean()?;
    let value = loss.item::<f32>();
    println!("loss {}", value);
    Ok(loss)
}
