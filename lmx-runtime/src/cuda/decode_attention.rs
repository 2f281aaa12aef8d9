//! Attention of one query per row over a decode step's key-value buffers, in one kernel.
//!
//! A traced decode step reads its cache's whole capacity, the slots past the token masked
//! (the generation cache's traced form), and MLX's fused attention takes no array mask
//! on CUDA: MLX then computes it in parts (a batched product of the scores, the scale, the mask's
//! select, the softmax, a product with the values; six kernels a layer, the batched product with
//! cuBLAS's host setup). Here one block of warps ([`warps`]) takes one query head of one row and
//! reads only the slots it sees, each warp an online softmax over every `WARPS`-th slot, the
//! warps' partial results then merged in shared memory. Where the capacity takes more than two
//! passes of a block's loads ([`slots_per_block`]), the slots are split over several blocks per
//! head ([`splits`]) and the last of a head's blocks to finish merges their partial results, in
//! the same launch: a block's passes follow one another (each a load's latency and a softmax's
//! arithmetic), so one block per head took longer with every 128 slots of TinyLlama's decoding,
//! on 32 of the GPU's 132 multiprocessors (docs/benchmarks.md, "Seventh session of 2026-11-29").

use super::kernel::{with_kernel, Inputs, Kernel, Launch, TemplateArg};
use crate::error::Result;
use mlx_rs::{Array, Dtype};

/// Warps per block, each reading every `WARPS`-th slot of its block's share: 32 (1,024 threads)
/// up to a head size of 64, fewer for larger heads, whose threads hold more registers (a block's
/// threads share 65,536 of them).
fn warps(head_dim: i32) -> i32 {
    match head_dim {
        ..=64 => 32,
        128 => 16,
        _ => 8,
    }
}

/// Slots each warp loads at once, in one pass.
const UNROLL: i32 = 4;

/// Slots one pass of a block's loads covers (each warp `UNROLL` of them).
fn slots_per_block(warps: i32) -> i32 {
    warps * UNROLL
}

/// Most blocks one head's slots are split over.
const MAX_SPLITS: i32 = 64;

/// Most slots one block takes however many blocks that makes a launch.
const MAX_SLOTS_PER_BLOCK: i32 = 1024;

/// Blocks of a launch an H100 or H200 runs at once (132 multiprocessors, one block of 1,024
/// threads each): split further, a launch's blocks run in waves, one after another, and take
/// longer than fewer blocks of more passes each (docs/benchmarks.md, "Seventh session of
/// 2026-11-29").
const WAVE_BLOCKS: i32 = 128;

/// Passes a block makes over its slots before they are split over blocks. A split launch's blocks
/// count themselves done and the last merges their parts: in the probe, at two passes (position
/// 128) one block per head was faster than two blocks, at three (position 383) four blocks were
/// faster than one (docs/benchmarks.md, "Seventh session of 2026-11-29").
const WHOLE_PASSES: i32 = 2;

/// Blocks per head for `heads` heads (of all rows) over `capacity` slots, `warps` warps a block:
/// one where that block makes at most [`WHOLE_PASSES`] passes, else one pass each, as long as
/// the launch stays within a wave of blocks, and at most [`MAX_SLOTS_PER_BLOCK`] slots each.
fn splits(capacity: i32, heads: i32, warps: i32) -> i32 {
    let blocks_for = |slots: i32| (capacity + slots - 1) / slots;
    let passes = blocks_for(slots_per_block(warps));
    if passes <= WHOLE_PASSES {
        return 1;
    }
    let within_a_wave = (WAVE_BLOCKS / heads.max(1)).max(blocks_for(MAX_SLOTS_PER_BLOCK));
    passes.min(within_a_wave).clamp(1, MAX_SPLITS)
}

