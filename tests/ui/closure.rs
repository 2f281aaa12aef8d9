include!("../support/mlp.rs");

#[lmx::step]
fn loss(params: &Mlp<Tensor>, x: &Tensor) -> Result<Tensor> {
    let h = mlp(params, x)?;
    let norm = h.square()?.sum()?;
    let clip = |g: Tensor| if norm > 1.0 { g.divide(&norm) } else { Ok(g) };
    clip(h)?.mean()
}
