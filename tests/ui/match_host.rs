include!("../support/mlp.rs");

#[lmx::step]
fn loss(params: &Mlp<Tensor>, x: &Tensor) -> Result<Tensor> {
    let h = mlp(params, x)?;
    match h.mean()?.item::<f32>() as i32 {
        0 => h.sum(),
        _ => h.mean(),
    }
}