/// The online softmax of one block's share of the slots, in float32, for query head `bh`'s row
/// (`q` row `b`'s `HEADS` heads of `D` from flat value `b * Q_ROW + Q_OFF` on ([`HeadRows`]),
/// `k`, `v: [B, KVH, C, D]`, `position: [1]` the query's slot, `starts: [B]`
/// each row's first slot where `HAS_STARTS`, else every row starts at slot 0; where `ROPE_Q`,
/// `q` is the query before its rotation, which the block rotates at position `rope_offset` (one
/// value, or one per row) by `inv_freq`, as lmx's RoPE kernel would). Leaves the share's maximum
/// score `M`, its sum of exponentials `L` and this thread's output value `o` (thread `t < D` for
/// component `t`). A query on its row's padding (before the row's start) sees only its own slot.
/// Where `WRITE`, the token's own key and value are `k_new`, `v_new` (`KVH` heads a row, as `q`'s
/// lie, at `K_ROW`, `K_OFF` and `V_ROW`, `V_OFF`; the key
/// rotated here where `ROPE_K`, at `k_rope_offset` by `k_inv_freq`, as the query), read for the
/// query's slot in place of the buffers', and the first block of each key head's first query head
/// writes them into the buffers at that slot: the buffers are a traced decode step's own, updated
/// in place, which is why `k` and `v` are written through their inputs' pointers.
/// Each lane holds `D / 32` neighbouring components; `UNROLL` slots' loads are in flight at once.
const SHARE: &str = r#"
  constexpr int E = D / 32;
  struct alignas(sizeof(T) * E) Pack {
    T v[E];
  };
  __shared__ float shared_m[WARPS];
  __shared__ float shared_l[WARPS];
  __shared__ float shared_o[WARPS][D];
  const int heads = HEADS;
  const int kv_heads = k_shape[1];
  const int capacity = k_shape[2];
  const int bh = blockIdx.y;
  const int b = bh / heads;
  const int kvh = (bh % heads) / (heads / kv_heads);
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int pos = position[0];
  const int first = HAS_STARTS ? min(starts[b], pos) : 0;
  const int count = pos - first + 1;
  const int per_block = (count + gridDim.x - 1) / gridDim.x;
  const int lo = first + blockIdx.x * per_block;
  const int hi = min(pos + 1, lo + per_block);
  const float scale = rsqrtf(static_cast<float>(D));
  const Pack qp = *reinterpret_cast<const Pack*>(
      q + static_cast<size_t>(b) * Q_ROW + Q_OFF + (bh % heads) * D + lane * E);
  float qv[E];
#pragma unroll
  for (int e = 0; e < E; ++e) {
    qv[e] = static_cast<float>(qp.v[e]);
  }
  if (ROPE_Q) {
    // Rotate-half RoPE, as lmx's RoPE kernel computes it: component `i < D / 2` pairs with
    // `i + D / 2`, which lane `lane ^ 16` holds; the rotated value is rounded to `T`.
    const float at = static_cast<float>(rope_offset[rope_offset_shape[0] == 1 ? 0 : b]);
    const bool low = lane < 16;
#pragma unroll
    for (int e = 0; e < E; ++e) {
      const float other = __shfl_xor_sync(0xffffffff, qv[e], 16);
      float s;
      float c;
      sincosf(at * inv_freq[(lane % 16) * E + e], &s, &c);
      const float rotated = low ? qv[e] * c - other * s : other * s + qv[e] * c;
      qv[e] = static_cast<float>(static_cast<T>(rotated));
    }
  }
