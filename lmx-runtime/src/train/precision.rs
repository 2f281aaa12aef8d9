//! Training precision.

use crate::error::Result;
use crate::tree::Tree;
use mlx_rs::{Array, Dtype};

/// The dtype of parameters, optimizer state and activations.
///
/// In `bfloat16` training the parameters, the optimizer's moments and the activations are
/// bfloat16 (as a Python MLX model after `set_dtype(mx.bfloat16)`); what stays float32 is the loss
/// (cross-entropy upcasts the logits), the softmax inside MLX's fused attention, the statistics of
/// MLX's fused norms, the gradient norm used for clipping, the learning rate and the step count.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    /// Everything in float32.
    #[default]
    Float32,
    /// Parameters, moments and activations in bfloat16.
    Bfloat16,
}

impl Precision {
    /// The parameters' dtype.
    pub fn dtype(self) -> Dtype {
        match self {
            Precision::Float32 => Dtype::Float32,
            Precision::Bfloat16 => Dtype::Bfloat16,
        }
    }

    /// `params` with every floating-point leaf cast to this precision.
    pub fn cast<P: Tree<Array>>(self, params: &P) -> Result<P> {
        let dtype = self.dtype();
        let mut failure = None;
        let cast = params.map_same(&mut |leaf| {
            if leaf.dtype() == dtype || !is_float(leaf.dtype()) {
                return leaf.clone();
            }
            leaf.as_dtype(dtype).unwrap_or_else(|err| {
                failure = Some(err);
                leaf.clone()
            })
        });
        match failure {
            Some(err) => Err(err.into()),
            None => Ok(cast),
        }
    }
}

fn is_float(dtype: Dtype) -> bool {
    matches!(
        dtype,
        Dtype::Float32 | Dtype::Float16 | Dtype::Bfloat16 | Dtype::Float64
    )
}
