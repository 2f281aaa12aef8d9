//! Rotary position embeddings in one pass that reads each value once and writes it once.
//!
//! A model rotates its queries and keys as `[B, heads, T, head_dim]`, a transposed view of the
//! projection's `[B, T, heads, head_dim]` output. MLX's kernel gives each thread one pair of one
//! position over up to four heads, reading and writing a value at a time, and writes its output
//! in its input's layout (docs/benchmarks.md times both). Here each thread takes a vector of
//! neighbouring pairs (`VEC` of each half of the head, 16 bytes) at one position for `HEADS`
//! heads, computing their angles once. The input is read where it lies, through its strides;
//! the output is laid out `[B, T, heads, head_dim]` and returned as the `[B, heads, T, head_dim]`
//! view of it, so the projections on either side of the rotation read and write it in place, in
//! the forward pass and in the backward one.

use super::kernel::{with_kernel, Inputs, Kernel, Launch, TemplateArg};
use super::sums::pack_width;
use crate::error::{Error, Result};
use mlx_rs::{Array, Dtype};

/// Pair `i` of a head at position `p` turns by `p * inv_freq[i]`, forward (`FORWARD = 1`) or back
/// (the backward pass). The position is `t + offset[b]` (`offset` of one value or one per row,
/// read through its stride, as every input here).
const BODY: &str = r#"
  struct alignas(sizeof(T) * VEC) Pack {
    T v[VEC];
  };
  const int rows = x_shape[0];
  const int heads = x_shape[1];
  const int length = x_shape[2];
  const int width = x_shape[3];
  const int half = width / 2;
  const int chunks = half / VEC;
  const int groups = (heads + HEADS - 1) / HEADS;
  size_t index = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (index >= static_cast<size_t>(rows) * length * groups * chunks) {
    return;
  }
  const int chunk = index % chunks;
  index /= chunks;
  const int group = index % groups;
  index /= groups;
  const int t = index % length;
  const int b = index / length;
  const float position =
      static_cast<float>(t + offset[offset_shape[0] == 1 ? 0 : b * offset_strides[0]]);
  float c[VEC];
  float s[VEC];
#pragma unroll
  for (int k = 0; k < VEC; ++k) {
    sincosf(position * inv_freq[chunk * VEC + k], &s[k], &c[k]);
    if (!FORWARD) {
      s[k] = -s[k];
    }
  }
  const int64_t step = x_strides[3];
  const int d = chunk * VEC;
  const bool packed = step == 1 &&
      (x_strides[0] % VEC | x_strides[1] % VEC | x_strides[2] % VEC | half % VEC) == 0 &&
      reinterpret_cast<size_t>(x) % sizeof(Pack) == 0;
  // This thread's heads are `group`, `group + groups`, ...: a warp's neighbouring groups read
  // and write neighbouring heads. Every head's loads are issued before any result is stored.
  Pack x1[HEADS];
  Pack x2[HEADS];
#pragma unroll
  for (int j = 0; j < HEADS; ++j) {
    const int h = group + j * groups;
    if (h < heads) {
      const T* in = x + b * x_strides[0] + h * x_strides[1] + t * x_strides[2];
      if (packed) {
        x1[j] = *reinterpret_cast<const Pack*>(in + d);
        x2[j] = *reinterpret_cast<const Pack*>(in + d + half);
      } else {
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
          x1[j].v[k] = in[(d + k) * step];
          x2[j].v[k] = in[(d + half + k) * step];
        }
      }
    }
  }
#pragma unroll
  for (int j = 0; j < HEADS; ++j) {
    const int h = group + j * groups;
    if (h < heads) {
      Pack y1;
      Pack y2;
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        const float a = static_cast<float>(x1[j].v[k]);
        const float e = static_cast<float>(x2[j].v[k]);
        y1.v[k] = static_cast<T>(a * c[k] - e * s[k]);
        y2.v[k] = static_cast<T>(a * s[k] + e * c[k]);
      }
      T* out = y + ((static_cast<size_t>(b) * length + t) * heads + h) * width;
      *reinterpret_cast<Pack*>(out + d) = y1;
      *reinterpret_cast<Pack*>(out + d + half) = y2;
    }
  }
"#;

thread_local! {
    static ROPE_KERNEL: Result<Kernel> = Kernel::new(
        "lmx_rope",
        (&["x", "offset", "inv_freq"], Inputs::AsTheyLie),
        &["y"],
        "",
        BODY,
    );
}

/// Threads per block.
const THREADS: i32 = 256;

/// Heads a thread rotates with the same angles.
const HEADS: i32 = 4;

/// Whether the kernel rotates `x` by `offset`: a floating-point `[B, heads, T, head_dim]` of at
/// most `i32::MAX` values, rotated whole (`dims` is the head size, even), not empty, and an int32
/// offset of one value or one per row.
pub(crate) fn rope_fits(x: &Array, dims: i32, offset: &Array) -> bool {
    use mlx_rs::Dtype::{Bfloat16, Float16, Float32};
    let shape = x.shape();
    matches!(x.dtype(), Float32 | Float16 | Bfloat16)
        && shape.len() == 4
        && dims == shape[3]
        && dims % 2 == 0
        && (1..=i32::MAX as usize).contains(&x.size())
        && offset.dtype() == Dtype::Int32
        && offset.ndim() <= 1
        && (offset.size() == 1 || offset.size() == shape[0] as usize)
}

/// `x` rotated forward (`forward`) or back by `offset + t` times `inv_freq` (float32, one angle
/// rate per pair), in `x`'s dtype and shape.
pub(crate) fn rope(x: &Array, offset: &Array, inv_freq: &Array, forward: bool) -> Result<Array> {
    let &[rows, heads, length, width] = x.shape() else {
        return Err(Error::Layout(format!(
            "lmx's RoPE kernel takes [B, heads, T, head_dim], not {:?}",
            x.shape()
        )));
    };
    let half = width / 2;
    let vec = [8, 4, 2, 1]
        .into_iter()
        .find(|&vec| vec <= pack_width(x.dtype()) && half % vec == 0)
        .unwrap_or(1);
    let threads = rows * length * ((heads + HEADS - 1) / HEADS) * (half / vec);
    // Of one position (decoding), `[B, 1, heads, head_dim]` lies as `[B, heads, 1, head_dim]`
    // does: the output is made in that shape, with no transposed view after it (each view is
    // an operation of the decode step's host time).
    let shape = if length == 1 {
        [rows, heads, length, width]
    } else {
        [rows, length, heads, width]
    };
    let mut outputs = with_kernel(&ROPE_KERNEL, |kernel| {
        kernel.launch(
            &[x.clone(), offset.reshape(&[-1])?, inv_freq.clone()],
            &Launch {
                outputs: &[(&shape, x.dtype())],
                grid: (threads, 1, 1),
                block: (THREADS, 1, 1),
                template: &[
                    TemplateArg::Type("T", x.dtype()),
                    TemplateArg::Int("VEC", vec),
                    TemplateArg::Int("HEADS", HEADS),
                    TemplateArg::Int("FORWARD", i32::from(forward)),
                ],
            },
        )
    })?;
    let y = outputs.remove(0);
    if length == 1 {
        return Ok(y);
    }
    Ok(y.transpose_axes(&[0, 2, 1, 3])?)
}
