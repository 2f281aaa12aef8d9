//! A pre-norm gated MLP in decoding, `res + down(f(gate(n)) * up(n))` with `n = rms_norm(x)`, as
//! one kernel.
//!
//! Decoding one token through such a block took three kernels (the norm, the gate and up
//! products, the down product over the gated input plus the residual), each an MLX operation
//! whose host time a token pays, and each a launch whose first and last microseconds leave the
//! memory idle. Here one launch does it all in two phases: every block computes the norm of `x`
//! into shared memory and takes tasks of 8 features of the gate and up products (the gated value
//! rounded to `T` into a scratch output), then tasks of 4 rows of the down product, each warp a
//! half row, the tasks taken in order by tickets ([`super::tasks`]). Values are rounded as the
//! separate kernels round them: the norm as MLX's (`w * T(x * r)`), the products to `T`,
//! the gated value once (`T(f(g) * u)`), then the down product and its sum with the residual.

use super::kernel::{Inputs, Kernel, Launch, TemplateArg};
use super::sums::pack_width;
use super::weights::{Format, Weight};
use crate::error::{Error, Result};
use crate::nn::Activation;
use mlx_rs::Array;

/// Threads per block: eight warps.
const THREADS: i32 = 256;

/// Blocks per launch: two per streaming multiprocessor of an H100 or H200 (132); a smaller GPU
/// runs them as it can (see the module's note).
const BLOCKS: i32 = 264;

/// A warp's 16-byte loads in flight per row stretch, at most (registers).
const MAX_LOADS: i32 = 8;

/// The static shared memory a kernel may declare (CUDA's limit without opting in): the block's
/// copy of the input or the gated values (`KX` values) and a few counters must fit.
const MAX_SHARED_BYTES: i64 = 48 * 1024;

/// The shared memory besides the `KX` values: the ticket and two floats a warp, with room.
const SHARED_OVERHEAD: i64 = 256;

thread_local! {
    /// The kernel over weights of each form.
    static KERNELS: [Result<Kernel>; 2] = Format::ALL.map(kernel);
}

fn kernel(format: Format) -> Result<Kernel> {
    let mut inputs = vec!["x".to_owned(), "nw".to_owned()];
    inputs.extend(["wg", "wu", "wd"].iter().flat_map(|w| format.inputs(w)));
    inputs.extend(["res".to_owned(), "ctl".to_owned()]);
    let inputs: Vec<&str> = inputs.iter().map(String::as_str).collect();
    let matrices = format!(
        "  using W = {};\n  const W mg = {};\n  const W mu = {};\n  const W md = {};\n",
        format.device_type(),
        format.matrix("wg"),
        format.matrix("wu"),
        format.matrix("wd"),
    );
    Kernel::new(
        "lmx_gated_mlp",
        (&inputs, Inputs::RowContiguous),
        &["y", "act"],
        &format!(
            "{}{}{}{}{}",
            super::activation::HEADER,
            super::matvec::HEADER,
            super::row_norm::HEADER,
            format.header(),
            super::tasks::HEADER
        ),
        &format!("{matrices}{BODY}"),
    )
}

