//! The rows of a table at integer ids (an embedding lookup), copied 16 bytes a thread.
//!
//! MLX's CUDA gather computes every output value's place from the index arrays' shapes and
//! strides, one value a thread: a GRPO update's lookup of 4,096 ids in TinyLlama's table
//! (16.8 MB out) took 197 us on an H100, where the copy's traffic allows about 10. Here each
//! thread moves one 16-byte piece of one row.

use super::kernel::{with_kernel, Inputs, Kernel, Launch, TemplateArg};
use super::sums::pack_width;
use crate::error::Result;
use mlx_rs::Array;

thread_local! {
    static ROWS_KERNEL: Result<Kernel> = Kernel::new(
        "lmx_rows",
        (&["table", "ids"], Inputs::RowContiguous),
        &["out"],
        "",
        BODY,
    );
}

/// Threads per block.
const THREADS: i32 = 256;

/// A thread's piece of the output: the `v`-th 16 bytes of the row of `ids[row]`. A negative id
/// counts from the end, as MLX's `take` reads it; an id outside the table reads its nearest row
/// rather than memory outside it.
const BODY: &str = r#"
  const int vocab = table_shape[0];
  const int vectors = table_shape[1] * sizeof(T) / 16;
  size_t count = 1;
  for (int axis = 0; axis < ids_ndim; ++axis) {
    count *= ids_shape[axis];
  }
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= count * vectors) {
    return;
  }
  const size_t row = i / vectors;
  long long id = static_cast<long long>(ids[row]);
  if (id < 0) {
    id += vocab;
  }
  id = id < 0 ? 0 : (id >= vocab ? vocab - 1 : id);
  const uint4* from = reinterpret_cast<const uint4*>(table) + size_t(id) * vectors;
  reinterpret_cast<uint4*>(out)[i] = from[i % vectors];
"#;

/// Whether the kernel takes the rows of `table` at `ids`: a floating-point `[rows, width]`
/// table whose rows are whole 16-byte pieces, 32-bit integer ids, at most `i32::MAX` pieces out.
pub(crate) fn rows_fit(table: &Array, ids: &Array) -> bool {
    use mlx_rs::Dtype::{Bfloat16, Float16, Float32, Int32, Uint32};
    let &[rows, width] = table.shape() else {
        return false;
    };
    let lanes = pack_width(table.dtype());
    let pieces = ids.size() as i64 * i64::from(width / lanes);
    matches!(table.dtype(), Float32 | Float16 | Bfloat16)
        && matches!(ids.dtype(), Int32 | Uint32)
        && rows > 0
        && width > 0
        && width % lanes == 0
        && (1..=i64::from(i32::MAX)).contains(&pieces)
}

/// The rows of `table` at `ids`: `[...ids, width]`, in the table's dtype.
pub(crate) fn rows(table: &Array, ids: &Array) -> Result<Array> {
    let width = table.shape()[1];
    let mut shape = ids.shape().to_vec();
    shape.push(width);
    let pieces = ids.size() as i32 * (width / pack_width(table.dtype()));
    let mut outputs = with_kernel(&ROWS_KERNEL, |kernel| {
        kernel.launch(
            &[table.clone(), ids.clone()],
            &Launch {
                outputs: &[(&shape, table.dtype())],
                grid: (pieces, 1, 1),
                block: (THREADS, 1, 1),
                template: &[TemplateArg::Type("T", table.dtype())],
            },
        )
    })?;
    Ok(outputs.remove(0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use mlx_rs::ops::indexing::IndexOp;
    use mlx_rs::Dtype;

    /// Only floating tables of whole 16-byte rows and 32-bit ids fit.
    #[test]
    fn whole_pieces_of_floats_at_32_bit_ids_fit() {
        let ids = Array::from_slice(&[0i32, 2], &[2]);
        let table = |width: i32, dtype: Dtype| {
            Array::zeros::<f32>(&[3, width])
                .unwrap()
                .as_dtype(dtype)
                .unwrap()
        };
        assert!(rows_fit(&table(8, Dtype::Bfloat16), &ids));
        assert!(rows_fit(&table(4, Dtype::Float32), &ids));
        assert!(!rows_fit(&table(6, Dtype::Bfloat16), &ids));
        assert!(!rows_fit(&table(8, Dtype::Int32), &ids));
        assert!(!rows_fit(
            &table(8, Dtype::Float32),
            &ids.as_dtype(Dtype::Int64).unwrap()
        ));
        assert!(!rows_fit(&Array::zeros::<f32>(&[2, 3, 8]).unwrap(), &ids));
    }

    /// The kernel's rows equal MLX's `take` for ids of two axes (negative ones counting from the
    /// end), in every float dtype, and an id past the table reads its last row.
    #[test]
    fn rows_equal_takes() {
        if !crate::cuda::available() {
            return;
        }
        for dtype in [Dtype::Float32, Dtype::Float16, Dtype::Bfloat16] {
            let table = mlx_rs::random::normal::<f32>(&[11, 24], None, None, None)
                .unwrap()
                .as_dtype(dtype)
                .unwrap();
            let ids = Array::from_slice(&[0i32, 3, 10, -1, 5, -11], &[2, 3]);
            assert!(rows_fit(&table, &ids));
            let got = rows(&table, &ids).unwrap();
            let want = table.take_axis(&ids, 0).unwrap();
            assert_eq!(got.shape(), &[2, 3, 24]);
            assert!(got.eq_values(&want).unwrap(), "{dtype:?}");
            let past = rows(&table, &Array::from_slice(&[11i32], &[1])).unwrap();
            assert!(past.index(0).eq_values(table.index(10)).unwrap());
        }
    }
}
