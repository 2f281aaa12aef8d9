//! Tensors as a step sees them: graph values with no way back to the host.
//!
//! A [`Tensor`] wraps an MLX array and offers only operations that build the graph: arithmetic,
//! comparisons that give masks (never `bool`), reductions, shapes, and the layers of
//! [`nn`]. It has no `item`, no `PartialOrd` or `PartialEq`, no `Display`: code that
//! would branch on a tensor's value does not type-check, and `#[lmx::step]` reports it first, at
//! its own tokens. Shapes and dtypes are static under compilation, so they stay readable.

use crate::tree::Tree;
use crate::{Array, Result};
use mlx_rs::{ops, Dtype};

/// A graph value inside a step.
#[derive(Clone)]
pub struct Tensor(Array);

impl From<Array> for Tensor {
    fn from(array: Array) -> Tensor {
        Tensor(array)
    }
}

/// `tree` with `Tensor` leaves (cheap: arrays are reference counted).
pub fn graph<R: Tree<Array>>(tree: &R) -> R::Of<Tensor> {
    tree.map(&mut |leaf| Tensor(leaf.clone()))
}

/// `tree` with `Array` leaves again, for the runtime's layer functions.
fn arrays<R: Tree<Tensor>>(tree: &R) -> R::Of<Array> {
    tree.map(&mut |leaf| leaf.0.clone())
}

/// Elementwise `cond ? a : b`: how a step selects between values it computed both of.
pub fn where_(cond: &Tensor, a: &Tensor, b: &Tensor) -> Result<Tensor> {
    Ok(Tensor(ops::select(&cond.0, &a.0, &b.0)?))
}

