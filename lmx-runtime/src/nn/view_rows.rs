//! Where a view's rows lie in the array it views, so that a decoding kernel can read that array
//! as it lies and leave the views unevaluated.
//!
//! A decoded token's attention makes views of one row: the query, key and value product's
//! output split three ways (GPT-2's), reshaped into heads and transposed; the heads' output
//! transposed back and reshaped. Each is an MLX operation whose host time a token pays, though
//! none launches a kernel (docs/benchmarks.md, "Ninth session of 2026-11-29"). A kernel that
//! takes the viewed array and where its rows lie computes the same from it, and MLX, which
//! evaluates only what an evaluated array needs, never evaluates the views.

use mlx_rs::Array;

/// Where the rows (the first axis) of a view lie in the array it views: row `b`'s values, in
/// row-major order, are `base`'s flat values from `b * row_stride + offset` on, `base` read
/// row-major.
pub(crate) struct RowsOf {
    pub base: Array,
    pub offset: i64,
    pub row_stride: i64,
}

/// Where `a`'s rows lie, through reshapes, transposes that keep the values' order and slices or
/// splits of the last axis (other axes past the first of one value), in the array those views
/// start from: the walk stops at a step that does not keep each row's values in one stretch,
/// whose output is the base (`a` itself where it is no view or such a step); `None` for a
/// scalar.
pub(crate) fn rows_of(a: &Array) -> Option<RowsOf> {
    let (mut offset, mut row_stride) = (0i64, 0i64);
    // SAFETY: `a` is a live handle; on success the call writes a new handle to `base`, which
    // `from_ptr` then owns; on failure it writes nothing, and the empty handle is freed here.
    unsafe {
        let mut base = mlx_sys::mlx_array_new();
        if mlx_sys::lmx_array_rows_of(a.as_ptr(), &mut base, &mut offset, &mut row_stride) {
            Some(RowsOf {
                base: Array::from_ptr(base),
                offset,
                row_stride,
            })
        } else {
            mlx_sys::mlx_array_free(base);
            None
        }
    }
}

