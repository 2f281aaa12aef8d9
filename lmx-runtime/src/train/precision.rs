//! Training precision.

use crate::error::Result;
use crate::tree::Tree;
use mlx_rs::{Array, Dtype};

/// The dtypes of parameters, optimizer state and activations.
///
/// In `bfloat16` training the parameters, the optimizer's moments and the activations are
/// bfloat16 (as a Python MLX model after `set_dtype(mx.bfloat16)`); what stays float32 is the loss
/// (cross-entropy upcasts the logits), the softmax inside MLX's fused attention, the statistics of
/// MLX's fused norms, the gradient norm used for clipping, the learning rate and the step count.
/// bfloat16 has 8 significant bits, so there an update smaller than half a parameter's last bit is
/// lost (a LayerNorm gain of 1.0 stays 1.0 under any step below 2^-9, about 0.002), AdamW's
/// `beta2 = 0.999` rounds to 1, so its second moment stops decaying, and a decay factor
/// `1 - lr wd` rounds to 1, as they do in Python MLX.
///
/// `mixed` keeps the parameters and the optimizer's state in float32 and computes the forward and
/// backward passes in bfloat16: each step casts the parameters to bfloat16 where the model reads
/// them, and the gradients come back through the casts as float32, so the update is float32
/// arithmetic on float32 values (PyTorch's autocast with float32 master weights does the same).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    /// Everything in float32.
    #[default]
    Float32,
    /// Parameters, moments and activations in bfloat16.
    Bfloat16,
    /// Parameters and optimizer state in float32, activations in bfloat16.
    Mixed,
}

impl Precision {
    /// The dtype the parameters and the optimizer's state are kept in.
    pub fn dtype(self) -> Dtype {
        match self {
            Precision::Float32 | Precision::Mixed => Dtype::Float32,
            Precision::Bfloat16 => Dtype::Bfloat16,
        }
    }

    /// The dtype the model computes in: the dtype of the parameters it reads.
    pub fn compute_dtype(self) -> Dtype {
        match self {
            Precision::Float32 => Dtype::Float32,
            Precision::Bfloat16 | Precision::Mixed => Dtype::Bfloat16,
        }
    }

    /// `params` with every floating-point leaf cast to [`dtype`](Self::dtype), as they are kept.
    pub fn cast<P: Tree<Array>>(self, params: &P) -> Result<P> {
        cast_floats(params, self.dtype())
    }

    /// `params` as the model reads them: every floating-point leaf cast to
    /// [`compute_dtype`](Self::compute_dtype). Inside a differentiated step the casts carry the
    /// gradients back in the kept dtype.
    pub fn for_compute<P: Tree<Array>>(self, params: &P) -> Result<P> {
        cast_floats(params, self.compute_dtype())
    }
}

/// `params` with every floating-point leaf of another dtype cast to `dtype`.
fn cast_floats<P: Tree<Array>>(params: &P, dtype: Dtype) -> Result<P> {
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

fn is_float(dtype: Dtype) -> bool {
    matches!(
        dtype,
        Dtype::Float32 | Dtype::Float16 | Dtype::Bfloat16 | Dtype::Float64
    )
}
