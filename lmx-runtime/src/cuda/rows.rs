//! The rows of a table at integer ids (an embedding lookup), copied 16 bytes a thread, or
//! dequantized from a packed table a 32-bit word a thread.
//!
//! MLX's CUDA gather computes every output value's place from the index arrays' shapes and
//! strides, one value a thread: a GRPO update's lookup of 4,096 ids in TinyLlama's table
//! (16.8 MB out) took 197 us on an H100, where the copy's traffic allows about 10. Here each
//! thread moves one 16-byte piece of one row. A packed table's lookup was four operations (the
//! packed words', scales' and offsets' rows, then their dequantization), three more per decoded
//! token than a dense table's one: here it is one too.

use super::kernel::{with_kernel, Inputs, Kernel, Launch, TemplateArg};
use super::sums::pack_width;
use super::weights::Weight;
use crate::error::Result;
use mlx_rs::{Array, Dtype};

thread_local! {
    static ROWS_KERNEL: Result<Kernel> = Kernel::new(
        "lmx_rows",
        (&["table", "ids"], Inputs::RowContiguous),
        &["out"],
        HEADER,
        BODY,
    );
}

/// Threads per block.
const THREADS: i32 = 256;

/// How many ids there are (their shape's product), and the table row that output row `row`
/// reads: `ids[row]`, a negative id counting from the end, as MLX's `take` reads it, and an id
/// outside the table its nearest row rather than memory outside it.
const HEADER: &str = r#"
template <typename S>
__device__ inline size_t lmx_ids_count(const S& shape, int ndim) {
  size_t count = 1;
  for (int axis = 0; axis < ndim; ++axis) {
    count *= shape[axis];
  }
  return count;
}
template <typename I>
__device__ inline size_t lmx_table_row(const I* ids, size_t row, int vocab) {
  long long id = static_cast<long long>(ids[row]);
  if (id < 0) {
    id += vocab;
  }
  return size_t(id < 0 ? 0 : (id >= vocab ? vocab - 1 : id));
}
"#;

thread_local! {
    static PACKED_ROWS_KERNEL: Result<Kernel> = Kernel::new(
        "lmx_packed_rows",
        (&["w", "s", "b", "ids"], Inputs::RowContiguous),
        &["out"],
        HEADER,
        PACKED_BODY,
    );
}

/// A thread's piece of a packed table's output: the `32 / BITS` values of one 32-bit word of the
/// row of `ids[row]` (one group's: `GS` is a multiple of them), each `scale * q + bias` in `T`
/// as MLX's dequantization computes it, so its values equal MLX's.
const PACKED_BODY: &str = r#"
  constexpr int PER = 32 / BITS;
  constexpr unsigned MASK = (1u << BITS) - 1u;
  const int vocab = w_shape[0];
  const int words = w_shape[1];
  const int groups = s_shape[1];
  const size_t count = lmx_ids_count(ids_shape, ids_ndim);
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= count * words) {
    return;
  }
  const size_t id = lmx_table_row(ids, i / words, vocab);
  const int word = int(i % words);
  const uint32_t q = w[id * words + word];
  const size_t g = id * groups + (word * PER) / GS;
  const T scale = s[g];
  const T bias = b[g];
  T* o = out + i * PER;
#pragma unroll
  for (int j = 0; j < PER; ++j) {
    o[j] = scale * static_cast<T>((q >> (BITS * j)) & MASK) + bias;
  }
"#;

/// A thread's piece of the output: the `v`-th 16 bytes of the row that `ids[row]` names
/// ([`HEADER`]).
const BODY: &str = r#"
  const int vocab = table_shape[0];
  const int vectors = table_shape[1] * sizeof(T) / 16;
  const size_t count = lmx_ids_count(ids_shape, ids_ndim);
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= count * vectors) {
    return;
  }
  const size_t id = lmx_table_row(ids, i / vectors, vocab);
  const uint4* from = reinterpret_cast<const uint4*>(table) + id * vectors;
  reinterpret_cast<uint4*>(out)[i] = from[i % vectors];