/// The array whose values `a`'s are, in the same order, where `a` is a view of all of it (reshapes
/// and order-keeping transposes, as attention's heads' output is made one row again): a kernel
/// that reads `a` row-major reads that array the same, and leaves the views unevaluated. `a`
/// itself otherwise.
pub(crate) fn unviewed(a: &Array) -> Array {
    match rows_of(a) {
        Some(rows) if rows.offset == 0 && rows.base.size() == a.size() => rows.base,
        _ => a.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_arrays::normal;
    use mlx_rs::ops::indexing::{IndexOp, IntoStrideBy};
    use mlx_rs::ops::{reshape, split_equal, transpose_axes};
    use mlx_rs::Dtype;

    /// `a`'s values as `rows` says they lie in its base, taken from the base's flat values.
    fn read(rows: &RowsOf, a: &Array) -> Array {
        let b = a.shape()[0];
        let width = a.size() as i32 / b;
        let flat = rows.base.flatten(None, None).unwrap();
        let rows_read: Vec<Array> = (0..b)
            .map(|r| {
                let start = r as i64 * rows.row_stride + rows.offset;
                flat.index(start as i32..start as i32 + width)
            })
            .collect();
        mlx_rs::ops::stack(&rows_read, 0)
            .unwrap()
            .reshape(a.shape())
            .unwrap()
    }

    /// GPT-2's query, key and value (a product's output of two rows split three ways, reshaped
    /// into 12 heads of 64, transposed to heads first) and the heads' output transposed back and
    /// reshaped lie in the product's output at each third's offset, a row of the whole product's
    /// width apart, value for value; the product's output is its own base, and so is a view
    /// once evaluated.
    #[test]
    fn attention_views_lie_in_the_product() {
        let w = normal(&[2304, 768], Dtype::Float32);
        let x = normal(&[2, 1, 768], Dtype::Float32);
        let qkv = x.matmul(w.t()).unwrap();
        let parts = split_equal(&qkv, 3, -1).unwrap();
        // Every view's rows found before any is evaluated: an evaluated array is its own base.
        let heads: Vec<Array> = parts
            .iter()
            .map(|part| {
                let heads = reshape(part, &[2, 1, 12, 64]).unwrap();
                transpose_axes(&heads, &[0, 2, 1, 3]).unwrap()
            })
            .collect();
        let out = transpose_axes(reshape(&parts[0], &[2, 12, 1, 64]).unwrap(), &[0, 2, 1, 3])
            .unwrap()
            .reshape(&[2, 1, 768])
            .unwrap();
        let found: Vec<RowsOf> = heads
            .iter()
            .chain([&out])
            .map(|a| rows_of(a).unwrap())
            .collect();
        for (i, (rows, a)) in found.iter().zip(heads.iter().chain([&out])).enumerate() {
            assert_eq!(rows.base.shape(), qkv.shape(), "view {i}");
            let offset = 768 * (i as i64 % 3);
            assert_eq!((rows.offset, rows.row_stride), (offset, 2304), "view {i}");
            assert!(read(rows, a).eq_values(a).unwrap(), "view {i}");
        }
        let own = rows_of(&qkv).unwrap();
        assert_eq!((own.offset, own.row_stride), (0, 2304));
        assert_eq!(own.base.shape(), qkv.shape());
        let evaluated = rows_of(&parts[1]).unwrap();
        assert_eq!(
            evaluated.base.shape(),
            parts[1].shape(),
            "evaluated: its own base"
        );
    }

    /// A slice of the last axis moves the offset; a strided slice, a slice of an axis of many
    /// values before the last, and a transpose that reorders values end the walk, their outputs
    /// their own bases (a reshape of such a transpose lies in it); a scalar has no rows.
    #[test]
    fn views_that_reorder_values_are_their_own_rows() {
        let own = |a: &Array| {
            let rows = rows_of(a).unwrap();
            let width = a.size() as i64 / i64::from(a.shape()[0]);
            assert_eq!(rows.base.shape(), a.shape());
            assert_eq!((rows.offset, rows.row_stride), (0, width));
        };
        let x = normal(&[2, 1, 96], Dtype::Float32)
            .multiply(Array::from_f32(2.0))
            .unwrap();
        let tail = x.index((.., .., 32..96));
        let rows = rows_of(&tail).unwrap();
        assert_eq!((rows.offset, rows.row_stride), (32, 96));
        assert!(read(&rows, &tail).eq_values(&tail).unwrap());
        // A model file's range subscript (`x[:, :, 32:]`) is the same slice.
        use crate::nn::Subscript::Range;
        let subscript = crate::nn::index(
            &x,
            &[Range(None, None), Range(None, None), Range(Some(32), None)],
        )
        .unwrap();
        let rows = rows_of(&subscript).unwrap();
        assert_eq!((rows.offset, rows.row_stride), (32, 96));
        assert!(subscript.eq_values(&tail).unwrap());
        own(&x.index((.., .., (0..96).stride_by(2))));
        let grid = normal(&[2, 4, 8], Dtype::Float32)
            .multiply(Array::from_f32(2.0))
            .unwrap();
        own(&grid.index((.., 1..3, ..)));
        let swapped = transpose_axes(&grid, &[0, 2, 1]).unwrap();
        own(&swapped);
        let flat = swapped.reshape(&[2, 32]).unwrap();
        let rows = rows_of(&flat).unwrap();
        assert_eq!(rows.base.shape(), swapped.shape());
        assert!(read(&rows, &flat).eq_values(&flat).unwrap());
        own(&x.index(0..1));
        assert!(rows_of(&Array::from_f32(1.0)).is_none());
    }

    /// Attention's heads' output made one row again (transposed back and reshaped) is read in
    /// the heads' output itself; a view of part of an array is not.
    #[test]
    fn a_whole_view_is_read_in_its_array() {
        let heads = normal(&[1, 12, 1, 64], Dtype::Float32)
            .multiply(Array::from_f32(2.0))
            .unwrap();
        let row = transpose_axes(&heads, &[0, 2, 1, 3])
            .unwrap()
            .reshape(&[1, 1, 768])
            .unwrap();
        let read = unviewed(&row);
        assert_eq!(read.shape(), heads.shape());
        assert!(read.reshape(&[1, 1, 768]).unwrap().eq_values(&row).unwrap());
        let part = heads.reshape(&[1, 1, 768]).unwrap().index((.., .., 64..));
        assert_eq!(unviewed(&part).shape(), part.shape());
    }
}
