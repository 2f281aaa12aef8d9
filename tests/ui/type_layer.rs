// Outside any step, the type still has no way to the host: no comparison, no `item`.
use lmx::runtime::tensor::Tensor;

fn too_big(loss: &Tensor) -> bool {
    loss.item::<f32>() > 10.0
}

fn is_negative(loss: &Tensor) -> bool {
    *loss < Tensor::scalar(0.0)
}

fn main() {
    let _ = (too_big, is_negative);
}