macro_rules! binary {
    ($($(#[$doc:meta])* $name:ident => $op:expr;)*) => {
        $(
            $(#[$doc])*
            pub fn $name(&self, other: &Tensor) -> Result<Tensor> {
                Ok(Tensor($op(&self.0, &other.0)?))
            }
        )*
    };
}

macro_rules! unary {
    ($($(#[$doc:meta])* $name:ident => $op:expr;)*) => {
        $(
            $(#[$doc])*
            pub fn $name(&self) -> Result<Tensor> {
                Ok(Tensor($op(&self.0)?))
            }
        )*
    };
}

impl Tensor {
    /// A float32 scalar constant.
    pub fn scalar(value: f32) -> Tensor {
        Tensor(Array::from_f32(value))
    }

    /// The array behind the tensor, at the step's boundary. The code `#[lmx::step]` generates
    /// calls it on the loss; a step body that calls it is rejected by the macro.
    pub fn into_array(self) -> Array {
        self.0
    }

    /// The shape (static under compilation).
    pub fn shape(&self) -> &[i32] {
        self.0.shape()
    }

    /// The number of axes.
    pub fn ndim(&self) -> usize {
        self.0.ndim()
    }

    /// The element type.
    pub fn dtype(&self) -> Dtype {
        self.0.dtype()
    }

    binary! {
        /// `self + other`, broadcasting.
        add => Array::add;
        /// `self - other`, broadcasting.
        subtract => Array::subtract;
        /// `self * other`, broadcasting.
        multiply => Array::multiply;
        /// `self / other`, broadcasting.
        divide => Array::divide;
        /// The matrix product.
        matmul => Array::matmul;
        /// Elementwise maximum.
        maximum => ops::maximum;
        /// Elementwise minimum.
        minimum => ops::minimum;
        /// The mask `self > other`.
        gt => Array::gt;
        /// The mask `self < other`.
        lt => Array::lt;
        /// The mask `self >= other`.
        ge => Array::ge;
        /// The mask `self <= other`.
        le => Array::le;
        /// The mask `self == other`.
        eq => Array::eq;
    }

    unary! {
        /// `-self`.
        negative => Array::negative;
        /// `self²`.
        square => Array::square;
        /// `√self`.
        sqrt => Array::sqrt;
        /// `eˢᵉˡᶠ`.
        exp => Array::exp;
        /// `ln self`.
        log => Array::log;
        /// `|self|`.
        abs => Array::abs;
    }

    /// The sum of all elements.
    pub fn sum(&self) -> Result<Tensor> {
        Ok(Tensor(self.0.sum(false)?))
    }

    /// The mean of all elements.
    pub fn mean(&self) -> Result<Tensor> {
        Ok(Tensor(self.0.mean(false)?))
    }

    /// Softmax over `axis`.
    pub fn softmax(&self, axis: i32) -> Result<Tensor> {
        Ok(Tensor(ops::softmax_axis(&self.0, axis, None)?))
    }

    /// The same elements in `shape` (one axis may be `-1`).
    pub fn reshape(&self, shape: &[i32]) -> Result<Tensor> {
        Ok(Tensor(self.0.reshape(shape)?))
    }

    /// The axes permuted.
    pub fn transpose(&self, axes: &[i32]) -> Result<Tensor> {
        Ok(Tensor(self.0.transpose_axes(axes)?))
    }

    /// The elements as `dtype`.
    pub fn as_dtype(&self, dtype: Dtype) -> Result<Tensor> {
        Ok(Tensor(self.0.as_dtype(dtype)?))
    }
}

/// The runtime's layers over `Tensor` leaves.
pub mod nn {
    use super::{arrays, Tensor};
    use crate::nn::{self, EmbeddingParams, LayerNormParams, LinearParams, RmsNormParams};
    use crate::Result;

    /// `x W^T + b`.
    pub fn linear(params: &LinearParams<Tensor>, x: &Tensor) -> Result<Tensor> {
        Ok(Tensor(nn::linear(&arrays(params), &x.0)?))
    }

    /// The rows of the table for integer `ids`.
    pub fn embedding(params: &EmbeddingParams<Tensor>, ids: &Tensor) -> Result<Tensor> {
        Ok(Tensor(nn::embedding(&arrays(params), &ids.0)?))
    }

    /// `x` projected on the embedding table (a tied output head).
    pub fn embedding_as_linear(params: &EmbeddingParams<Tensor>, x: &Tensor) -> Result<Tensor> {
        Ok(Tensor(nn::embedding_as_linear(&arrays(params), &x.0)?))
    }

    /// Layer normalisation over the last axis.
    pub fn layer_norm(params: &LayerNormParams<Tensor>, x: &Tensor, eps: f32) -> Result<Tensor> {
        Ok(Tensor(nn::layer_norm(&arrays(params), &x.0, eps)?))
    }

    /// RMS normalisation over the last axis.
    pub fn rms_norm(params: &RmsNormParams<Tensor>, x: &Tensor, eps: f32) -> Result<Tensor> {
        Ok(Tensor(nn::rms_norm(&arrays(params), &x.0, eps)?))
    }

    /// SiLU: `x sigmoid(x)`.
    pub fn silu(x: &Tensor) -> Result<Tensor> {
        Ok(Tensor(nn::silu(&x.0)?))
    }

    /// GELU with the exact error function.
    pub fn gelu(x: &Tensor) -> Result<Tensor> {
        Ok(Tensor(nn::gelu(&x.0)?))
    }

    /// `[B, T, heads * head_dim] -> [B, heads, T, head_dim]`.
    pub fn split_heads(x: &Tensor, heads: i32) -> Result<Tensor> {
        Ok(Tensor(nn::split_heads(&x.0, heads)?))
    }

    /// `[B, heads, T, head_dim] -> [B, T, heads * head_dim]`.
    pub fn merge_heads(x: &Tensor) -> Result<Tensor> {
        Ok(Tensor(nn::merge_heads(&x.0)?))
    }

    /// Rotary position embedding over the last axis, positions from `offset`.
    pub fn rope(x: &Tensor, dims: i32, base: f32, offset: i32) -> Result<Tensor> {
        Ok(Tensor(nn::rope(&x.0, dims, base, offset)?))
    }

    /// Causal fused attention (keys and values may have fewer heads: GQA).
    pub fn causal_attention(q: &Tensor, k: &Tensor, v: &Tensor) -> Result<Tensor> {
        Ok(Tensor(nn::attention(
            &q.0,
            &k.0,
            &v.0,
            nn::AttentionMask::Causal,
        )?))
    }

    /// Mean token cross-entropy, in float32.
    pub fn cross_entropy(logits: &Tensor, targets: &Tensor) -> Result<Tensor> {
        Ok(Tensor(nn::cross_entropy(&logits.0, &targets.0)?))
    }
}
