//! Linear layers applied to one input (attention's query, key and value projections) as one
//! product.
//!
//! On a GPU a product with few output features, such as a grouped-query attention's key and
//! value projections (256 at TinyLlama's size), leaves most of the GPU idle, in the forward
//! product and in both of its gradient's products. Over one input, the layers' weights
//! concatenated make one wider product whose output is split back, and the gradient of the
//! split is one concatenation. The weights' copy is paid on every call, so the product is fused
//! where it is compute-bound ([`gpu_rows`](super::gpu_rows)'s rule) and one of the layers is
//! narrow. Adapted, quantized or mixed layers are applied one after another, each as
//! [`linear_in`] applies it.

use super::decode_product::decode_products;
use super::gpu_rows::many_rows_on_gpu;
use super::{linear_in, padded_product, LinearParams};
use crate::error::{Error, Result};
use crate::model::Context;
use mlx_rs::{ops, Array};

/// Layers with fewer output features than this make the product worth fusing.
const NARROW: i32 = 1024;

/// `layers` applied to `x`, each output as [`linear_in`] gives it, in order: one product over
/// the concatenated weights where that pays (see the module's documentation).
pub fn linears_in<const N: usize>(
    layers: [&LinearParams; N],
    x: &Array,
    ctx: &mut Context,
) -> Result<[Array; N]> {
    let outputs = if let Some(outputs) = decode_products(&layers, x)? {
        outputs
    } else if fusable(&layers) && many_rows_on_gpu(x)? {
        one_product(&layers, x)?
    } else {
        layers
            .iter()
            .map(|layer| linear_in(layer, x, ctx))
            .collect::<Result<Vec<_>>>()?
    };
    outputs
        .try_into()
        .map_err(|_| Error::Layout(format!("{N} linear layers gave another count of outputs")))
}

/// Whether `layers` can be one product worth fusing: several plain layers (neither quantized
/// nor adapted) of one weight dtype and input width, all with a bias or none, one of them
/// narrow.
fn fusable(layers: &[&LinearParams]) -> bool {
    let [first, rest @ ..] = layers else {
        return false;
    };
    let alike = |layer: &&LinearParams| {
        layer.weight.dtype() == first.weight.dtype()
            && layer.bias.is_some() == first.bias.is_some()
            && layer.weight.shape()[1..] == first.weight.shape()[1..]
    };
    !rest.is_empty()
        && layers.iter().all(|layer| layer.is_plain())
        && rest.iter().all(alike)
        && layers.iter().any(|layer| layer.weight.shape()[0] < NARROW)
}

/// `x` through the concatenation of `layers`' weights (and biases), split back by layer.
fn one_product(layers: &[&LinearParams], x: &Array) -> Result<Vec<Array>> {
    let weights: Vec<&Array> = layers.iter().map(|layer| &layer.weight).collect();
    let biases: Option<Vec<&Array>> = layers.iter().map(|layer| layer.bias.as_ref()).collect();
    let weight = ops::concatenate(&weights, 0)?;
    let bias = biases.map(|b| ops::concatenate(&b, 0)).transpose()?;
    let y = padded_product::linear(x, &weight, bias.as_ref())?;
    split_by_layer(&y, &weights)
}

/// `y`, the output of the product over `weights` concatenated, split back into each weight's
/// output features along its last axis.
fn split_by_layer(y: &Array, weights: &[&Array]) -> Result<Vec<Array>> {
    let ends: Vec<i32> = weights
        .iter()
        .scan(0, |end, w| {
            *end += w.shape()[0];
            Some(*end)
        })
        .collect();
    Ok(y.split_at_indices(&ends[..ends.len().saturating_sub(1)], -1)?)
}

#[cfg(test)]
mod tests {
    use super::super::same_gradients::assert_same_values_and_gradients;
    use super::*;

    fn layers(args: &[Array], bias: bool) -> [LinearParams; 3] {
        let layer =
            |w: usize| LinearParams::new(args[w].clone(), bias.then(|| args[w + 3].clone()));
        [layer(1), layer(2), layer(3)]
    }

    /// The three layers' outputs, flattened one after another.
    fn flat(outputs: Vec<Array>) -> Result<Array> {
        let flat: Vec<Array> = outputs
            .iter()
            .map(|y| y.reshape(&[-1]))
            .collect::<std::result::Result<_, _>>()?;
        Ok(ops::concatenate(&flat, 0)?)
    }

    fn apart(args: &[Array], bias: bool) -> Result<Array> {
        let layers = layers(args, bias);
        flat(
            layers
                .iter()
                .map(|layer| super::super::linear(layer, &args[0]))
                .collect::<Result<_>>()?,
        )
    }

    fn together(args: &[Array], bias: bool) -> Result<Array> {
        let layers = layers(args, bias);
        flat(one_product(&layers.iter().collect::<Vec<_>>(), &args[0])?)
    }

    /// One product over the concatenated weights gives each layer's output, and the gradients in
    /// the input, every weight and every bias, of three layers of 8, 3 and 3 outputs (a query and
    /// narrower key and value), as the three products do.
    #[test]
    fn one_product_gives_each_layers_output_and_gradients() {
        let shapes: [&[i32]; 7] = [&[2, 5, 4], &[8, 4], &[3, 4], &[3, 4], &[8], &[3], &[3]];
        assert_same_values_and_gradients(
            &shapes,
            |args| apart(args, true),
            |args| together(args, true),
            1e-5,
        );
        assert_same_values_and_gradients(
            &shapes[..4],
            |args| apart(args, false),
            |args| together(args, false),
            1e-5,
        );
    }

    /// Adapted, quantized, mixed, wide or lone layers are not fused.
    #[test]
    fn only_plain_alike_layers_one_of_them_narrow_are_fused() {
        let w = |rows: i32| Array::zeros::<f32>(&[rows, 16]).unwrap();
        let (q, k) = (
            LinearParams::new(w(64), None),
            LinearParams::new(w(8), None),
        );
        assert!(fusable(&[&q, &k, &k]));
        assert!(!fusable(&[&q]));
        let biased = LinearParams::new(w(8), Some(Array::zeros::<f32>(&[8]).unwrap()));
        assert!(!fusable(&[&q, &biased]));
        let mut adapted = LinearParams::new(w(8), None);
        adapted.lora_a = Some(Array::zeros::<f32>(&[16, 2]).unwrap());
        assert!(!fusable(&[&q, &adapted]));
        let half = LinearParams::new(w(8).as_dtype(mlx_rs::Dtype::Bfloat16).unwrap(), None);
        assert!(!fusable(&[&q, &half]));
        let wide = LinearParams::new(w(NARROW), None);
        assert!(!fusable(&[&wide, &wide]));
    }
}
