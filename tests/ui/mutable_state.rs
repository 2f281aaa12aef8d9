include!("../support/mlp.rs");

// lmxlab's bug: the optimizer's moments updated outside the compiled state.
#[lmx::step(optimizer = lmx::runtime::optim::AdamW)]
fn train(params: &Mlp<Tensor>, moments: &mut Mlp<Option<lmx::runtime::optim::AdamLeaf>>, x: &Tensor) -> Result<Tensor> {
    let _ = moments;
    mlp(params, x)?.mean()
}