#pragma unroll
  for (int e = 0; e < E; ++e) {
    qv[e] *= scale;
  }
  const size_t base = (static_cast<size_t>(b) * kv_heads + kvh) * capacity * D + lane * E;
  Pack kn;
  Pack vn;
  if (WRITE) {
    const int own = kvh * D + lane * E;
    kn = *reinterpret_cast<const Pack*>(k_new + static_cast<size_t>(b) * K_ROW + K_OFF + own);
    vn = *reinterpret_cast<const Pack*>(v_new + static_cast<size_t>(b) * V_ROW + V_OFF + own);
    if (ROPE_K) {
      const float at = static_cast<float>(k_rope_offset[k_rope_offset_shape[0] == 1 ? 0 : b]);
      const bool low = lane < 16;
#pragma unroll
      for (int e = 0; e < E; ++e) {
        const float x = static_cast<float>(kn.v[e]);
        const float other = __shfl_xor_sync(0xffffffff, x, 16);
        float s;
        float c;
        sincosf(at * k_inv_freq[(lane % 16) * E + e], &s, &c);
        kn.v[e] = static_cast<T>(low ? x * c - other * s : other * s + x * c);
      }
    }
    if (blockIdx.x == 0 && (bh % heads) % (heads / kv_heads) == 0 && warp == 0) {
      const size_t slot = base + static_cast<size_t>(pos) * D;
      *reinterpret_cast<Pack*>(const_cast<T*>(k) + slot) = kn;
      *reinterpret_cast<Pack*>(const_cast<T*>(v) + slot) = vn;
    }
  }
  float m = -INFINITY;
  float l = 0.f;
  float acc[E];
#pragma unroll
  for (int e = 0; e < E; ++e) {
    acc[e] = 0.f;
  }
  for (int j0 = lo + warp; j0 < hi; j0 += WARPS * UNROLL) {
    Pack kp[UNROLL];
    Pack vp[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int j = j0 + u * WARPS;
      if (WRITE && j == pos) {
        kp[u] = kn;
        vp[u] = vn;
      } else if (j < hi) {
        kp[u] = *reinterpret_cast<const Pack*>(k + base + static_cast<size_t>(j) * D);
        vp[u] = *reinterpret_cast<const Pack*>(v + base + static_cast<size_t>(j) * D);
      }
    }
    float s[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      s[u] = 0.f;
#pragma unroll
      for (int e = 0; e < E; ++e) {
        s[u] += qv[e] * static_cast<float>(kp[u].v[e]);
      }
    }
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) {
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) {
        s[u] += __shfl_xor_sync(0xffffffff, s[u], offset);
      }
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      if (j0 + u * WARPS < hi) {
        const float next = fmaxf(m, s[u]);
        const float keep = __expf(m - next);
        const float p = __expf(s[u] - next);
        l = l * keep + p;
#pragma unroll
        for (int e = 0; e < E; ++e) {
          acc[e] = acc[e] * keep + p * static_cast<float>(vp[u].v[e]);
        }
        m = next;
      }
    }
  }
  if (lane == 0) {
    shared_m[warp] = m;
    shared_l[warp] = l;
  }
#pragma unroll
  for (int e = 0; e < E; ++e) {
    shared_o[warp][lane * E + e] = acc[e];
  }
  __syncthreads();
  const int t = threadIdx.x;
  if (t >= D) {
    return;
  }
  float M = -INFINITY;
#pragma unroll
  for (int w = 0; w < WARPS; ++w) {
    M = fmaxf(M, shared_m[w]);
  }
  float L = 0.f;
  float o = 0.f;
#pragma unroll
  for (int w = 0; w < WARPS; ++w) {
    const float f = shared_m[w] == -INFINITY ? 0.f : __expf(shared_m[w] - M);
    L += shared_l[w] * f;
    o += shared_o[w][t] * f;
  }
"#;

/// One block per head: the head's output, `out: [B, H, 1, D]`.
const WHOLE: &str = r#"
  out[static_cast<size_t>(bh) * D + t] = static_cast<T>(o / L);
"#;

