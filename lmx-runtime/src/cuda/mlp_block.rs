//! A pre-norm MLP block in decoding as one kernel, `h + down(mlp(norm(h)))`, gated
//! (`f(gate(n)) * up(n)`) or plain (`f(fc(n) + b)`), and where attention's output projection
//! leads it, that projection too: `h = r + proj(a) (+ b)`.
//!
//! Decoding one token through such a block took four kernels (the output projection and its
//! residual sum, the norm, the first products, the down product over the activated input plus
//! the residual), each an MLX operation whose host time a token pays, and each a launch whose
//! first and last microseconds leave the memory idle. Here one launch does it all in up to three
//! phases, taken in order by tickets ([`super::tasks`]): tasks of 4 rows of the output
//! projection, each warp a half row (the sum `h` into a scratch output); then every block
//! computes the norm of `h` into shared memory and takes tasks of 8 features of the gate and up
//! products (16 of a plain MLP's first product), the activated value rounded to `T` into a
//! scratch output; then tasks of 4 rows of the down product, each warp a half row. Values are
//! rounded as the separate kernels round them (the sums' order aside): the projection and its
//! sum as the matrix-vector kernel's (`T(r + T(p + b))`), the norm as MLX's, the products to `T`
//! (with their biases), the activated value once (`T(f(g) * u)`, `T(f(T(p + b)))`), then the down
//! product and its sum with the residual.

use super::kernel::{Inputs, Kernel, Launch, TemplateArg};
use super::row_norm::RowNorm;
use super::sums::pack_width;
use super::weights::{Format, Weight};
use crate::error::{Error, Result};
use crate::nn::Activation;
use mlx_rs::Array;

/// Threads per block: eight warps.
const THREADS: i32 = 256;

/// Blocks resident on each streaming multiprocessor at once, which the kernel's registers are
/// bounded for ([`super::kernel::launch_bounds`]).
const BLOCKS_PER_SM: i32 = 2;

/// Blocks per launch: two per streaming multiprocessor of an H100 or H200 (132); a smaller GPU
/// runs them as it can (see [`super::tasks`]).
const BLOCKS: i32 = 132 * BLOCKS_PER_SM;

/// A warp's 16-byte loads in flight per row stretch, at most (registers).
const MAX_LOADS: i32 = 8;

/// The static shared memory a kernel may declare (CUDA's limit without opting in): the block's
/// copy of its input, the norm's output or the activated values (`KX` values) and a few counters
/// must fit.
const MAX_SHARED_BYTES: i64 = 48 * 1024;

/// The shared memory besides the `KX` values: the ticket and two floats a warp, with room.
const SHARED_OVERHEAD: i64 = 256;

thread_local! {
    /// The kernel over weights of each form.
    static KERNELS: [Result<Kernel>; 2] = Format::ALL.map(kernel);
}

/// Device helper of the projection's and the down product's tasks: a row's dot product with
/// `x` (its half at `x`, as two quarters of `quarter` values), each warp of a pair one half; the
/// pair's sum (the even warp's half first), for every thread of both warps. A barrier of the
/// block: every warp calls it.
const PAIR_DOT: &str = r#"
template <typename Rows, typename T>
__device__ __forceinline__ float lmx_pair_dot(
    Rows& w, const T* x, int quarter, int lane, int warp, float* s_y) {
  float a0, a1;
  w.dot(x, x + quarter, lane, a0, a1);
  if (lane == 0) {
    s_y[warp] = a0 + a1;
  }
  __syncthreads();
  return s_y[warp & ~1] + s_y[warp | 1];
}
"#;

fn kernel(format: Format) -> Result<Kernel> {
    let mut inputs = vec!["x".to_owned(), "r0".to_owned()];
    inputs.extend(format.inputs("wo"));
    inputs.extend(["bo", "nw", "nb"].map(str::to_owned));
    inputs.extend(["wg", "wu"].iter().flat_map(|w| format.inputs(w)));
    inputs.push("bg".to_owned());
    inputs.extend(format.inputs("wd"));
    inputs.extend(["bd", "res", "ctl"].map(str::to_owned));
    let inputs: Vec<&str> = inputs.iter().map(String::as_str).collect();
    let matrices = format!(
        "  using W = {};\n  const W mo = {};\n  const W mg = {};\n  const W mu = {};\n  const W md = {};\n",
        format.device_type(),
        format.matrix("wo"),
        format.matrix("wg"),
        format.matrix("wu"),
        format.matrix("wd"),
    );
    Kernel::new(
        "lmx_mlp_block",
        (&inputs, Inputs::RowContiguous),
        &["y", "act", "h"],
        &format!(
            "{}{}{}{}{}{PAIR_DOT}{}",
            super::activation::HEADER,
            super::matvec::HEADER,
            super::row_norm::HEADER,
            format.header(),
            super::tasks::HEADER,
            super::kernel::launch_bounds(THREADS, BLOCKS_PER_SM),
        ),
        &format!("{matrices}{BODY}"),
    )
}

