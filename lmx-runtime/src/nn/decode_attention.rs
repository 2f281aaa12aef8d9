//! Attention of one decoded token per row over a traced decode step's key-value buffers, with
//! the token's own key and value written into them: lmx's kernel on MLX's CUDA backend, MLX's
//! operations elsewhere. Crate-private: on CUDA the kernel writes buffers in place that only
//! the generation cache may hand it (`KvCache::attend_decoding`).

use super::deferred;
use super::layers::{attention, AttentionMask};
use crate::error::Result;
use mlx_rs::Array;

/// Which slots of a traced decode step's key-value buffers its one query per row sees: the row's
/// slots from `starts[b]` (`[B]` int32; slot 0 in every row without them) up to `position` (an
/// int32 scalar, the query's own slot).
pub(crate) struct DecodeSlots {
    /// The query's slot.
    pub(crate) position: Array,
    /// Each row's first slot, where rows start at different slots.
    pub(crate) starts: Option<Array>,
}

/// Attention of one query per row, `q: [B, heads, 1, head_dim]`, over a traced decode step's
/// whole buffers `keys`, `values: [B, kv_heads, capacity, head_dim]`, of which it sees `slots`,
/// after the token's own key and value, `k`, `v: [B, kv_heads, 1, head_dim]`, are written into
/// them at the query's slot; returns the output and the buffers so written. On MLX's CUDA backend
/// this is one kernel of lmx's, which reads only the slots seen (MLX's fused attention takes no
/// array mask there) and writes the key and value into the buffers in place, rotating the query
/// and the key where they are rotations' outputs (`deferred`). So the buffers must be the traced
/// step's own: row-contiguous (MLX would hand the kernel a copy otherwise) and shared with no
/// other array, as the cache's are (made by its own updates, gathers and concatenations). The
/// buffers returned are ordered after the kernel in MLX's graph (`depends`), but MLX's CUDA graphs
/// order operations by the buffers they *output*, which these are not: read them only in an
/// evaluation after the output's, as the cache does (the next step's query follows from this
/// step's output), never beside it. Elsewhere a dynamic-offset update of each buffer, then MLX's
/// fused attention under the mask that `mask` builds (the same view, `[B, 1, 1, capacity]`
/// bool).
pub(crate) fn decode_attention(
    q: &Array,
    (k, v): (&Array, &Array),
    (keys, values): (Array, Array),
    slots: &DecodeSlots,
    mask: impl FnOnce() -> Result<Array>,
) -> Result<(Array, Array, Array)> {
    if crate::cuda::available() && crate::cuda::decode_attention_fits(q, &keys, &values) {
        let new = crate::cuda::NewKeyValue {
            key: k,
            value: v,
            rotated_key: deferred::rotation(k).filter(|r| r.fits(k)),
        };
        if new.fits(&keys) {
            let rotated = deferred::rotation(q).filter(|r| r.fits(q));
            let position = (&slots.position, slots.starts.as_ref());
            let out = crate::cuda::decode_attention(
                q,
                (&keys, &values),
                position,
                rotated.as_ref(),
                Some(&new),
            )?;
            // The buffers as the kernel leaves them: whoever reads them waits for it.
            let written = crate::nn::dynamic::after(&[keys, values], std::slice::from_ref(&out))?;
            let [keys, values]: [Array; 2] = written.try_into().expect("depends keeps its arrays");
            return Ok((out, keys, values));
        }
    }
    let keys = crate::nn::slice_update_dynamic(&keys, k, &slots.position, 2)?;
    let values = crate::nn::slice_update_dynamic(&values, v, &slots.position, 2)?;
    let out = if crate::cuda::available() && crate::cuda::decode_attention_fits(q, &keys, &values) {
        let rotated = deferred::rotation(q).filter(|r| r.fits(q));
        let position = (&slots.position, slots.starts.as_ref());
        crate::cuda::decode_attention(q, (&keys, &values), position, rotated.as_ref(), None)?
    } else {
        attention(q, &keys, &values, AttentionMask::Array(&mask()?))?
    };
    Ok((out, keys, values))
}

