//! Products with a quantized weight over many rows on a GPU: the weight dequantized, then the
//! dense product.
//!
//! MLX's CUDA backend multiplies a quantized weight with its own kernels (`qmm_sm80` for
//! `x @ W.T`, `qmm_naive` for the gradient's `g @ W`), which reach a fraction of what the GPU's
//! dense products do once a product has many rows: a QLoRA step of TinyLlama-1.1B spends most
//! of its time in them. Dequantizing the weight is one pass over it, after which cuBLAS
//! multiplies at full rate. The dense weight is never kept: the gradient dequantizes it again
//! (a custom VJP whose saved inputs are the packed weight's), so a step holds no more than the
//! quantized product did.
//!
//! Decoding a few rows reads the weight once in a matrix-vector product, where the packed
//! weight's smaller reads are the point: on CUDA lmx's own kernel reads the packed rows
//! ([`decode_product`](super::decode_product)); the CPU's and Metal's quantized kernels have no
//! such gap: there `quantized_matmul` stays ([`gpu_rows`](super::gpu_rows)'s rule).

use super::custom_vjp::{self, WithGradient};
use super::decode_product::decode_product;
use super::gpu_rows::many_rows_on_gpu;
use super::{Packed, Quantization};
use crate::error::{Error, Result};
use mlx_rs::{ops, Array};

/// `x @ W.T (+ bias)` for the packed weight `packed`: decoding's few rows through
/// [`decode_product`], dense on a GPU from [`MIN_ROWS`](super::gpu_rows::MIN_ROWS) rows of `x`
/// on, MLX's `quantized_matmul` otherwise (the bias then added).
pub(crate) fn quantized_linear(
    x: &Array,
    packed: &Packed<'_, Array>,
    bias: Option<&Array>,
) -> Result<Array> {
    let biases = bias.map(|b| [b]);
    if let Some(mut y) =
        decode_product(x, &[packed.weight_rows()], biases.as_ref().map(|b| &b[..]))?
    {
        return Ok(y.remove(0));
    }
    let Packed {
        weight: w,
        scales,
        biases,
        quantization: q,
    } = *packed;
    let y = if many_rows_on_gpu(x)? {
        dequantized(x, w, scales, biases, q)?
    } else {
        ops::quantized_matmul(x, w, scales, biases, true, q.group_size, q.bits)?
    };
    Ok(match bias {
        Some(bias) => ops::add(&y, bias)?,
        None => y,
    })
}

/// `x @ dequantize(w).T` through [`Dequantized`]'s gradient.
fn dequantized(
    x: &Array,
    w: &Array,
    scales: &Array,
    biases: &Array,
    q: Quantization,
) -> Result<Array> {
    let inputs = [x.clone(), w.clone(), scales.clone(), biases.clone()];
    custom_vjp::apply(&Dequantized(q), &inputs)?
        .pop()
        .ok_or_else(|| Error::Layout("a dequantized product returned nothing".into()))
}

/// `x @ dequantize(w, scales, biases).T` over `[x, w, scales, biases]`, whose gradient in `x`
/// dequantizes the weight again. The packed weight, as in MLX's `quantized_matmul`, is a
/// constant: its three arrays get zero cotangents (a frozen base is all that quantized layers
/// are trained under).
#[derive(Clone, Copy, Debug, PartialEq)]
struct Dequantized(Quantization);

impl Dequantized {
    fn weight(&self, packed: &[Array]) -> Result<Array> {
        let Quantization { group_size, bits } = self.0;
        match packed {
            [w, scales, biases] => Ok(ops::dequantize(w, scales, biases, group_size, bits)?),
            _ => Err(Error::Layout(format!(
                "a dequantized product takes [x, w, scales, biases], got {} arrays",
                packed.len() + 1
            ))),
        }
    }
}

impl WithGradient for Dequantized {
    const NAME: &'static str = "a dequantized product";

    fn forward(&self, inputs: &[Array]) -> Result<Vec<Array>> {
        let (x, packed) = inputs
            .split_first()
            .ok_or_else(|| Error::Layout("a dequantized product got no input".into()))?;
        let w = self.weight(packed)?;
        Ok(vec![ops::matmul(x, w.t())?])
    }

    fn vjp(&self, primals: &[Array], cotangents: &[Array]) -> Result<Vec<Array>> {
        let (x, packed) = primals
            .split_first()
            .ok_or_else(|| Error::Layout("a dequantized product got no input".into()))?;
        let g = cotangents.first().ok_or_else(|| {
            Error::Layout("a dequantized product's gradient got no cotangent".into())
        })?;
        let dx = ops::matmul(g, self.weight(packed)?)?.as_dtype(x.dtype())?;
        let mut grads = vec![dx];
        for p in packed {
            grads.push(ops::zeros_like(p)?);
        }
        Ok(grads)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mlx_rs::random;
    use mlx_rs::transforms::value_and_grad_with_argnums as value_and_grad;

    type Product = fn(&Array, &Array, &Array, &Array, Quantization) -> Result<Array>;

    /// The dequantized product and its gradient in `x` equal `quantized_matmul`'s, for 4 and 8
    /// bits, on leading axes of any rank.
    #[test]
    fn the_dequantized_product_and_its_gradient_equal_quantized_matmuls() -> Result<()> {
        let normal = |shape: &[i32], seed: u64| {
            random::normal::<f32>(shape, None, None, &random::key(seed).unwrap()).unwrap()
        };
        for (bits, group_size) in [(4, 64), (8, 32)] {
            let q = Quantization { group_size, bits };
            let (w, scales, biases) = ops::quantize(normal(&[24, 128], 1), group_size, bits)?;
            let x = normal(&[2, 3, 128], 2);
            let r = normal(&[2, 3, 24], 3);
            let run = |f: Product| {
                let (w, scales, biases, r) = (w.clone(), scales.clone(), biases.clone(), r.clone());
                let objective = move |args: &[Array]| {
                    let y = f(&args[0], &w, &scales, &biases, q).map_err(Error::into_exception)?;
                    Ok(vec![y.multiply(&r)?.sum(false)?])
                };
                value_and_grad(objective, &[0][..])(std::slice::from_ref(&x)).unwrap()
            };
            let plain: Product = |x, w, s, b, q| {
                Ok(ops::quantized_matmul(
                    x,
                    w,
                    s,
                    b,
                    true,
                    q.group_size,
                    q.bits,
                )?)
            };
            let ((value, grads), (again, regrads)) = (run(plain), run(dequantized));
            assert!(value[0].all_close(&again[0], 1e-4, 1e-4, None)?);
            assert_eq!(grads[0].shape(), regrads[0].shape());
            assert!(
                grads[0].all_close(&regrads[0], 1e-4, 1e-4, None)?,
                "{bits} bits: {:?} against {:?}",
                grads[0],
                regrads[0]
            );
        }
        Ok(())
    }
}
