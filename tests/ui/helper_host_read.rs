include!("../support/mlp.rs");

// Helpers outside any step, which the step's own check does not see: the type has no way to the
// host, whatever the control flow around the read (a plain read, an early `return`, `?`, a
// closure).
fn peek(loss: &Tensor) -> f32 {
    loss.clone().into_array().item_exact::<f32>()
}

fn clipped(loss: Tensor) -> Result<Tensor> {
    if loss.clone().into_array().item_exact::<f32>() > 10.0 {
        return Ok(Tensor::scalar(10.0));
    }
    Ok(loss)
}

fn finite(loss: &Tensor) -> Result<bool> {
    let value = loss.clone().into_array().abs()?.item_exact::<f32>();
    Ok(value.is_finite())
}

fn mean_on_host(losses: &[Tensor]) -> f32 {
    let read = |t: &Tensor| t.clone().into_array().item_exact::<f32>();
    losses.iter().map(read).sum::<f32>() / losses.len() as f32
}

#[lmx::step]
fn loss(params: &Mlp<Tensor>, x: &Tensor) -> Result<Tensor> {
    let loss = mlp(params, x)?.mean()?;
    let _ = (peek(&loss), finite(&loss)?, mean_on_host(&[loss.clone()]));
    clipped(loss)
}