/// Several blocks per head: block `s` leaves its unnormalised output and its maximum and sum in
/// the scratch `work`, as `parts: [B * H, S, D]` then `stats: [B * H, S, 2]` (a block whose share
/// is empty leaves -inf and 0), and the head's last block to finish, counted in `ctl[bh]` (which
/// it then zeroes), merges them into `out: [B, H, 1, D]`. Only the block's first `D` threads are
/// left (barrier 1).
const SPLIT: &str = r#"
  const int splits = gridDim.x;
  float* parts = const_cast<float*>(work);
  float* stats = parts + static_cast<size_t>(gridDim.y) * splits * D;
  const size_t part = static_cast<size_t>(bh) * splits + blockIdx.x;
  parts[part * D + t] = o;
  if (t == 0) {
    stats[part * 2] = M;
    stats[part * 2 + 1] = L;
  }
  __shared__ int s_last;
  int* counter = const_cast<int*>(ctl) + bh;
  asm volatile("bar.sync 1, %0;" :: "r"(D) : "memory");
  if (t == 0) {
    __threadfence();
    s_last = atomicAdd(counter, 1) == splits - 1;
    if (s_last) {
      __threadfence();
    }
  }
  asm volatile("bar.sync 1, %0;" :: "r"(D) : "memory");
  if (!s_last) {
    return;
  }
  const size_t head_parts = static_cast<size_t>(bh) * splits;
  float merged_m = -INFINITY;
  for (int s = 0; s < splits; ++s) {
    merged_m = fmaxf(merged_m, __ldcg(stats + (head_parts + s) * 2));
  }
  float merged_l = 0.f;
  float merged_o = 0.f;
  for (int s = 0; s < splits; ++s) {
    const float m = __ldcg(stats + (head_parts + s) * 2);
    const float f = m == -INFINITY ? 0.f : __expf(m - merged_m);
    merged_l += __ldcg(stats + (head_parts + s) * 2 + 1) * f;
    merged_o += __ldcg(parts + (head_parts + s) * D + t) * f;
  }
  out[static_cast<size_t>(bh) * D + t] = static_cast<T>(merged_o / merged_l);
  if (t == 0) {
    *counter = 0;
  }
"#;

/// The split kernel's name, which also names its counters ([`super::tasks::zeroed`]).
const SPLIT_NAME: &str = "lmx_decode_attention_split";

/// The name of the split kernel's scratch.
const SPLIT_WORK: &str = "lmx_decode_attention_split_work";

const INPUTS: &[&str] = &[
    "q",
    "k",
    "v",
    "position",
    "starts",
    "rope_offset",
    "inv_freq",
    "k_new",
    "v_new",
    "k_rope_offset",
    "k_inv_freq",
];

thread_local! {
    static WHOLE_KERNEL: Result<Kernel> = Kernel::new(
        "lmx_decode_attention",
        (INPUTS, Inputs::RowContiguous),
        &["out"],
        "",
        &format!("{SHARE}{WHOLE}"),
    );
    static SPLIT_KERNEL: Result<Kernel> = Kernel::new(
        SPLIT_NAME,
        (&[INPUTS, &["ctl", "work"]].concat(), Inputs::RowContiguous),
        &["out"],
        "",
        &format!("{SHARE}{SPLIT}"),
    );
}

/// Whether [`decode_attention`] takes these queries and buffers: one float query per row, a head
/// size of 32, 64, 128 or 256 (a warp's lanes then load whole, aligned packs), and query heads
/// a multiple of the buffers' heads.
pub(crate) fn decode_attention_fits(q: &Array, k: &Array, v: &Array) -> bool {
    use mlx_rs::Dtype::{Bfloat16, Float16, Float32};
    let (qs, ks) = (q.shape(), k.shape());
    qs.len() == 4
        && ks.len() == 4
        && qs[2] == 1
        && qs[0] == ks[0]
        && qs[3] == ks[3]
        && matches!(qs[3], 32 | 64 | 128 | 256)
        && ks[1] > 0
        && qs[1] % ks[1] == 0
        && v.shape() == ks
        && q.dtype() == k.dtype()
        && q.dtype() == v.dtype()
        && matches!(q.dtype(), Float32 | Float16 | Bfloat16)
}

/// Where the kernel reads a head-major input of one slot (`[B, heads, 1, D]`): row `b`'s heads
/// are `array`'s flat values from `b * row_stride + offset` on. A view of a decode step's product
/// (its query, key and value split, reshaped into heads and transposed, as a model writes
/// attention) is read in the product's output as it lies, so that MLX never evaluates the views:
/// each is an operation whose host time every token pays, though none launches a kernel
/// (docs/benchmarks.md, "Ninth session of 2026-11-29").
#[derive(Clone)]
struct HeadRows {
    array: Array,
    offset: i32,
    row_stride: i32,
}