"#;

/// The threads of a lookup of `ids` at `per_id` threads an id, where MLX launches them: ids of
/// 32-bit integers with at least one axis (MLX declares no shape of a scalar input to a kernel,
/// whose body reads the ids' shape), at least one thread, and few enough that MLX's count of
/// blocks (`(threads + block - 1) / block` in `i32`) does not overflow.
fn threads(ids: &Array, per_id: i32) -> Option<i32> {
    let count = ids.size() as i64 * i64::from(per_id);
    let launchable = 1..=i64::from(i32::MAX - THREADS + 1);
    (matches!(ids.dtype(), Dtype::Int32 | Dtype::Uint32)
        && ids.ndim() > 0
        && launchable.contains(&count))
    .then_some(count as i32)
}

/// Whether the kernel takes the rows of `table` at `ids`: a floating-point `[rows, width]`
/// table whose rows are whole 16-byte pieces, at ids [`threads`] launches a piece each.
pub(crate) fn rows_fit(table: &Array, ids: &Array) -> bool {
    use mlx_rs::Dtype::{Bfloat16, Float16, Float32};
    let &[rows, width] = table.shape() else {
        return false;
    };
    let lanes = pack_width(table.dtype());
    matches!(table.dtype(), Float32 | Float16 | Bfloat16)
        && rows > 0
        && width > 0
        && width % lanes == 0
        && threads(ids, width / lanes).is_some()
}

/// The rows of `table` at `ids`: `[...ids, width]`, in the table's dtype. Callers check
/// [`rows_fit`].
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

/// A packed table's rows at integer ids, as the packed kernel takes them.
pub(crate) struct PackedRows<'a> {
    table: Weight<'a>,
    /// The scales' dtype, which the table fits and the rows come out in.
    dtype: Dtype,
    ids: &'a Array,
    /// A 32-bit word of the packed rows a thread.
    threads: i32,
}

impl<'a> PackedRows<'a> {
    /// The lookup of `table` at `ids` where the kernel takes it: a packed [`Weight`] that
    /// decoding's kernels read (4 or 8 bits, groups of 32, 64 or 128; scales and offsets of a
    /// floating dtype), at ids [`threads`] launches a word each.
    pub(crate) fn of(table: &Weight<'a>, ids: &'a Array) -> Option<Self> {
        let Weight::Affine { packed, scales, .. } = *table else {
            return None;
        };
        if !table.fits(scales.dtype()) {
            return None;
        }
        Some(PackedRows {
            table: *table,
            dtype: scales.dtype(),
            ids,
            threads: threads(ids, packed.shape()[1])?,
        })
    }

