include!("../support/mlp.rs");

#[lmx::step]
fn loss(params: &Mlp<Tensor>, x: &Tensor) -> Result<Tensor> {
    let mut h = mlp(params, x)?;
    let mut norm = h.square()?.sum()?.sqrt()?;
    while norm > 1.0 {
        h = h.multiply(&Tensor::scalar(0.5))?;
        norm = h.square()?.sum()?.sqrt()?;
    }
    h.mean()
}
