//! One row's norm, computed by every block of a decoding kernel into its shared memory, so that
//! the norm before a product is no kernel (and no MLX operation) of its own.
//!
//! A decoded token's pre-norm blocks normalise one row and multiply it by the next layers'
//! weights. Each block of the product's kernel reads the row (a few kilobytes, from L2 after the
//! first block) and normalises it as MLX's kernels do, rounding where they round: an RMS norm as
//! `w * T(x * r)`, a layer norm as `w * T((x - mean) * r) + b`, the sums in float32 (MLX's
//! `rms_norm.cu` and `layer_norm.cu`).

use super::kernel::TemplateArg;
use super::sums::pack_width;
use mlx_rs::Array;

/// Which normalisation a [`RowNorm`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum NormKind {
    /// `rms_norm(x) * weight`.
    Rms,
    /// `layer_norm(x) * weight (+ bias)`.
    Layer,
}

/// A one-row norm a kernel applies to its input as it reads it.
#[derive(Clone, Debug)]
pub(crate) struct RowNorm {
    pub kind: NormKind,
    pub weight: Array,
    pub bias: Option<Array>,
    pub eps: f32,
}

impl RowNorm {
    /// Whether a kernel applies it to `x`: one row of `D` values, a whole number of 16-byte
    /// vectors, within `max_bytes`; a weight (and, for a layer norm, a bias) `[D]` of `x`'s dtype;
    /// an RMS norm without a bias.
    pub(crate) fn fits(&self, x: &Array, max_bytes: i64) -> bool {
        let dtype = x.dtype();
        let Some(&d) = x.shape().last() else {
            return false;
        };
        let vector_fits = |v: &Array| v.shape() == [d] && v.dtype() == dtype;
        let bias_fits = match (self.kind, &self.bias) {
            (NormKind::Rms, Some(_)) => false,
            (_, bias) => bias.as_ref().is_none_or(vector_fits),
        };
        d > 0
            && x.size() as i32 == d
            && d % pack_width(dtype) == 0
            && x.nbytes() as i64 <= max_bytes
            && vector_fits(&self.weight)
            && bias_fits
    }

    /// The arrays a kernel reads besides the row: the weight, then the bias where there is one.
    pub(crate) fn arrays(&self) -> impl Iterator<Item = Array> + '_ {
        std::iter::once(self.weight.clone()).chain(self.bias.clone())
    }

    /// The template arguments a kernel passes to [`HEADER`]'s `lmx_norm_row` as its centring and
    /// shift (`CENTER`, a layer norm; `SHIFT`, with a bias).
    pub(crate) fn form(&self) -> [TemplateArg; 2] {
        [
            TemplateArg::Int("CENTER", i32::from(self.kind == NormKind::Layer)),
            TemplateArg::Int("SHIFT", i32::from(self.bias.is_some())),
        ]
    }

    /// The template argument a kernel reads epsilon from (`EPS_BITS`, its float bits).
    pub(crate) fn epsilon(&self) -> TemplateArg {
        TemplateArg::Int("EPS_BITS", self.eps.to_bits() as i32)
    }
}

/// Device helpers: a warp's and a block's sums, and one row's norm over `D` values of `T`
/// (`lmx_norm_row`: an RMS or a layer norm), written to shared memory by every thread of a block
/// of `WARPS` warps (`red` holds `WARPS` floats of shared memory): every thread's loads first,
/// then the block's sums. Needs [`super::matvec::HEADER`] before it.
pub(super) const HEADER: &str = r#"
__device__ __forceinline__ float lmx_warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o /= 2) {
    v += __shfl_xor_sync(0xffffffff, v, o);
  }
  return v;
}

template <int WARPS>
__device__ __forceinline__ float lmx_block_sum(float v, float* red) {
  v = lmx_warp_sum(v);
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  __syncthreads();
  float s = 0.0f;
#pragma unroll
  for (int i = 0; i < WARPS; ++i) s += red[i];
  __syncthreads();
  return s;
}