    /// The rows, dequantized: `[...ids, width]`, in the scales' dtype.
    pub(crate) fn apply(&self) -> Result<Array> {
        let mut inputs = self.table.arrays();
        inputs.push(self.ids.clone());
        let mut shape = self.ids.shape().to_vec();
        shape.push(self.table.width());
        let dtype = self.dtype;
        let mut template = vec![TemplateArg::Type("T", dtype)];
        template.extend(self.table.template());
        let mut outputs = with_kernel(&PACKED_ROWS_KERNEL, |kernel| {
            kernel.launch(
                &inputs,
                &Launch {
                    outputs: &[(&shape, dtype)],
                    grid: (self.threads, 1, 1),
                    block: (THREADS, 1, 1),
                    template: &template,
                },
            )
        })?;
        Ok(outputs.remove(0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mlx_rs::ops::indexing::IndexOp;

    /// Only floating tables of whole 16-byte rows and 32-bit ids of at least one axis fit.
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
        assert!(!rows_fit(&table(8, Dtype::Float32), &Array::from_int(1)));
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

    /// A packed table of `rows` by `width` values of `dtype`, quantized in `bits` by groups of
    /// `group_size`: its packed words, scales and offsets.
    fn packed_table(rows: i32, width: i32, dtype: Dtype, bits: i32, group_size: i32) -> [Array; 3] {
        let table = mlx_rs::random::normal::<f32>(&[rows, width], None, None, None)
            .unwrap()
            .as_dtype(dtype)
            .unwrap();
        let (w, s, b) = mlx_rs::ops::quantize(&table, group_size, bits).unwrap();
        [w, s, b]
    }

    /// Tables packed in 4 or 8 bits by MLX's group sizes fit at 32-bit ids of at least one axis;
    /// 2 bits, a dense table, 64-bit ids, no ids or a scalar id do not.
    #[test]
    fn packed_tables_of_the_kernels_bits_fit() {
        let ids = Array::from_slice(&[0i32, 2], &[2]);
        let fits = |table: &Weight, ids: &Array| PackedRows::of(table, ids).is_some();
        for (bits, group_size) in [(4, 32), (4, 64), (4, 128), (8, 128)] {
            let parts = packed_table(3, 128, Dtype::Float32, bits, group_size);
            let table = Weight::affine(&parts, bits, group_size);
            assert!(fits(&table, &ids));
            assert!(fits(&table, &ids.as_dtype(Dtype::Uint32).unwrap()));
        }
        let two = packed_table(3, 128, Dtype::Float32, 2, 64);
        assert!(!fits(&Weight::affine(&two, 2, 64), &ids));
        let four = packed_table(3, 128, Dtype::Float32, 4, 64);
        let table = Weight::affine(&four, 4, 64);
        assert!(!fits(&table, &ids.as_dtype(Dtype::Int64).unwrap()));
        assert!(!fits(&table, &Array::from_slice::<i32>(&[], &[0])));
        assert!(!fits(&table, &Array::from_int(1)));
        let dense = Array::zeros::<f32>(&[3, 128]).unwrap();
        assert!(!fits(&Weight::Dense(&dense), &ids));
    }

    /// The packed kernel's rows equal MLX's dequantization of the takes of the packed words,
    /// scales and offsets (value for value), for ids of two axes, signed and unsigned (negative
    /// ones counting from the end), in every float dtype, 4 and 8 bits, over several blocks of
    /// threads; an id past the table reads its last row.
    #[test]
    fn packed_rows_equal_dequantized_takes() {
        if !crate::cuda::available() {
            return;
        }
        let signed = Array::from_slice(&[0i32, 3, 10, -1, 5, -11], &[2, 3]);
        let unsigned = Array::from_slice(&[0u32, 3, 10, 7, 5, 1], &[2, 3]);
        for dtype in [Dtype::Float32, Dtype::Float16, Dtype::Bfloat16] {
            for (bits, group_size) in [(4, 32), (4, 128), (8, 64), (8, 128)] {
                let parts = packed_table(11, 1024, dtype, bits, group_size);
                let table = Weight::affine(&parts, bits, group_size);
                for ids in [&signed, &unsigned] {
                    let got = PackedRows::of(&table, ids).unwrap().apply().unwrap();
                    let take = |a: &Array| a.take_axis(ids, 0).unwrap();
                    let want = mlx_rs::ops::dequantize(
                        take(&parts[0]),
                        take(&parts[1]),
                        &take(&parts[2]),
                        group_size,
                        bits,
                    )
                    .unwrap();
                    assert_eq!(got.shape(), &[2, 3, 1024]);
                    assert_eq!(got.dtype(), dtype);
                    let case = format!("{dtype:?}, {bits} bits by {group_size}, {:?}", ids.dtype());
                    assert!(got.eq_values(&want).unwrap(), "{case}");
                }
                let past = Array::from_slice(&[11i32], &[1]);
                let last = PackedRows::of(&table, &past).unwrap().apply().unwrap();
                let want = mlx_rs::ops::dequantize(
                    parts[0].index(10..11),
                    parts[1].index(10..11),
                    &parts[2].index(10..11),
                    group_size,
                    bits,
                )
                .unwrap();
                assert!(last.eq_values(&want).unwrap());
            }
        }
    }
}