/// The kernel's body, after the weights' matrices (`mo`, `mg`, `mu`, `md`, of the device type
/// `W`). Template arguments: `T`; `D` (the model's width), `DA` (the projection's input width;
/// without a projection, any width whose quarters are whole chunks), `F` (the MLP's), `KX` (the
/// widest); `LEAD` (whether the output projection leads), `GATED`, `ACT` (the activation),
/// `CENTER` and `SHIFT` (the norm's form, [`RowNorm::form`]), `EPS_BITS` (the norm's epsilon's
/// float bits), `BO`, `BG` and `BD` (whether the projection, the first product and the down
/// product have biases); packed weights' `BITS` and `GS`. Inputs a block does not use are other
/// arrays of the right types, never read.
const BODY: &str = r#"
  constexpr int WARPS = 8;
  constexpr int V = 16 / int(sizeof(T));
  constexpr int TA = LEAD ? D / 4 : 0;
  constexpr int TG = GATED ? F / 8 : F / 16;
  constexpr int TOTAL = TA + TG + D / 4;
  const float eps = __int_as_float(EPS_BITS);
  int* control = const_cast<int*>(ctl);
  __shared__ int s_ticket;
  __shared__ __align__(16) T xs[KX];
  __shared__ float red[WARPS];
  __shared__ float s_y[WARPS];
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  int have = -1;
  // Whether every operand starts on a 16-byte boundary (rows of DA, D and F values then do too;
  // `h` is an output, so aligned).
  const bool aligned = ((reinterpret_cast<size_t>(x) | reinterpret_cast<size_t>(r0) |
                         reinterpret_cast<size_t>(nw) | reinterpret_cast<size_t>(nb) |
                         reinterpret_cast<size_t>(res)) % 16) == 0 &&
                       mo.aligned() && mg.aligned() && mu.aligned() && md.aligned();
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
    if (t < TA) {
      // Row `row` of the output projection, this warp's half of it as two quarters.
      const int row = t * 4 + warp / 2;
      const int half = (warp & 1) * (DA / 2);
      lmx_task_rows<W, DA / 4> w;
      w.load(mo.at(row, DA, half), mo.at(row, DA, half + DA / 4), lane, aligned);
      if (have != 2) {
        for (int i = threadIdx.x; i < DA / V; i += WARPS * 32) {
          reinterpret_cast<uint4*>(xs)[i] = lmx_matvec_load<T, V>(x + size_t(i) * V, aligned);
        }
        __syncthreads();
        have = 2;
      }
      const float sum = lmx_pair_dot(w, xs + half, DA / 4, lane, warp, s_y);
      if (lane == 0 && (warp & 1) == 0) {
        const float bias = BO ? static_cast<float>(bo[row]) : 0.0f;
        const float product = static_cast<float>(static_cast<T>(sum + bias));
        h[row] = static_cast<T>(static_cast<float>(r0[row]) + product);
      }
    } else if (t < TA + TG) {
      // Gated: feature `f` of the gate and up products. Plain: features `f` and `f + 8`.
      const int f = GATED ? (t - TA) * 8 + warp : (t - TA) * 16 + warp;
      const int f1 = GATED ? f : f + 8;
      lmx_task_rows<W, D> w;
      w.load(mg.at(f, D, 0), GATED ? mu.at(f, D, 0) : mg.at(f1, D, 0), lane, aligned);
      if (have != 0) {
        if (LEAD) {
          // Every row of `h` written; read around L1, which other blocks' writes bypass.
          lmx_task_wait(ctl + 96, TA);
          __syncthreads();
          for (int i = threadIdx.x; i < D / V; i += WARPS * 32) {
            reinterpret_cast<uint4*>(xs)[i] = __ldcg(reinterpret_cast<const uint4*>(h) + i);
          }
          __syncthreads();
        }
        const T* in = LEAD ? xs : x;
        lmx_norm_row<T, D, WARPS, CENTER != 0, SHIFT != 0>(in, nw, nb, xs, eps, red, aligned);
        have = 0;
      }
      float g, u;
      w.dot(xs, xs, lane, g, u);
      if (lane == 0) {
        if (GATED) {
          const float gr = static_cast<float>(static_cast<T>(g));
          const float ur = static_cast<float>(static_cast<T>(u));
          act[f] = static_cast<T>(lmx_activation<ACT>(gr) * ur);
        } else {
          const float b0 = BG ? static_cast<float>(bg[f]) : 0.0f;
          const float b1 = BG ? static_cast<float>(bg[f1]) : 0.0f;
          act[f] = static_cast<T>(lmx_activation<ACT>(static_cast<float>(static_cast<T>(g + b0))));
          act[f1] = static_cast<T>(lmx_activation<ACT>(static_cast<float>(static_cast<T>(u + b1))));
        }
      }
    } else {
      // Row `row` of the down product, this warp's half of it as two quarters.
      const int row = (t - TA - TG) * 4 + warp / 2;
      const int half = (warp & 1) * (F / 2);
      lmx_task_rows<W, F / 4> w;
      w.load(md.at(row, F, half), md.at(row, F, half + F / 4), lane, aligned);
      // Every activated value written.
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
      const float sum = lmx_pair_dot(w, xs + half, F / 4, lane, warp, s_y);
      if (lane == 0 && (warp & 1) == 0) {
        const float bias = BD ? static_cast<float>(bd[row]) : 0.0f;
        const float product = static_cast<float>(static_cast<T>(sum + bias));
        const float r = LEAD ? static_cast<float>(__ldcg(h + row)) : static_cast<float>(res[row]);
        y[row] = static_cast<T>(r + product);
      }
    }
    if (threadIdx.x == 0) {
      s_ticket = claimed;
    }
    __syncthreads();
    // A projection's or an activated task counts as done once its values are visible to every
    // block: the barrier orders the block's writes before thread 0's fence, which orders them
    // before the count.
    if (threadIdx.x == 0 && t < TA + TG) {
      __threadfence();
      atomicAdd(control + (t < TA ? 96 : 64), 1);
    }
    t = s_ticket;
  }
  lmx_task_leave<4>(control);
