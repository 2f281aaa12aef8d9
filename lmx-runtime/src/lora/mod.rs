//! Low-rank adapters (LoRA, Hu et al., 2021, and DoRA, Liu et al., 2024) as mlx-lm makes, saves
//! and fuses them: attached to chosen linear layers and stacked experts of any parameter tree
//! ([`attach`]), saved apart from the base in mlx-lm's adapter layout ([`save_adapters`],
//! [`load_adapters`]), and fused into the base weights ([`fuse`]). While a tree holds adapters
//! only they train (`tree::specs`).

mod attach;
mod files;
mod fuse;

pub(crate) use attach::{adapt, check};
pub use attach::{attach, blocks, FineTuneType, LoraParameters};
pub use files::{
    load_adapters, read_config, save_adapters, AdapterConfig, ADAPTERS_FILE, CONFIG_FILE,
};
pub use fuse::fuse;

#[cfg(test)]
mod tests {
    use crate::error::Error;
    use crate::nn::{linear, LinearParams, LoraSettings};
    use mlx_rs::error::Exception;
    use mlx_rs::transforms::value_and_grad_with_argnums;
    use mlx_rs::{random, Array};

    /// `sum(linear(x) * r)` of a linear layer whose adapter is `a`, `b`.
    fn objective(
        base: &LinearParams,
        x: &Array,
        r: &Array,
        a: &Array,
        b: &Array,
    ) -> Result<Array, Exception> {
        let params = LinearParams {
            lora_a: Some(a.clone()),
            lora_b: Some(b.clone()),
            lora: Some(LoraSettings {
                scale: 2.5,
                dropout: 0.0,
            }),
            ..base.clone()
        };
        let y = linear(&params, x).map_err(Error::into_exception)?;
        y.multiply(r)?.sum(false)
    }

    /// The adapter's gradients, which `nn::linear`'s low-rank term gives MLX to differentiate,
    /// against central finite differences (exact up to rounding: the objective is linear in
    /// each of `a` and `b`).
    #[test]
    fn adapter_gradients_match_finite_differences() -> crate::Result<()> {
        let normal = |shape: &[i32], seed: u64| -> crate::Result<Array> {
            Ok(random::normal::<f32>(
                shape,
                None,
                None,
                &random::key(seed)?,
            )?)
        };
        let (input, output, rank) = (5, 3, 2);
        let base = LinearParams::new(normal(&[output, input], 1)?, Some(normal(&[output], 2)?));
        let x = normal(&[2, 4, input], 3)?;
        let r = normal(&[2, 4, output], 4)?;
        let a = normal(&[input, rank], 5)?;
        let b = normal(&[rank, output], 6)?;
        let (b0, x0, r0) = (base.clone(), x.clone(), r.clone());
        let f = move |args: &[Array]| -> Result<Vec<Array>, Exception> {
            Ok(vec![objective(&b0, &x0, &r0, &args[0], &args[1])?])
        };
        let (_, grads) = value_and_grad_with_argnums(f, &[0, 1])(&[a.clone(), b.clone()])?;
        let step = 1e-2_f32;
        for (which, (param, grad)) in [(&a, &grads[0]), (&b, &grads[1])].into_iter().enumerate() {
            let values = param.as_slice::<f32>().to_vec();
            let grad = grad.as_slice::<f32>().to_vec();
            for index in 0..values.len() {
                let nudged = |delta: f32| -> crate::Result<f32> {
                    let mut moved = values.clone();
                    moved[index] += delta;
                    let moved = Array::from_slice(&moved, param.shape());
                    let (a, b) = if which == 0 {
                        (&moved, &b)
                    } else {
                        (&a, &moved)
                    };
                    Ok(objective(&base, &x, &r, a, b)?.item_exact::<f32>())
                };
                let numeric = (nudged(step)? - nudged(-step)?) / (2.0 * step);
                assert!(
                    (numeric - grad[index]).abs() <= 1e-3 * numeric.abs().max(1.0),
                    "{} [{index}]: gradient {}, finite difference {numeric}",
                    ["lora_a", "lora_b"][which],
                    grad[index]
                );
            }
        }
        Ok(())
    }
}