/// One query per row over a decode step's whole key-value buffers, the token's own key and value
/// written at its slot first, against a float64 softmax over the slots each row sees, computed
/// here, and the buffers so written: MLX's fused attention under a mask on the CPU, lmx's kernel
/// on MLX's CUDA backend (`tests/gpu.sh`), whose split form (past 1,024 slots of capacity) and
/// rows that start late are covered too.
#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_arrays::normal;
    use mlx_rs::Dtype;

    /// Whether `a`'s values are computed (an array never evaluated has none).
    fn available(a: &Array) -> bool {
        let mut available = false;
        // SAFETY: `a` is a live handle; the call only reads its status into `available`.
        let status = unsafe { mlx_sys::_mlx_array_is_available(&mut available, a.as_ptr()) };
        assert_eq!(status, 0, "mlx-c could not read an array's status");
        available
    }

    /// The values of `a` as float64, row-major (a view's too: flattening copies where needed).
    fn values(a: &Array) -> Vec<f64> {
        let a = a.as_dtype(Dtype::Float32).unwrap().reshape(&[-1]).unwrap();
        a.as_slice::<f32>().iter().map(|&v| v as f64).collect()
    }

    /// The slots row `b` sees: its start up to the query's slot, or the query's slot alone where
    /// that comes before the row's start.
    fn seen(position: i32, start: i32) -> std::ops::RangeInclusive<i32> {
        if position < start {
            position..=position
        } else {
            start..=position
        }
    }

    struct Case {
        rows: i32,
        heads: i32,
        kv_heads: i32,
        capacity: i32,
        head_dim: i32,
        position: i32,
        starts: Option<Vec<i32>>,
        dtype: Dtype,
        /// Whether the query, key and value are views of one product's output, as a model's
        /// attention splits it, reshapes it into heads and transposes it (GPT-2's), unevaluated.
        views: bool,
    }

    /// The query, the token's key and its value of `case`'s shapes: unit normals, or views of one
    /// row of them (`views`).
    fn new_rows(case: &Case) -> [Array; 3] {
        let (rows, heads, kv_heads, d, dtype) = (
            case.rows,
            case.heads,
            case.kv_heads,
            case.head_dim,
            case.dtype,
        );
        if !case.views {
            return [heads, kv_heads, kv_heads].map(|h| normal(&[rows, h, 1, d], dtype));
        }
        let product = normal(&[rows, 1, (heads + 2 * kv_heads) * d], dtype);
        product.eval().unwrap();
        let parts =
            mlx_rs::ops::split_at_indices(&product, &[heads * d, (heads + kv_heads) * d], -1)
                .unwrap();
        let mut views = parts
            .iter()
            .zip([heads, kv_heads, kv_heads])
            .map(|(part, h)| {
                let heads = part.reshape(&[rows, 1, h, d]).unwrap();
                mlx_rs::ops::transpose_axes(&heads, &[0, 2, 1, 3]).unwrap()
            });
        [(); 3].map(|()| views.next().unwrap())
    }

    fn check(case: &Case) {
        let Case {
            rows,
            heads,
            kv_heads,
            capacity,
            head_dim: d,
            position,
            dtype,
            ..
        } = *case;
        let [q, k_new, v_new] = new_rows(case);
        let k = normal(&[rows, kv_heads, capacity, d], dtype);
        let v = normal(&[rows, kv_heads, capacity, d], dtype);
        let starts = case.starts.clone().unwrap_or(vec![0; rows as usize]);
        let slots = DecodeSlots {
            position: Array::from_int(position),
            starts: case.starts.as_ref().map(|s| Array::from_slice(s, &[rows])),
        };
        let mask = || {
            let visible: Vec<bool> = (0..rows)
                .flat_map(|b| {
                    let range = seen(position, starts[b as usize]);
                    (0..capacity).map(move |j| range.contains(&j))
                })
                .collect();
            Ok(Array::from_slice(&visible, &[rows, 1, 1, capacity]))
        };
        // The buffers, read before the kernel writes them in place.
        let (d_u, cap_u) = (d as usize, capacity as usize);
        let (mut kv, mut vv) = (values(&k), values(&v));
        let (out, keys, values_written) =
            decode_attention(&q, (&k_new, &v_new), (k, v), &slots, mask).unwrap();
        assert_eq!(out.shape(), [rows, heads, 1, d]);
        assert_eq!(out.dtype(), dtype);
        // The buffers are read as the cache reads them, after the output is evaluated: on CUDA the
        // kernel writes them in place, which MLX's CUDA graph does not order a read beside it after.
        out.eval().unwrap();
        if case.views && crate::cuda::available() {
            // The kernel read the product itself: the views were never evaluated.
            for (name, view) in [("query", &q), ("key", &k_new), ("value", &v_new)] {
                assert!(!available(view), "the {name}'s view was evaluated");
            }
        }
        let (qv, own_k, own_v) = (values(&q), values(&k_new), values(&v_new));
        // The buffers as the token's key and value written at its slot make them.
        for row in 0..(rows * kv_heads) as usize {
            let slot = (row * cap_u + position as usize) * d_u;
            kv[slot..slot + d_u].copy_from_slice(&own_k[row * d_u..][..d_u]);
            vv[slot..slot + d_u].copy_from_slice(&own_v[row * d_u..][..d_u]);
        }
        assert_eq!(values(&keys), kv, "the keys written");
        assert_eq!(values(&values_written), vv, "the values written");

        let group = heads / kv_heads;
        let mut expected = Vec::new();
        for b in 0..rows {
            for h in 0..heads {
                let query = &qv[((b * heads + h) as usize) * d_u..][..d_u];
                let base = ((b * kv_heads + h / group) as usize) * cap_u * d_u;
                let scores: Vec<(usize, f64)> = seen(position, starts[b as usize])
                    .map(|j| {
                        let key = &kv[base + j as usize * d_u..][..d_u];
                        let dot: f64 = query.iter().zip(key).map(|(a, b)| a * b).sum();
                        (j as usize, dot / (d as f64).sqrt())
                    })
                    .collect();
                let top = scores.iter().fold(f64::MIN, |m, (_, s)| m.max(*s));
                let total: f64 = scores.iter().map(|(_, s)| (s - top).exp()).sum();
                for c in 0..d_u {
                    expected.push(
                        scores
                            .iter()
                            .map(|(j, s)| (s - top).exp() / total * vv[base + j * d_u + c])
                            .sum::<f64>(),
                    );
                }
            }
        }
        let got = values(&out);
        let worst = got
            .iter()
            .zip(&expected)
            .fold(0.0f64, |m, (g, e)| m.max((g - e).abs()));
        // Outputs are averages of unit normals: the bound is absolute. bfloat16 rounds the output
        // once (8 bits), and MLX's path on the CPU also rounds its scores and weights.
        let bound = match dtype {
            Dtype::Float32 => 1e-5,
            Dtype::Float16 => 5e-3,
            _ => 3e-2,
        };
        assert!(
            worst < bound,
            "{rows}x{heads}/{kv_heads} heads, {capacity} slots, d {d}, position {position}, \
             starts {:?}, {dtype:?}: largest difference {worst}",
            case.starts
        );
    }

    #[test]
    fn one_query_sees_the_slots_up_to_its_own() {
        for position in [0, 37, 255] {
            check(&Case {
                rows: 1,
                heads: 4,
                kv_heads: 2,
                capacity: 256,
                head_dim: 64,
                position,
                starts: None,
                dtype: Dtype::Float32,
                views: false,
            });
        }
        check(&Case {
            rows: 1,
            heads: 32,
            kv_heads: 4,
            capacity: 512,
            head_dim: 64,
            position: 383,
            starts: None,
            dtype: Dtype::Bfloat16,
            views: false,
        });
        check(&Case {
            rows: 2,
            heads: 2,
            kv_heads: 1,
            capacity: 64,
            head_dim: 256,
            position: 20,
            starts: None,
            dtype: Dtype::Float16,
            views: false,
        });
        // A head size the kernel does not take goes through MLX's attention everywhere.
        check(&Case {
            rows: 1,
            heads: 2,
            kv_heads: 2,
            capacity: 32,
            head_dim: 80,
            position: 9,
            starts: None,
            dtype: Dtype::Float32,
            views: false,
        });
    }

    /// Attention over views of one product's output, as a model's attention makes them, equals
    /// the reference; on CUDA the kernel reads the product where it lies and the views are never
    /// evaluated.
    #[test]
    fn heads_are_read_where_the_product_left_them() {
        // GPT-2's attention (one product split three ways, 12 heads of 64), then a grouped
        // query's over two rows of a split cache.
        check(&Case {
            rows: 1,
            heads: 12,
            kv_heads: 12,
            capacity: 256,
            head_dim: 64,
            position: 100,
            starts: None,
            dtype: Dtype::Bfloat16,
            views: true,
        });
        check(&Case {
            rows: 2,
            heads: 8,
            kv_heads: 2,
            capacity: 2304,
            head_dim: 128,
            position: 1500,
            starts: Some(vec![0, 3]),
            dtype: Dtype::Float32,
            views: true,
        });
    }

    #[test]
    fn rows_that_start_later_see_only_their_own_slots() {
        // Row 2's query at slot 40 is on its padding (it starts at 50): it sees only itself.
        for position in [40, 95] {
            check(&Case {
                rows: 3,
                heads: 8,
                kv_heads: 8,
                capacity: 96,
                head_dim: 32,
                position,
                starts: Some(vec![0, 5, 50]),
                dtype: Dtype::Float32,
                views: false,
            });
        }
    }

    #[test]
    fn long_caches_are_split_over_blocks() {
        // 2,304 slots of capacity: 16 blocks a head on CUDA (a wave of 128 blocks over 8 heads),
        // the last to finish merging; at slot 5 ten or more of them see nothing.
        for position in [5, 1500, 2303] {
            check(&Case {
                rows: 2,
                heads: 4,
                kv_heads: 2,
                capacity: 2304,
                head_dim: 128,
                position,
                starts: Some(vec![0, 3]),
                dtype: Dtype::Float32,
                views: false,
            });
        }
        check(&Case {
            rows: 1,
            heads: 8,
            kv_heads: 2,
            capacity: 4096,
            head_dim: 64,
            position: 4000,
            starts: None,
            dtype: Dtype::Bfloat16,
            views: false,
        });
    }
}