"#;

/// What the block's norm reads.
#[derive(Clone, Copy)]
pub(crate) enum BlockInput<'a> {
    /// The row `x`, the down product's sum with `residual`.
    Row { x: &'a Array, residual: &'a Array },
    /// `h = residual + weight(x) (+ bias)`, attention's output projection and its residual sum,
    /// which the down product's output is also added to.
    Projected {
        x: &'a Array,
        weight: Weight<'a>,
        bias: Option<&'a Array>,
        residual: &'a Array,
    },
}

/// The block's first products: a gated MLP's gate and up, or a plain MLP's one layer.
#[derive(Clone, Copy)]
pub(crate) enum FirstProducts<'a> {
    Gated {
        gate: Weight<'a>,
        up: Weight<'a>,
    },
    Plain {
        fc: Weight<'a>,
        bias: Option<&'a Array>,
    },
}

/// A pre-norm MLP block over one row: `residual + down(mlp(norm(h))) (+ bias)`, `h` the input
/// row (and `residual` its own), or a projection's sum, which is then the residual too
/// ([`BlockInput`]).
pub(crate) struct MlpBlock<'a> {
    pub input: BlockInput<'a>,
    pub norm: &'a RowNorm,
    pub activation: Activation,
    pub first: FirstProducts<'a>,
    pub down: Weight<'a>,
    pub down_bias: Option<&'a Array>,
}

