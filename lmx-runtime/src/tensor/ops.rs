//! The graph operations of [`Tensor`]: arithmetic, masks, reductions, shapes, indexing,
//! splitting and joining. Every index, axis and size is a static (host) value.

use super::Tensor;
use crate::error::{Error, Result};
use crate::nn::{self, Subscript};
use crate::Array;
use mlx_rs::{ops, Dtype};
use std::ops::{Bound, RangeBounds};

/// Elementwise `cond ? a : b`: how a step selects between values it computed both of.
pub fn where_(cond: &Tensor, a: &Tensor, b: &Tensor) -> Result<Tensor> {
    Ok(Tensor(ops::select(&cond.0, &a.0, &b.0)?))
}

/// `tensors` joined along `axis` (every other axis of the same size).
pub fn concatenate(tensors: &[Tensor], axis: i32) -> Result<Tensor> {
    let arrays: Vec<&Array> = tensors.iter().map(|t| &t.0).collect();
    Ok(Tensor(ops::concatenate(&arrays, axis)?))
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

    /// The int32 positions `start, start + 1, ..., start + len - 1` for an int32 scalar `start`
    /// (token positions from [`Context::offset`](super::Context::offset), for a learned position
    /// embedding).
    pub fn arange(start: &Tensor, len: i32) -> Result<Tensor> {
        Ok(Tensor(nn::positions_after(&start.0, len)?))
    }

    /// The shape (static under compilation).
    pub fn shape(&self) -> &[i32] {
        self.0.shape()
    }

    /// The size of axis `axis` (negative counts from the end).
    pub fn dim(&self, axis: i32) -> i32 {
        self.0.dim(axis)
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
        /// `tanh self`.
        tanh => ops::tanh;
        /// `1 / (1 + e⁻ˢᵉˡᶠ)`.
        sigmoid => ops::sigmoid;
        /// The same values with no gradient flowing back through them.
        stop_gradient => nn::stop_gradient;
    }

    /// `self` times the constant `factor`, in `self`'s precision.
    pub fn scale(&self, factor: f64) -> Result<Tensor> {
        Ok(Tensor(self.0.multiply(nn::literal(factor, &self.0)?)?))
    }

    /// The sum of all elements.
    pub fn sum(&self) -> Result<Tensor> {
        Ok(Tensor(self.0.sum(false)?))
    }

    /// The mean of all elements.
    pub fn mean(&self) -> Result<Tensor> {
        Ok(Tensor(self.0.mean(false)?))
    }

    /// The sum along `axis`, keeping it as size 1 when `keepdims`.
    pub fn sum_axis(&self, axis: i32, keepdims: bool) -> Result<Tensor> {
        Ok(Tensor(self.0.sum_axis(axis, keepdims)?))
    }

    /// The mean along `axis`, keeping it as size 1 when `keepdims`.
    pub fn mean_axis(&self, axis: i32, keepdims: bool) -> Result<Tensor> {
        Ok(Tensor(self.0.mean_axis(axis, keepdims)?))
    }

    /// The maximum along `axis`, keeping it as size 1 when `keepdims`.
    pub fn max_axis(&self, axis: i32, keepdims: bool) -> Result<Tensor> {
        Ok(Tensor(self.0.max_axis(axis, keepdims)?))
    }

    /// Softmax over `axis`, computed in float32.
    pub fn softmax(&self, axis: i32) -> Result<Tensor> {
        Ok(Tensor(nn::softmax(&self.0, axis)?))
    }

    /// Log-softmax over `axis`.
    pub fn log_softmax(&self, axis: i32) -> Result<Tensor> {
        Ok(Tensor(nn::log_softmax(&self.0, axis)?))
    }

    /// The same elements in `shape` (one axis may be `-1`).
    pub fn reshape(&self, shape: &[i32]) -> Result<Tensor> {
        Ok(Tensor(self.0.reshape(shape)?))
    }

    /// The axes permuted.
    pub fn transpose(&self, axes: &[i32]) -> Result<Tensor> {
        Ok(Tensor(self.0.transpose_axes(axes)?))
    }

    /// A new axis of size 1 at `axis`.
    pub fn expand_dims(&self, axis: i32) -> Result<Tensor> {
        Ok(Tensor(self.0.expand_dims(axis)?))
    }

    /// The axis `axis` (of size 1) removed.
    pub fn squeeze(&self, axis: i32) -> Result<Tensor> {
        Ok(Tensor(self.0.squeeze_axes(&[axis])?))
    }

    /// The elements as `dtype`.
    pub fn as_dtype(&self, dtype: Dtype) -> Result<Tensor> {
        Ok(Tensor(self.0.as_dtype(dtype)?))
    }

    /// `self[subscripts]` with static subscripts, as NumPy reads them: `At(i)` picks one
    /// position and drops the axis, `Range(a, b)` keeps `a..b` (either end open, negative ends
    /// counting from the end), `Ellipsis` stands for every axis not named.
    pub fn index(&self, subscripts: &[Subscript]) -> Result<Tensor> {
        Ok(Tensor(nn::index(&self.0, subscripts)?))
    }

    /// The positions `range` of axis `axis` (`x.slice(1, ..t)`, `x.slice(-1, 8..)`); negative
    /// bounds count from the end.
    pub fn slice(&self, axis: i32, range: impl RangeBounds<i32>) -> Result<Tensor> {
        let rank = self.ndim() as i32;
        let resolved = if axis < 0 { axis + rank } else { axis };
        if !(0..rank).contains(&resolved) {
            return Err(Error::Layout(format!(
                "axis {axis} is out of range for a tensor of {rank} axes"
            )));
        }
        let start = match range.start_bound() {
            Bound::Included(&i) => Some(i),
            Bound::Excluded(&i) => Some(i + 1),
            Bound::Unbounded => None,
        };
        let end = match range.end_bound() {
            Bound::Included(&i) => Some(i + 1),
            Bound::Excluded(&i) => Some(i),
            Bound::Unbounded => None,
        };
        let mut subscripts = vec![Subscript::Range(None, None); resolved as usize];
        subscripts.push(Subscript::Range(start, end));
        self.index(&subscripts)
    }

    /// `self` cut into `N` equal parts along `axis` (`let [q, k, v] = qkv.split(-1)?`).
    pub fn split<const N: usize>(&self, axis: i32) -> Result<[Tensor; N]> {
        Ok(nn::split::<N>(&self.0, axis)?.map(Tensor))
    }

    /// `self` cut along `axis` before each of `indices` (`[0, a)`, `[a, b)`, ..., `[z, end)`).
    pub fn split_at(&self, indices: &[i32], axis: i32) -> Result<Vec<Tensor>> {
        Ok(self
            .0
            .split_at_indices(indices, axis)?
            .into_iter()
            .map(Tensor)
            .collect())
    }

    /// The rows of `self` (a table along axis 0) at integer `ids`, any shape.
    pub fn take(&self, ids: &Tensor, axis: i32) -> Result<Tensor> {
        Ok(Tensor(self.0.take_axis(&ids.0, axis)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tensor(values: &[f32], shape: &[i32]) -> Tensor {
        Tensor(Array::from_slice(values, shape))
    }

    /// The shape and the elements in row-major order (a slice may be a strided view).
    fn values(t: &Tensor) -> (Vec<i32>, Vec<f32>) {
        let dense = t.0.contiguous().unwrap();
        (t.shape().to_vec(), dense.as_slice::<f32>().to_vec())
    }

    /// `[[0, 1, 2, 3], [4, 5, 6, 7]]`.
    fn grid() -> Tensor {
        let v: Vec<f32> = (0..8).map(|i| i as f32).collect();
        tensor(&v, &[2, 4])
    }

    #[test]
    fn slices_take_ranges_of_one_axis_with_negative_bounds_from_the_end() -> Result<()> {
        let x = grid();
        assert_eq!(
            values(&x.slice(1, ..2)?),
            (vec![2, 2], vec![0., 1., 4., 5.])
        );
        assert_eq!(values(&x.slice(-1, -1..)?), (vec![2, 1], vec![3., 7.]));
        assert_eq!(
            values(&x.slice(0, 1..=1)?),
            (vec![1, 4], vec![4., 5., 6., 7.])
        );
        match x.slice(2, ..) {
            Err(Error::Layout(message)) => {
                assert_eq!(message, "axis 2 is out of range for a tensor of 2 axes")
            }
            Err(other) => panic!("expected a layout error, got {other}"),
            Ok(_) => panic!("axis 2 of a matrix was sliced"),
        }
        let row = x.index(&[Subscript::At(-1), Subscript::Range(Some(1), Some(3))])?;
        assert_eq!(values(&row), (vec![2], vec![5., 6.]));
        Ok(())
    }

    #[test]
    fn split_and_concatenate_are_inverse() -> Result<()> {
        let x = grid();
        let [left, right] = x.split(1)?;
        assert_eq!(values(&left), (vec![2, 2], vec![0., 1., 4., 5.]));
        assert_eq!(values(&concatenate(&[left, right], 1)?), values(&x));
        let parts = x.split_at(&[1, 3], -1)?;
        let shapes: Vec<Vec<i32>> = parts.iter().map(|p| p.shape().to_vec()).collect();
        assert_eq!(shapes, [vec![2, 1], vec![2, 2], vec![2, 1]]);
        assert_eq!(values(&concatenate(&parts, -1)?), values(&x));
        assert!(matches!(x.split::<3>(1), Err(Error::Mlx(_))));
        Ok(())
    }
}