/// The kernel's body, after the weights' matrices (`mg`, `mu`, `md`, of the device type `W`).
/// Template arguments: `T`, `D` (the model's width), `F` (the MLP's), `KX` (the larger), `ACT`
/// (the activation), `EPS_BITS` (the norm's epsilon's float bits) and packed weights' `BITS`
/// and `GS`.
const BODY: &str = r#"
  constexpr int WARPS = 8;
  constexpr int V = 16 / int(sizeof(T));
  constexpr int TG = F / 8;
  constexpr int TOTAL = TG + D / 4;
  const float eps = __int_as_float(EPS_BITS);
  int* control = const_cast<int*>(ctl);
  __shared__ int s_ticket;
  __shared__ __align__(16) T xs[KX];
  __shared__ float red[WARPS];
  __shared__ float s_y[WARPS];
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  int have = -1;
  // Whether every operand starts on a 16-byte boundary (rows of D and F values then do too).
  const bool aligned = ((reinterpret_cast<size_t>(x) | reinterpret_cast<size_t>(nw)) % 16) == 0 &&
                       mg.aligned() && mu.aligned() && md.aligned();
  if (threadIdx.x == 0) {
    s_ticket = atomicAdd(control, 1);
  }
  __syncthreads();
  int t = s_ticket;
  while (t < TOTAL) {
    __syncthreads();
    // The next ticket, asked for now and waited for at the task's end.
    int claimed = 0;
    if (threadIdx.x == 0) {
      claimed = atomicAdd(control, 1);
    }
    if (t < TG) {
      const int f = t * 8 + warp;
      lmx_task_rows<W, D> w;
      w.load(mg.at(f, D, 0), mu.at(f, D, 0), lane, aligned);
      if (have != 0) {
        lmx_norm_row<T, D, WARPS, false, false>(x, nw, nw, xs, eps, red, aligned);
        have = 0;
      }
      float g, u;
      w.dot(xs, xs, lane, g, u);
      if (lane == 0) {
        const float gr = static_cast<float>(static_cast<T>(g));
        const float ur = static_cast<float>(static_cast<T>(u));
        act[f] = static_cast<T>(lmx_activation<ACT>(gr) * ur);
      }
    } else {
      // Row `row` of the down product, this warp's half of it as two quarters.
      const int row = (t - TG) * 4 + warp / 2;
      const int half = (warp & 1) * (F / 2);
      lmx_task_rows<W, F / 4> w;
      w.load(md.at(row, F, half), md.at(row, F, half + F / 4), lane, aligned);
      // Every gated value written.
      lmx_task_wait(ctl + 64, TG);
      __syncthreads();
      if (have != 1) {
        constexpr int NV = F / V;
        constexpr int PER = (NV + WARPS * 32 - 1) / (WARPS * 32);
        uint4 a[PER];
#pragma unroll
        for (int k = 0; k < PER; ++k) {
          const int i = k * WARPS * 32 + threadIdx.x;
          if (i < NV) a[k] = __ldcg(reinterpret_cast<const uint4*>(act) + i);
        }
#pragma unroll
        for (int k = 0; k < PER; ++k) {
          const int i = k * WARPS * 32 + threadIdx.x;
          if (i < NV) reinterpret_cast<uint4*>(xs)[i] = a[k];
        }
        __syncthreads();
        have = 1;
      }
      float a0, a1;
      w.dot(xs + half, xs + half + F / 4, lane, a0, a1);
      if (lane == 0) {
        s_y[warp] = a0 + a1;
      }
      __syncthreads();
      if (lane == 0 && (warp & 1) == 0) {
        const float product = static_cast<float>(static_cast<T>(s_y[warp] + s_y[warp + 1]));
        y[row] = static_cast<T>(static_cast<float>(res[row]) + product);
      }
    }
    if (threadIdx.x == 0) {
      s_ticket = claimed;
    }
    __syncthreads();
    // A gated task counts as done once its values are visible to every block: the barrier
    // orders the block's writes before thread 0's fence, which orders them before the count.
    if (threadIdx.x == 0 && t < TG) {
      __threadfence();
      atomicAdd(control + 64, 1);
    }
    t = s_ticket;
  }
  lmx_task_leave<3>(control);
"#;

/// A pre-norm gated MLP over one row: `res + down(f(gate(n)) * up(n))`, `n = rms_norm(x) * norm`.
pub(crate) struct GatedMlp<'a> {
    pub x: &'a Array,
    pub norm: &'a Array,
    pub eps: f32,
    pub activation: Activation,
    pub gate: Weight<'a>,
    pub up: Weight<'a>,
    pub down: Weight<'a>,
    pub residual: &'a Array,
}