impl MlpBlock<'_> {
    /// The row whose shape and dtype the block's rows have: its input `h`, or the projection's
    /// residual (which `h` is a sum with).
    fn row(&self) -> &Array {
        match self.input {
            BlockInput::Row { x, .. } | BlockInput::Projected { residual: x, .. } => x,
        }
    }

    /// The weights, in the order the kernel takes them (a missing projection's or up product's
    /// place taken by the first product's weight).
    fn weights(&self) -> [Weight<'_>; 4] {
        let (gate, up) = match self.first {
            FirstProducts::Gated { gate, up } => (gate, up),
            FirstProducts::Plain { fc, .. } => (fc, fc),
        };
        let lead = match self.input {
            BlockInput::Projected { weight, .. } => weight,
            BlockInput::Row { .. } => gate,
        };
        [lead, gate, up, self.down]
    }

    /// Whether the kernel takes it: a row `h` of width `D` (a whole number of 16-byte vectors and
    /// of 4 rows) and a residual of its shape and dtype; a projection `[D, DA]` of a row of `DA`
    /// values; a norm `fits` `h`; gate and up (or fc) `[F, D]`, down `[D, F]`; the weights of one
    /// form that reads the row's dtype ([`Weight::fits`]), `F` and `DA` of four weight chunks
    /// (the down product's and projection's quarters; so `F` of 16 features, a plain MLP's
    /// task), each row stretch at most [`MAX_LOADS`] chunks a lane (a packed chunk holds more
    /// values than a dense one, so packed layers may be wider), the widest of `DA`, `D` and `F`
    /// within [`MAX_SHARED_BYTES`]; biases of their layers' features and the row's dtype.
    pub(crate) fn fits(&self) -> bool {
        let h = self.row();
        let dtype = h.dtype();
        let Some(&d) = h.shape().last() else {
            return false;
        };
        let f = self.down.width();
        let chunk = self.down.chunk(dtype);
        let lanes = |k: i32| (k / chunk + 31) / 32;
        let shaped = |w: Weight, (features, width): (i32, i32)| {
            w.features() == features && w.width() == width && w.fits(dtype)
        };
        let vector = |v: &Array, n: i32| v.shape() == [n] && v.dtype() == dtype;
        let row_of = |v: &Array, n: i32| v.size() as i32 == n && v.dtype() == dtype;
        let lead = match self.input {
            BlockInput::Row { x, residual } => {
                x.shape() == residual.shape() && residual.dtype() == dtype && row_of(x, d)
            }
            BlockInput::Projected {
                x, weight, bias, ..
            } => {
                let da = x.shape().last().copied().unwrap_or(0);
                row_of(x, da)
                    && da > 0
                    && da % (4 * chunk) == 0
                    && lanes(da / 4) <= MAX_LOADS
                    && shaped(weight, (d, da))
                    && bias.is_none_or(|b| vector(b, d))
                    && i64::from(da) * h.item_size() as i64 + SHARED_OVERHEAD <= MAX_SHARED_BYTES
            }
        };
        let first = match self.first {
            FirstProducts::Gated { gate, up } => shaped(gate, (f, d)) && shaped(up, (f, d)),
            FirstProducts::Plain { fc, bias } => {
                shaped(fc, (f, d)) && f % 16 == 0 && bias.is_none_or(|b| vector(b, f))
            }
        };
        row_of(h, d)
            && lead
            && first
            && self.norm.fits(h, MAX_SHARED_BYTES - SHARED_OVERHEAD)
            && shaped(self.down, (d, f))
            && self.down_bias.is_none_or(|b| vector(b, d))
            && Weight::alike(&self.weights())
            && d > 0
            && f > 0
            && d % pack_width(dtype) == 0
            && d % 4 == 0
            && f % (4 * chunk) == 0
            && lanes(d) <= MAX_LOADS
            && lanes(f / 4) <= MAX_LOADS
            && i64::from(d.max(f)) * h.item_size() as i64 + SHARED_OVERHEAD <= MAX_SHARED_BYTES
    }

    /// The block's output, shaped as its row. Callers check [`fits`](Self::fits).
    pub(crate) fn apply(&self) -> Result<Array> {
        let h = self.row();
        let dtype = h.dtype();
        let d = *h.shape().last().unwrap_or(&1);
        let f = self.down.width();
        let [lead, gate, up, down] = self.weights();
        let norm = self.norm;
        // Inputs a launch does not read take an array of the right type's place; its `DA`, the
        // width of `F`, whose quarters are whole chunks.
        let (x, r0, bo, residual, da) = match self.input {
            BlockInput::Row { x, residual } => (x.clone(), x, None, residual, f),
            // The projection reads its row as it lies: attention's heads' output, made one row by
            // views that then go unevaluated.
            BlockInput::Projected {
                x, bias, residual, ..
            } => (
                crate::nn::view_rows::unviewed(x),
                residual,
                bias,
                residual,
                *x.shape().last().unwrap_or(&1),
            ),
        };
        let (bg, gated) = match self.first {
            FirstProducts::Gated { .. } => (None, true),
            FirstProducts::Plain { bias, .. } => (bias, false),
        };
        let filler = &norm.weight;
        let mut inputs = vec![x, r0.clone()];
        inputs.extend(lead.arrays());
        inputs.extend([
            bo.unwrap_or(filler).clone(),
            norm.weight.clone(),
            norm.bias.as_ref().unwrap_or(filler).clone(),
        ]);
        inputs.extend(gate.arrays());
        inputs.extend(up.arrays());
        inputs.push(bg.unwrap_or(filler).clone());
        inputs.extend(down.arrays());
        inputs.extend([
            self.down_bias.unwrap_or(filler).clone(),
            residual.clone(),
            super::tasks::control("lmx_mlp_block")?,
        ]);
        let leads = matches!(self.input, BlockInput::Projected { .. });
        let mut template = vec![
            TemplateArg::Type("T", dtype),
            TemplateArg::Int("D", d),
            TemplateArg::Int("DA", da),
            TemplateArg::Int("F", f),
            TemplateArg::Int("KX", d.max(f).max(da)),
            TemplateArg::Int("LEAD", i32::from(leads)),
            TemplateArg::Int("GATED", i32::from(gated)),
            TemplateArg::Int("ACT", self.activation as i32),
            norm.epsilon(),
            TemplateArg::Int("BO", i32::from(bo.is_some())),
            TemplateArg::Int("BG", i32::from(bg.is_some())),
            TemplateArg::Int("BD", i32::from(self.down_bias.is_some())),
        ];
        template.extend(norm.form());
        template.extend(down.template());
        let first_tasks = if gated { f / 8 } else { f / 16 };
        let tasks = if leads { d / 4 } else { 0 } + first_tasks + d / 4;
        let h_shape = [if leads { d } else { 1 }];
        let outputs = KERNELS.with(|kernels| {
            let kernel = kernels[down.format() as usize]
                .as_ref()
                .map_err(|err| Error::Layout(err.to_string()))?;
            kernel.launch(
                &inputs,
                &Launch {
                    outputs: &[(h.shape(), dtype), (&[f], dtype), (&h_shape, dtype)],
                    grid: (BLOCKS.min(tasks) * THREADS, 1, 1),
                    block: (THREADS, 1, 1),
                    template: &template,
                },
            )
        })?;
        outputs
            .into_iter()
            .next()
            .ok_or_else(|| Error::Layout("the MLP block's kernel made no output".into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cuda::NormKind;
    use crate::test_arrays::normal;
    use mlx_rs::Dtype;

    /// Packed words, scales and offsets of the shapes 4 bits by 64 make (values unread).
    fn packed(features: i32, width: i32, dtype: Dtype) -> [Array; 3] {
        let zeros = |shape: &[i32], dtype: Dtype| mlx_rs::ops::zeros_dtype(shape, dtype).unwrap();
        [
            zeros(&[features, width / 8], Dtype::Uint32),
            zeros(&[features, width / 64], dtype),
            zeros(&[features, width / 64], dtype),
        ]
    }

    /// A 4-bit weight by groups of 64 of `parts` ([`packed`]'s).
    fn four(parts: &[Array; 3]) -> Weight<'_> {
        Weight::affine(parts, 4, 64)
    }

    fn rms(d: i32, dtype: Dtype) -> RowNorm {
        RowNorm {
            kind: NormKind::Rms,
            weight: normal(&[d], dtype),
            bias: None,
            eps: 1e-5,
        }
    }

    fn gated_fits(d: i32, dtype: Dtype, parts: [Weight; 3]) -> bool {
        let x = normal(&[1, 1, d], dtype);
        MlpBlock {
            input: BlockInput::Row {
                x: &x,
                residual: &x,
            },
            norm: &rms(d, dtype),
            activation: Activation::Silu,
            first: FirstProducts::Gated {
                gate: parts[0],
                up: parts[1],
            },
            down: parts[2],
            down_bias: None,
        }
        .fits()
    }

    /// TinyLlama's block fits dense and packed in 4 bits; a 4-bit block of Llama-3-70B's size
    /// (8,192 by 28,672), whose rows fit the loads, does not: its gated values would overflow
    /// the shared memory (in float32 from 12,288 gated values on); nor gates of another form
    /// than the down projection's.
    #[test]
    fn what_fits_gated() {
        let bf = Dtype::Bfloat16;
        let (gate, down) = (normal(&[5632, 2048], bf), normal(&[2048, 5632], bf));
        let dense = [
            Weight::Dense(&gate),
            Weight::Dense(&gate),
            Weight::Dense(&down),
        ];
        assert!(gated_fits(2048, bf, dense), "TinyLlama dense");
        let (g4, d4) = (packed(5632, 2048, bf), packed(2048, 5632, bf));
        assert!(
            gated_fits(2048, bf, [four(&g4), four(&g4), four(&d4)]),
            "TinyLlama 4-bit"
        );
        let mixed = [four(&g4), four(&g4), Weight::Dense(&down)];
        assert!(!gated_fits(2048, bf, mixed), "mixed forms");
        let (g70, d70) = (packed(28672, 8192, bf), packed(8192, 28672, bf));
        let large = [four(&g70), four(&g70), four(&d70)];
        assert!(!gated_fits(8192, bf, large), "70B 4-bit");
        let f32 = Dtype::Float32;
        for (f, fit) in [(12160, true), (12288, false)] {
            let (g, d) = (packed(f, 2048, f32), packed(2048, f, f32));
            let parts = [four(&g), four(&g), four(&d)];
            assert_eq!(gated_fits(2048, f32, parts), fit, "float32 F = {f}");
        }
    }

    /// GPT-2's block (a layer norm with a shift, biases everywhere) fits with its output
    /// projection leading, dense and packed, and without it; not a projection of another form
    /// than the MLP's, a bias of another width, nor a projection from a row of another width
    /// than the weight reads.
    #[test]
    fn what_fits_plain_and_led() {
        let bf = Dtype::Bfloat16;
        let d = 768;
        let layer_norm = RowNorm {
            kind: NormKind::Layer,
            weight: normal(&[d], bf),
            bias: Some(normal(&[d], bf)),
            eps: 1e-5,
        };
        let (a, r) = (normal(&[1, 1, d], bf), normal(&[1, 1, d], bf));
        let (wo, fc, proj) = (
            normal(&[d, d], bf),
            normal(&[4 * d, d], bf),
            normal(&[d, 4 * d], bf),
        );
        let (bo, bfc, bproj) = (normal(&[d], bf), normal(&[4 * d], bf), normal(&[d], bf));
        let block = |input: BlockInput<'_>, fc: Weight<'_>, bias: &Array, down: Weight<'_>| {
            MlpBlock {
                input,
                norm: &layer_norm,
                activation: Activation::GeluTanh,
                first: FirstProducts::Plain {
                    fc,
                    bias: Some(bias),
                },
                down,
                down_bias: Some(&bproj),
            }
            .fits()
        };
        let projected = |weight| BlockInput::Projected {
            x: &a,
            weight,
            bias: Some(&bo),
            residual: &r,
        };
        let (dense_fc, dense_proj) = (Weight::Dense(&fc), Weight::Dense(&proj));
        assert!(block(
            projected(Weight::Dense(&wo)),
            dense_fc,
            &bfc,
            dense_proj
        ));
        assert!(block(
            BlockInput::Row {
                x: &r,
                residual: &r
            },
            dense_fc,
            &bfc,
            dense_proj
        ));
        let (o4, fc4, proj4) = (packed(d, d, bf), packed(4 * d, d, bf), packed(d, 4 * d, bf));
        assert!(
            block(projected(four(&o4)), four(&fc4), &bfc, four(&proj4)),
            "4-bit"
        );
        assert!(
            !block(projected(four(&o4)), dense_fc, &bfc, dense_proj),
            "a packed projection before dense layers"
        );
        assert!(
            !block(projected(Weight::Dense(&wo)), dense_fc, &bproj, dense_proj),
            "the first product's bias of the model's width"
        );
        let narrow = normal(&[1, 1, 512], bf);
        let from_narrow = BlockInput::Projected {
            x: &narrow,
            weight: Weight::Dense(&wo),
            bias: Some(&bo),
            residual: &r,
        };
        assert!(
            !block(from_narrow, dense_fc, &bfc, dense_proj),
            "a projection of a row of another width"
        );
    }
}