// `xs = norm(x) * nw (+ nb)`: with `CENTER` a layer norm (`w * T((x - mean) * r) + b`, `b` read
// where `BIAS`), else an RMS norm (`w * T(x * r)`: the mean taken as 0, which leaves every value
// as it is).
template <typename T, int D, int WARPS, bool CENTER, bool BIAS>
__device__ __forceinline__ void lmx_norm_row(
    const T* x, const T* nw, const T* nb, T* xs, float eps, float* red, bool aligned) {
  constexpr int V = 16 / int(sizeof(T));
  constexpr int NV = D / V;
  constexpr int PER = (NV + WARPS * 32 - 1) / (WARPS * 32);
  uint4 xv[PER], nv[PER], bv[PER];
#pragma unroll
  for (int k = 0; k < PER; ++k) {
    const int i = k * WARPS * 32 + threadIdx.x;
    if (i < NV) {
      xv[k] = lmx_matvec_load<T, V>(x + size_t(i) * V, aligned);
      nv[k] = lmx_matvec_load<T, V>(nw + size_t(i) * V, aligned);
      if (BIAS) bv[k] = lmx_matvec_load<T, V>(nb + size_t(i) * V, aligned);
    }
  }
  float mean = 0.0f;
  if (CENTER) {
    float s = 0.0f;
#pragma unroll
    for (int k = 0; k < PER; ++k) {
      if (k * WARPS * 32 + threadIdx.x < NV) {
        const T* v = reinterpret_cast<const T*>(&xv[k]);
#pragma unroll
        for (int j = 0; j < V; ++j) s += static_cast<float>(v[j]);
      }
    }
    mean = lmx_block_sum<WARPS>(s, red) / float(D);
  }
  float ss = 0.0f;
#pragma unroll
  for (int k = 0; k < PER; ++k) {
    if (k * WARPS * 32 + threadIdx.x < NV) {
      const T* v = reinterpret_cast<const T*>(&xv[k]);
#pragma unroll
      for (int j = 0; j < V; ++j) {
        const float t = static_cast<float>(v[j]) - mean;
        ss += t * t;
      }
    }
  }
  const float r = rsqrtf(lmx_block_sum<WARPS>(ss, red) / float(D) + eps);
#pragma unroll
  for (int k = 0; k < PER; ++k) {
    const int i = k * WARPS * 32 + threadIdx.x;
    if (i < NV) {
      const T* v = reinterpret_cast<const T*>(&xv[k]);
      const T* n = reinterpret_cast<const T*>(&nv[k]);
      const T* b = reinterpret_cast<const T*>(&bv[k]);
      uint4 packed;
      T* o = reinterpret_cast<T*>(&packed);
#pragma unroll
      for (int j = 0; j < V; ++j) {
        const T scaled = n[j] * static_cast<T>((static_cast<float>(v[j]) - mean) * r);
        o[j] = BIAS ? static_cast<T>(scaled + b[j]) : scaled;
      }
      reinterpret_cast<uint4*>(xs)[i] = packed;
    }
  }
  __syncthreads();
}
"#;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_arrays::normal;
    use mlx_rs::Dtype;

    /// A kernel takes one row whose width is whole 16-byte vectors within its bytes, a weight
    /// (and a layer norm's bias) of the row's width and dtype; not an RMS norm with a bias, rows
    /// of several, a width of part of a vector, a wider row, or another dtype.
    #[test]
    fn what_fits() {
        let bf = Dtype::Bfloat16;
        let norm = |kind, d: i32, bias: bool, dtype| RowNorm {
            kind,
            weight: normal(&[d], dtype),
            bias: bias.then(|| normal(&[d], dtype)),
            eps: 1e-5,
        };
        let row = |d: i32| normal(&[1, 1, d], bf);
        let max = 32 * 1024;
        assert!(norm(NormKind::Rms, 2048, false, bf).fits(&row(2048), max));
        assert!(norm(NormKind::Layer, 768, true, bf).fits(&row(768), max));
        assert!(norm(NormKind::Layer, 768, false, bf).fits(&row(768), max));
        assert!(
            !norm(NormKind::Rms, 768, true, bf).fits(&row(768), max),
            "RMS with a bias"
        );
        let rows = normal(&[2, 1, 768], bf);
        assert!(
            !norm(NormKind::Layer, 768, true, bf).fits(&rows, max),
            "two rows"
        );
        assert!(
            !norm(NormKind::Rms, 100, false, bf).fits(&row(100), max),
            "part of a vector"
        );
        assert!(norm(NormKind::Rms, 16384, false, bf).fits(&row(16384), max));
        assert!(
            !norm(NormKind::Rms, 16392, false, bf).fits(&row(16392), max),
            "over 32 KiB"
        );
        let f32_weight = norm(NormKind::Rms, 768, false, Dtype::Float32);
        assert!(
            !f32_weight.fits(&row(768), max),
            "a float32 weight of a bfloat16 row"
        );
        assert!(
            !norm(NormKind::Rms, 512, false, bf).fits(&row(768), max),
            "another width"
        );
    }
}