impl HeadRows {
    /// Where `x`'s heads lie: in the array its views start from where they start on a whole head
    /// there (the kernel's loads stay aligned), else in `x`. The base is an operation's output
    /// that a decoding step has just made (a product's), row-contiguous once computed; an
    /// evaluated base that were not would be copied whole by MLX for the kernel.
    fn of(x: &Array) -> HeadRows {
        let (heads, d) = (x.shape()[1], x.shape()[3]);
        let on_heads = |n: i64| n % i64::from(d) == 0 && i32::try_from(n).is_ok();
        match crate::nn::view_rows::rows_of(x) {
            Some(rows) if on_heads(rows.offset) && on_heads(rows.row_stride) => {
                debug_assert!(rows.row_stride >= rows.offset + i64::from(heads * d));
                HeadRows {
                    array: rows.base,
                    offset: rows.offset as i32,
                    row_stride: rows.row_stride as i32,
                }
            }
            _ => HeadRows {
                array: x.clone(),
                offset: 0,
                row_stride: heads * d,
            },
        }
    }
}

/// A decode step's query or key before its rotation (RoPE, rotate-half, the whole head), which
/// [`decode_attention`] then rotates as it reads it: the `input`, the position `offset` (int32,
/// one value or one per row) and each pair's angle per position, `rates` (float32, `[D / 2]`).
pub(crate) struct Rotation {
    pub input: Array,
    pub offset: Array,
    pub rates: Array,
}

impl Rotation {
    /// Whether it stands for `x` (a query or key) in [`decode_attention`]: an input of `x`'s
    /// shape and dtype, a rate per pair of the head, an offset per row or one for all.
    pub(crate) fn fits(&self, x: &Array) -> bool {
        let (shape, rows) = (x.shape(), x.shape()[0] as usize);
        self.input.shape() == shape
            && self.input.dtype() == x.dtype()
            && self.rates.dtype() == Dtype::Float32
            && self.rates.shape() == [shape[3] / 2]
            && self.offset.dtype() == Dtype::Int32
            && self.offset.ndim() <= 1
            && (self.offset.size() == 1 || self.offset.size() == rows)
    }
}

/// The decoded token's own key and value (`[B, KVH, 1, D]`), which [`decode_attention`] writes
/// into the buffers at the query's slot as it attends, the key before its rotation where
/// `rotated_key` is given.
pub(crate) struct NewKeyValue<'a> {
    pub key: &'a Array,
    pub value: &'a Array,
    pub rotated_key: Option<Rotation>,
}

impl NewKeyValue<'_> {
    /// Whether [`decode_attention`] writes it into buffers `k` (of `k`'s dtype, one slot of their
    /// shape), its key's rotation fitting it.
    pub(crate) fn fits(&self, k: &Array) -> bool {
        let (ks, own) = (k.shape(), self.key.shape());
        own.len() == 4
            && own[0] == ks[0]
            && own[1] == ks[1]
            && own[2] == 1
            && own[3] == ks[3]
            && self.value.shape() == own
            && self.key.dtype() == k.dtype()
            && self.value.dtype() == k.dtype()
            && self.rotated_key.as_ref().is_none_or(|r| r.fits(self.key))
    }
}