impl GatedMlp<'_> {
    /// Whether the kernel takes it: one row `x` of width `D` and a residual of its shape, a
    /// norm `[D]`, gate and up `[F, D]`, down `[D, F]`, of one form that reads `x`'s dtype
    /// ([`Weight::fits`]); `D` a whole number of 16-byte vectors and of 4 rows, `F` of four
    /// weight chunks (the down product's quarters), each row stretch at most [`MAX_LOADS`]
    /// chunks a lane (a packed chunk holds more values than a dense one, so packed layers may be
    /// wider), the wider of `D` and `F` within [`MAX_SHARED_BYTES`].
    pub(crate) fn fits(&self) -> bool {
        let dtype = self.x.dtype();
        let Some(&d) = self.x.shape().last() else {
            return false;
        };
        let f = self.gate.features();
        let chunk = self.gate.chunk(dtype);
        let lanes = |k: i32| (k / chunk + 31) / 32;
        let shaped = |w: Weight, (features, width): (i32, i32)| {
            w.features() == features && w.width() == width && w.fits(dtype)
        };
        self.x.size() as i32 == d
            && self.residual.shape() == self.x.shape()
            && self.residual.dtype() == dtype
            && self.norm.shape() == [d]
            && self.norm.dtype() == dtype
            && shaped(self.gate, (f, d))
            && shaped(self.up, (f, d))
            && shaped(self.down, (d, f))
            && Weight::alike(&[self.gate, self.up, self.down])
            && d > 0
            && f > 0
            && d % pack_width(dtype) == 0
            && d % 4 == 0
            && f % (4 * chunk) == 0
            && lanes(d) <= MAX_LOADS
            && lanes(f / 4) <= MAX_LOADS
            && i64::from(d.max(f)) * self.x.item_size() as i64 + SHARED_OVERHEAD <= MAX_SHARED_BYTES
    }

    /// The block's output, shaped as `x`. Callers check [`fits`](Self::fits).
    pub(crate) fn apply(&self) -> Result<Array> {
        let d = *self.x.shape().last().unwrap_or(&1);
        let f = self.gate.features();
        let mut inputs = vec![self.x.clone(), self.norm.clone()];
        for weight in [self.gate, self.up, self.down] {
            inputs.extend(weight.arrays());
        }
        inputs.extend([
            self.residual.clone(),
            super::tasks::control("lmx_gated_mlp")?,
        ]);
        let mut template = vec![
            TemplateArg::Type("T", self.x.dtype()),
            TemplateArg::Int("D", d),
            TemplateArg::Int("F", f),
            TemplateArg::Int("KX", d.max(f)),
            TemplateArg::Int("ACT", self.activation as i32),
            TemplateArg::Int("EPS_BITS", self.eps.to_bits() as i32),
        ];
        template.extend(self.gate.template());
        let tasks = f / 8 + d / 4;
        let outputs = KERNELS.with(|kernels| {
            let kernel = kernels[self.gate.format() as usize]
                .as_ref()
                .map_err(|err| Error::Layout(err.to_string()))?;
            kernel.launch(
                &inputs,
                &Launch {
                    outputs: &[(self.x.shape(), self.x.dtype()), (&[f], self.x.dtype())],
                    grid: (BLOCKS.min(tasks) * THREADS, 1, 1),
                    block: (THREADS, 1, 1),
                    template: &template,
                },
            )
        })?;
        outputs
            .into_iter()
            .next()
            .ok_or_else(|| Error::Layout("the gated MLP kernel made no output".into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_arrays::normal;
    use mlx_rs::Dtype;

    /// TinyLlama's block fits dense and packed in 4 bits; a 4-bit block of Llama-3-70B's size
    /// (8,192 by 28,672), whose rows fit the loads, does not: its gated values would overflow
    /// the shared memory (in float32 from 12,288 gated values on); nor gates of another form
    /// than the down projection's.
    #[test]
    fn what_fits() {
        let bf = Dtype::Bfloat16;
        // Packed words, scales and offsets of the shapes 4 bits by 64 make (values unread).
        let packed = |features: i32, width: i32, dtype: Dtype| {
            let zeros =
                |shape: &[i32], dtype: Dtype| mlx_rs::ops::zeros_dtype(shape, dtype).unwrap();
            [
                zeros(&[features, width / 8], Dtype::Uint32),
                zeros(&[features, width / 64], dtype),
                zeros(&[features, width / 64], dtype),
            ]
        };
        fn affine(p: &[Array; 3]) -> Weight<'_> {
            Weight::Affine {
                packed: &p[0],
                scales: &p[1],
                biases: &p[2],
                bits: 4,
                group_size: 64,
            }
        }
        let fits = |d: i32, dtype: Dtype, parts: [Weight; 3]| {
            let (x, norm) = (normal(&[1, 1, d], dtype), normal(&[d], dtype));
            GatedMlp {
                x: &x,
                norm: &norm,
                eps: 1e-5,
                activation: Activation::Silu,
                gate: parts[0],
                up: parts[1],
                down: parts[2],
                residual: &x,
            }
            .fits()
        };
        let (gate, down) = (normal(&[5632, 2048], bf), normal(&[2048, 5632], bf));
        let dense = [
            Weight::Dense(&gate),
            Weight::Dense(&gate),
            Weight::Dense(&down),
        ];
        assert!(fits(2048, bf, dense), "TinyLlama dense");
        let (g4, d4) = (packed(5632, 2048, bf), packed(2048, 5632, bf));
        assert!(
            fits(2048, bf, [affine(&g4), affine(&g4), affine(&d4)]),
            "TinyLlama 4-bit"
        );
        let mixed = [affine(&g4), affine(&g4), Weight::Dense(&down)];
        assert!(!fits(2048, bf, mixed), "mixed forms");
        let (g70, d70) = (packed(28672, 8192, bf), packed(8192, 28672, bf));
        let large = [affine(&g70), affine(&g70), affine(&d70)];
        assert!(!fits(8192, bf, large), "70B 4-bit");
        let f32 = Dtype::Float32;
        for (f, fit) in [(12160, true), (12288, false)] {
            let (g, d) = (packed(f, 2048, f32), packed(2048, f, f32));
            let parts = [affine(&g), affine(&g), affine(&d)];
            assert_eq!(fits(2048, f32, parts), fit, "float32 F = {f}");
        }
    }
}