/// `softmax(q k^T / sqrt(D)) v` of `q: [B, H, 1, D]` over the slots of `k`, `v: [B, KVH, C, D]`
/// that each row's query sees: from `starts[b]` (`[B]` int32; slot 0 for every row without them)
/// up to `position` (an int32 scalar, the query's slot), only its own slot where that is before
/// the row's start. Computed in float32 and returned in `q`'s dtype. Where `rotated` is given
/// (it [fits](Rotation::fits) `q`), the kernel reads the query before its rotation and rotates
/// it, to `q`'s numbers, so that the rotation is no operation of its own. Where `new` is given
/// (it [fits](NewKeyValue::fits) `k`), the kernel writes the token's key and value into `k` and
/// `v` at `position`, in place, and attends to them there: `k` and `v` must be buffers that
/// nothing else reads before this, row-contiguous (MLX would copy them otherwise), as a traced
/// decode step's are. Blocks that split a head leave their parts in scratch and count themselves
/// done on counters that this kernel's launches on one stream share ([`super::tasks::zeroed`]),
/// as a decoder's layers, a chain, can. Callers check [`decode_attention_fits`].
pub(crate) fn decode_attention(
    q: &Array,
    (k, v): (&Array, &Array),
    (position, starts): (&Array, Option<&Array>),
    rotated: Option<&Rotation>,
    new: Option<&NewKeyValue>,
) -> Result<Array> {
    let (rows, heads, head_dim) = (q.shape()[0], q.shape()[1], q.shape()[3]);
    let capacity = k.shape()[2];
    let dtype = q.dtype();
    let warps = warps(head_dim);
    let splits = splits(capacity, rows * heads, warps);
    let position = position.reshape(&[1])?.as_dtype(Dtype::Int32)?;
    let rotated_key = new.and_then(|new| new.rotated_key.as_ref());
    // What the kernel reads of the query: never a rotation's output it rotates itself, which
    // would then be computed.
    let query = HeadRows::of(rotated.map_or(q, |r| &r.input));
    // Without a new key and value the kernel reads none: the query stands in.
    let (key, value) = match new {
        Some(new) => (
            HeadRows::of(rotated_key.map_or(new.key, |r| &r.input)),
            HeadRows::of(new.value),
        ),
        None => (query.clone(), query.clone()),
    };
    // Without starts or rotations the kernel reads none: stand-ins of their types.
    let inputs = [
        query.array.clone(),
        k.clone(),
        v.clone(),
        position.clone(),
        match starts {
            Some(starts) => starts.as_dtype(Dtype::Int32)?,
            None => Array::from_int(0),
        },
        match rotated {
            Some(r) => r.offset.reshape(&[-1])?,
            None => position.clone(),
        },
        rotated.map_or_else(|| Array::from_f32(0.0), |r| r.rates.clone()),
        key.array.clone(),
        value.array.clone(),
        match rotated_key {
            Some(r) => r.offset.reshape(&[-1])?,
            None => position,
        },
        rotated_key.map_or_else(|| Array::from_f32(0.0), |r| r.rates.clone()),
    ];
    let template = [
        TemplateArg::Type("T", dtype),
        TemplateArg::Int("D", head_dim),
        TemplateArg::Int("HEADS", heads),
        TemplateArg::Int("WARPS", warps),
        TemplateArg::Int("UNROLL", UNROLL),
        TemplateArg::Int("HAS_STARTS", i32::from(starts.is_some())),
        TemplateArg::Int("ROPE_Q", i32::from(rotated.is_some())),
        TemplateArg::Int("WRITE", i32::from(new.is_some())),
        TemplateArg::Int("ROPE_K", i32::from(rotated_key.is_some())),
        TemplateArg::Int("Q_OFF", query.offset),
        TemplateArg::Int("Q_ROW", query.row_stride),
        TemplateArg::Int("K_OFF", key.offset),
        TemplateArg::Int("K_ROW", key.row_stride),
        TemplateArg::Int("V_OFF", value.offset),
        TemplateArg::Int("V_ROW", value.row_stride),
    ];
    let grid = (splits * warps * 32, rows * heads, 1);
    let block = (warps * 32, 1, 1);
    if splits == 1 {
        let mut out = with_kernel(&WHOLE_KERNEL, |kernel| {
            kernel.launch(
                &inputs,
                &Launch {
                    outputs: &[(q.shape(), dtype)],
                    grid,
                    block,
                    template: &template,
                },
            )
        })?;
        return Ok(out.remove(0));
    }
    // The counters and scratch a split launch shares with this kernel's other launches on the
    // stream (a decoder's layers, one after another): no outputs of its own to allocate.
    let heads = rows * heads;
    let mut inputs = inputs.to_vec();
    inputs.push(super::tasks::zeroed(SPLIT_NAME, heads, Dtype::Int32)?);
    inputs.push(super::tasks::zeroed(
        SPLIT_WORK,
        heads * splits * (head_dim + 2),
        Dtype::Float32,
    )?);
    let mut out = with_kernel(&SPLIT_KERNEL, |kernel| {
        kernel.launch(
            &inputs,
            &Launch {
                outputs: &[(q.shape(), dtype)],
                grid,
                block,
                template: &template,
            },
        )
    })?;
    Ok(out.remove(0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use mlx_rs::ops::indexing::IndexOp;

    /// A head's slots go to one block up to two passes of its loads, else to as many blocks as
    /// one pass each needs, within a wave of blocks, and never more than 1,024 slots a block.
    #[test]
    fn how_many_blocks_take_a_head() {
        // TinyLlama's 32 heads of 64 (32 warps, 128 slots a pass) as its cache grows.
        assert_eq!(splits(128, 32, 32), 1);
        assert_eq!(splits(256, 32, 32), 1);
        assert_eq!(splits(384, 32, 32), 3);
        assert_eq!(splits(512, 32, 32), 4);
        // A wave holds 4 blocks a head: longer caches take more passes a block.
        assert_eq!(splits(4096, 32, 32), 4);
        // GPT-2's 12 heads: 10 blocks a head fill a wave.
        assert_eq!(splits(4096, 12, 32), 10);
        // Eight rows of 32 heads: one block a head up to 1,024 slots, then more.
        assert_eq!(splits(1024, 256, 32), 1);
        assert_eq!(splits(2304, 256, 32), 3);
        // Heads of 128 (16 warps, 64 slots a pass), and the most blocks a head.
        assert_eq!(splits(192, 8, 16), 3);
        assert_eq!(splits(1 << 20, 1, 32), MAX_SPLITS);
    }

    /// GPT-2's query, key and value (one product's output of two rows split three ways, 12 heads
    /// of 64 each, transposed heads first) are read in that output, each third a row of 2,304
    /// apart; heads not on a head's boundary there, and arrays that are no view, are read as
    /// they are.
    #[test]
    fn heads_are_found_in_the_product() {
        use crate::test_arrays::normal;
        let product = normal(&[2, 1, 2304], Dtype::Bfloat16)
            .multiply(Array::from_f32(2.0).as_dtype(Dtype::Bfloat16).unwrap())
            .unwrap();
        let parts = mlx_rs::ops::split_equal(&product, 3, -1).unwrap();
        for (i, part) in parts.iter().enumerate() {
            let heads = part.reshape(&[2, 1, 12, 64]).unwrap();
            let heads = mlx_rs::ops::transpose_axes(&heads, &[0, 2, 1, 3]).unwrap();
            let rows = HeadRows::of(&heads);
            assert_eq!(rows.array.shape(), product.shape(), "part {i}");
            assert_eq!((rows.offset, rows.row_stride), (768 * i as i32, 2304));
        }
        // Heads starting 32 values into the product: not on a head of 64.
        let shifted = product.index((.., .., 32..800));
        let shifted = shifted.reshape(&[2, 1, 12, 64]).unwrap();
        let shifted = mlx_rs::ops::transpose_axes(&shifted, &[0, 2, 1, 3]).unwrap();
        let rows = HeadRows::of(&shifted);
        assert_eq!(rows.array.shape(), [2, 12, 1, 64]);
        assert_eq!((rows.offset, rows.row_stride), (0, 768));
        let own = normal(&[1, 4, 1, 32], Dtype::Float32);
        let rows = HeadRows::of(&own);
        assert_eq!((rows.offset, rows.row_stride), (0, 128));
    }
}
