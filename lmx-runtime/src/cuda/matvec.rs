//! A few rows times one or more weight matrices: decoding's products, in one kernel per group of
//! layers over one input.
//!
//! Decoding one token multiplies one row by every weight of the model, so its time is the time to
//! read the weights. MLX's CUDA matrix-vector kernel reads 8 bytes a thread, one row of the weight
//! a warp, well under the memory's bandwidth (docs/benchmarks.md, "Sixth session of 2026-11-27").
//! Here a warp also reads one row of a weight, but 16 bytes a thread, four
//! loads in flight, and it takes all of a group's weights (attention's query, key and value
//! projections; a gated MLP's gate and up projections) in one launch, with an output per weight,
//! a bias added where the layers have one. Each of the input's rows (at
//! most [`MAX_ROWS`]) is multiplied by every weight row as that row is read, accumulated in
//! float32. For one weight the input may be activated as the kernel reads it (`f(x)`, or a gated
//! MLP's `f(gate) * up`): each block activates the input once into shared memory, where its
//! warps read it, so that the activation is no kernel of its own; the weight rows' reads from
//! memory, requested first, overlap it. In the same way a group's one-row input may be normalised
//! as the kernel reads it (an RMS or layer norm, [`RowNorm`]), so that a pre-norm block's norm is
//! no kernel of its own either. The weights are dense or packed by MLX's affine
//! quantization, all of a launch's alike ([`Weight`]): a packed row is read in the same 16-byte
//! chunks, each with its group's scale and offset.
//!
//! It has no gradient: it is taken only where none is
//! ([`without_gradients`](crate::nn::without_gradients)).

use super::kernel::{Inputs, Kernel, Launch, TemplateArg};
use super::row_norm::{NormKind, RowNorm};
use super::weights::{Format, Weight};
use crate::error::{Error, Result};
use crate::nn::Activation;
use mlx_rs::{Array, Dtype};

/// The most rows of the input one launch multiplies (a speculative verification's few tokens; a
/// batch of more goes to MLX's matrix products).
pub(crate) const MAX_ROWS: i32 = 8;

/// The most weights one launch takes.
pub(crate) const MAX_WEIGHTS: usize = 3;

/// Threads per block: four warps, each one output feature.
const THREADS: i32 = 128;

/// Threads per block over an activated input: eight warps share each activation of it.
const ACTIVATED_THREADS: i32 = 256;

/// The most bytes of activated or normalised input (its rows times their width) one block holds
/// in shared memory.
const MAX_ACTIVATED_BYTES: i64 = 32 * 1024;

/// Warps per block over an activated or normalised input (the norm's device code sums over them).
const SHARING_WARPS: i32 = ACTIVATED_THREADS / 32;

thread_local! {
    /// The kernel for 1, 2 and 3 weights of each form, without and with biases, over an input as
    /// it is or normalised.
    static KERNELS: [[[[Result<Kernel>; 4]; 2]; MAX_WEIGHTS]; 2] = Format::ALL.map(|format| {
        [1, 2, 3].map(|count| {
            [false, true].map(|biased| {
                GROUP_INPUTS.map(|input| kernel(format, count, biased, input, false))
            })
        })
    });
    /// The kernel for one weight of each form over an input as it is, activated or gated,
    /// without and with a bias, without and with a residual added to its output.
    static ONE_KERNELS: [[[[Result<Kernel>; 2]; 2]; 3]; 2] = Format::ALL.map(|format| {
        [Input::Plain, Input::Activated, Input::Gated].map(|input| {
            [false, true].map(|biased| {
                [false, true].map(|residual| kernel(format, 1, biased, input, residual))
            })
        })
    });
}

/// What the kernel multiplies by the weights: the input `x` itself, `f(x)`, or `f(x) * u` (a
/// gated MLP's product), `f` the activation whose discriminant is the template argument `ACT`,
/// each value computed in float32 and rounded to the input's dtype, as lmx's activation kernels
/// round their outputs; or one row's norm (RMS, layer, layer with a shift: [`RowNorm`]), rounded
/// as MLX's norms round it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Input {
    Plain,
    Activated,
    Gated,
    Rms,
    Layer,
    LayerShifted,
}

/// The inputs of a group's kernels, in the order of [`KERNELS`]' last axis: as it is, or
/// normalised by each kind of [`RowNorm`] ([`normed_slot`]).
const GROUP_INPUTS: [Input; 4] = [Input::Plain, Input::Rms, Input::Layer, Input::LayerShifted];

/// The place in [`GROUP_INPUTS`] of the input a kernel that applies `norm` reads.
fn normed_slot(norm: &RowNorm) -> usize {
    match (norm.kind, norm.bias.is_some()) {
        (NormKind::Rms, _) => 1,
        (NormKind::Layer, false) => 2,
        (NormKind::Layer, true) => 3,
    }
}

fn kernel(
    format: Format,
    count: usize,
    biased: bool,
    input: Input,
    residual: bool,
) -> Result<Kernel> {
    let (inputs, body) = source(format, count, biased, input, residual);
    let inputs: Vec<&str> = inputs.iter().map(String::as_str).collect();
    let outputs: Vec<String> = (0..count).map(|i| format!("y{i}")).collect();
    let outputs: Vec<&str> = outputs.iter().map(String::as_str).collect();
    let (activation, norm) = match input {
        Input::Plain => ("", ""),
        Input::Activated | Input::Gated => (super::activation::HEADER, ""),
        Input::Rms | Input::Layer | Input::LayerShifted => ("", super::row_norm::HEADER),
    };
    Kernel::new(
        "lmx_matvec",
        (&inputs, Inputs::RowContiguous),
        &outputs,
        &format!("{activation}{HEADER}{norm}{}", format.header()),
        &body,
    )
}

/// `V` values of `T` from `p` as one 16-byte vector: one load where `p` is 16-byte aligned (MLX's
/// allocations are; a view into one may not be), else value by value.
pub(super) const HEADER: &str = r#"
template <typename T, int V>
__device__ inline uint4 lmx_matvec_load(const T* p, bool aligned) {
  if (aligned) {
    return *reinterpret_cast<const uint4*>(p);
  }
  uint4 packed;
  T* values = reinterpret_cast<T*>(&packed);
#pragma unroll
  for (int j = 0; j < V; ++j) {
    values[j] = p[j];
  }
  return packed;
}
"#;

/// The kernel's input names and body for `count` weights of `format`, with biases or not, over
/// `input`.
///
/// Template arguments: `T` (the element type), `R` (the input's rows), packed weights' `BITS`
/// and `GS` (their group size); over an activated or gated input, `ACT` (the activation) and
/// `KT` (the input's width, sizing the shared memory it is activated into); over a normalised
/// one, `KT` and `EPS_BITS` (the norm's epsilon's float bits). Warp `f` takes
/// feature `f` of the weights stacked in order: the dot product of each input row `r` with that
/// weight row (then `+ b[f]`), rounded to `T`, written to that weight's own output `y<i>` (`[R,
/// features of weight i]`: no split of one wide output after the launch, whose slices would be
/// operations of their own); with a residual (one weight), that plus the residual's value there,
/// rounded again (as the product, then MLX's sum, round).
fn source(
    format: Format,
    count: usize,
    biased: bool,
    input: Input,
    residual: bool,
) -> (Vec<String>, String) {
    let mut inputs = vec!["x".to_owned()];
    match input {
        Input::Gated => inputs.push("u".to_owned()),
        Input::Rms | Input::Layer => inputs.push("nw".to_owned()),
        Input::LayerShifted => inputs.extend(["nw".to_owned(), "nb".to_owned()]),
        Input::Plain | Input::Activated => {}
    }
    inputs.extend((0..count).flat_map(|i| format.inputs(&format!("w{i}"))));
    if biased {
        inputs.extend((0..count).map(|i| format!("b{i}")));
    }
    if residual {
        inputs.push("res".to_owned());
    }
    let output = if residual {
        "static_cast<T>(static_cast<float>(res[size_t(r) * total + f]) + static_cast<float>(static_cast<T>(acc[r] + bias)))"
    } else {
        "static_cast<T>(acc[r] + bias)"
    };
    // Which weight (and bias) feature `f` reads, its row there, and the output it is written
    // to (each weight's own, as wide as its features): the first weight whose end (its features
    // and those before it) lies past `f`.
    let mut pick = format!(
        "  W m = {};\n  T* y = y0;\n  int row = f;\n  int width = w0_shape[0];\n",
        format.matrix("w0")
    );
    if biased {
        pick.push_str("  const T* b = b0;\n");
    }
    let mut end = String::from("w0_shape[0]");
    for i in 1..count {
        pick.push_str(&format!(
            "  if (f >= {end}) {{ m = {matrix}; y = y{i}; row = f - ({end}); width = w{i}_shape[0];{bias} }}\n",
            matrix = format.matrix(&format!("w{i}")),
            bias = if biased {
                format!(" b = b{i};")
            } else {
                String::new()
            },
        ));
        end = format!("{end} + w{i}_shape[0]");
    }
    let total: Vec<String> = (0..count).map(|i| format!("w{i}_shape[0]")).collect();
    let bias = if biased {
        "static_cast<float>(b[row])"
    } else {
        "0.0f"
    };
    // Each warp first asks L2 for its weight row, whose reads from memory then overlap the
    // activation or norm (over a plain input, with nothing to overlap, the same requests only
    // slowed the wider products).
    let prefetch = r#"
  if (f < total) {
    const char* line = reinterpret_cast<const char*>(wr.p);
    const int lines = (K / W::VALUES * 16 + 127) / 128;
    for (int l = lane; l < lines; l += WARP) {
      asm volatile("prefetch.global.L2 [%0];" :: "l"(line + size_t(l) * 128));
    }
  }"#;
    // An activated or normalised input is computed once per block, into shared memory, where
    // every warp of the block reads it: computed by each warp, the activation (an exponential
    // and a division a value for SiLU) would cost more than reading the weight row.
    let (activate, source_x, x_address) = match input {
        Input::Plain => (String::new(), "x", "reinterpret_cast<size_t>(x)"),
        Input::Rms | Input::Layer | Input::LayerShifted => {
            let (call, shift) = match input {
                Input::Rms => (
                    "lmx_norm_row<T, KT, SHARING_WARPS, false, false>(x, nw, nw, ",
                    "",
                ),
                Input::Layer => (
                    "lmx_norm_row<T, KT, SHARING_WARPS, true, false>(x, nw, nw, ",
                    "",
                ),
                _ => (
                    "lmx_norm_row<T, KT, SHARING_WARPS, true, true>(x, nw, nb, ",
                    " | reinterpret_cast<size_t>(nb)",
                ),
            };
            let activate = format!(
                r#"{prefetch}
  __shared__ __align__(16) T xs[KT];
  __shared__ float red[{SHARING_WARPS}];
  {{
    constexpr int SHARING_WARPS = {SHARING_WARPS};
    const bool aligned =
        ((reinterpret_cast<size_t>(x) | reinterpret_cast<size_t>(nw){shift}) % 16) == 0;
    {call}xs, __int_as_float(EPS_BITS), red, aligned);
  }}"#
            );
            (activate, "xs", "0")
        }
        Input::Activated | Input::Gated => {
            let (up_address, up_load, up) = match input {
                Input::Gated => (
                    " | reinterpret_cast<size_t>(u)",
                    "\n      const uint4 up = lmx_matvec_load<T, V>(u + size_t(i) * V, aligned);\n      \
                     const T* ut = reinterpret_cast<const T*>(&up);",
                    " * static_cast<float>(ut[j])",
                ),
                _ => ("", "", ""),
            };
            // The input is read 16 bytes a thread at a time, as the weights are: value by value,
            // each thread would wait out one load's latency after another before any weight is
            // read.
            let activate = format!(
                r#"{prefetch}
  __shared__ __align__(16) T xs[R * KT];
  {{
    constexpr int V = 16 / int(sizeof(T));
    const bool aligned = ((reinterpret_cast<size_t>(x){up_address}) % 16) == 0;
    for (int i = threadIdx.x; i < R * KT / V; i += blockDim.x) {{
      const uint4 xp = lmx_matvec_load<T, V>(x + size_t(i) * V, aligned);
      const T* xt = reinterpret_cast<const T*>(&xp);{up_load}
      uint4 packed;
      T* out = reinterpret_cast<T*>(&packed);
#pragma unroll
      for (int j = 0; j < V; ++j) {{
        out[j] = static_cast<T>(lmx_activation<ACT>(static_cast<float>(xt[j])){up});
      }}
      *reinterpret_cast<uint4*>(xs + size_t(i) * V) = packed;
    }}
  }}
  __syncthreads();"#
            );
            (activate, "xs", "0")
        }
    };
    let body = format!(
        r#"
  constexpr int WARP = 32;
  using W = {device_type};
  const int K = {width};
  const int total = {total};
  const int f = (blockIdx.x * blockDim.x + threadIdx.x) / WARP;
  const int lane = threadIdx.x % WARP;
{pick}
  const auto wr = m.at(row, K, 0);
{activate}
  if (f >= total) {{
    return;
  }}
  const bool aligned = m.aligned() && (({x_address}) % 16) == 0;
  const int chunks = K / W::VALUES;
  float acc[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {{
    acc[r] = 0.0f;
  }}
#pragma unroll 4
  for (int i = lane; i < chunks; i += WARP) {{
    const auto c = wr.load(i, aligned);
#pragma unroll
    for (int r = 0; r < R; ++r) {{
      W::dot(c, {source_x} + size_t(r) * K + size_t(i) * W::VALUES, aligned, acc[r]);
    }}
  }}
#pragma unroll
  for (int r = 0; r < R; ++r) {{
#pragma unroll
    for (int offset = WARP / 2; offset > 0; offset /= 2) {{
      acc[r] += __shfl_xor_sync(0xffffffff, acc[r], offset);
    }}
  }}
  if (lane == 0) {{
    const float bias = {bias};
#pragma unroll
    for (int r = 0; r < R; ++r) {{
      y[size_t(r) * width + row] = {output};
    }}
  }}
"#,
        device_type = format.device_type(),
        width = format.width("w0"),
        total = total.join(" + "),
    );
    (inputs, body)
}

/// Whether the kernel multiplies `x` by `weights` (with `biases`, one per weight, if given): one
/// to [`MAX_WEIGHTS`] weights of one form that read `x`'s dtype ([`Weight::fits`]), each `K`
/// wide (at least one feature in all, and few enough that a warp each, rounded up to whole
/// blocks, counts in an `i32`), `x` of at most [`MAX_ROWS`] rows of `K`, biases `[features]` of
/// that dtype.
pub(crate) fn matvec_fits(x: &Array, weights: &[Weight], biases: Option<&[&Array]>) -> bool {
    let dtype = x.dtype();
    let Some(&k) = x.shape().last() else {
        return false;
    };
    let rows = x.size() as i64 / i64::from(k.max(1));
    let features: i64 = weights.iter().map(|w| i64::from(w.features())).sum();
    let weight_fits = |w: &Weight| w.width() == k && w.fits(dtype);
    let bias_fits = |(b, w): (&&Array, &Weight)| {
        b.ndim() == 1 && b.shape()[0] == w.features() && b.dtype() == dtype
    };
    (1..=MAX_WEIGHTS).contains(&weights.len())
        && k > 0
        && (1..=i64::from(MAX_ROWS)).contains(&rows)
        && weights.iter().all(weight_fits)
        && Weight::alike(weights)
        && biases.is_none_or(|b| b.len() == weights.len() && b.iter().zip(weights).all(bias_fits))
        && (1..=(i64::from(i32::MAX) - i64::from(ACTIVATED_THREADS)) / 32).contains(&features)
}

/// `x @ w.T (+ b)` for each weight `w` (and bias `b`): one `[..., features of w]` in `x`'s dtype
/// per weight, from one launch. Callers check [`matvec_fits`].
pub(crate) fn matvec(
    x: &Array,
    weights: &[Weight],
    biases: Option<&[&Array]>,
) -> Result<Vec<Array>> {
    let mut inputs = vec![x.clone()];
    inputs.extend(weights.iter().flat_map(Weight::arrays));
    inputs.extend(biases.into_iter().flatten().map(|&b| b.clone()));
    let biased = usize::from(biases.is_some());
    let format = weights[0].format() as usize;
    KERNELS.with(|kernels| {
        // The input as it is: `GROUP_INPUTS[0]`.
        let kernel = &kernels[format][weights.len() - 1][biased][0];
        launch(kernel, &inputs, weights, (THREADS, Vec::new()))
    })
}

/// Whether the kernel multiplies `norm` of `x` by `weights` (with `biases`): `x` and the weights
/// as [`matvec_fits`] takes them, `x` one row that `norm` fits ([`RowNorm::fits`]) within
/// [`MAX_ACTIVATED_BYTES`].
pub(crate) fn normed_matvec_fits(
    x: &Array,
    norm: &RowNorm,
    weights: &[Weight],
    biases: Option<&[&Array]>,
) -> bool {
    matvec_fits(x, weights, biases) && norm.fits(x, MAX_ACTIVATED_BYTES)
}

/// What [`matvec`] gives over `norm`'s output of `x`, from one launch whose every block
/// normalises `x` as it reads it. Callers check [`normed_matvec_fits`].
pub(crate) fn normed_matvec(
    x: &Array,
    norm: &RowNorm,
    weights: &[Weight],
    biases: Option<&[&Array]>,
) -> Result<Vec<Array>> {
    let mut inputs = vec![x.clone()];
    inputs.extend(norm.arrays());
    inputs.extend(weights.iter().flat_map(Weight::arrays));
    inputs.extend(biases.into_iter().flatten().map(|&b| b.clone()));
    let biased = usize::from(biases.is_some());
    let format = weights[0].format() as usize;
    let input = normed_slot(norm);
    let template = vec![
        TemplateArg::Int("KT", *x.shape().last().unwrap_or(&1)),
        norm.epsilon(),
    ];
    KERNELS.with(|kernels| {
        let kernel = &kernels[format][weights.len() - 1][biased][input];
        launch(kernel, &inputs, weights, (ACTIVATED_THREADS, template))
    })
}

/// One layer's product in decoding: its weight (and bias) times its input `x` as it is, or
/// activated by `activation` (times `up` as well: a gated MLP's product), with `residual` added
/// to the output where given.
#[derive(Clone, Copy)]
pub(crate) struct OneLayer<'a> {
    pub x: &'a Array,
    pub activation: Option<Activation>,
    pub up: Option<&'a Array>,
    pub weight: Weight<'a>,
    pub bias: Option<&'a Array>,
    pub residual: Option<&'a Array>,
}

impl OneLayer<'_> {
    fn input(&self) -> Input {
        match (self.activation, self.up) {
            (None, _) => Input::Plain,
            (Some(_), None) => Input::Activated,
            (Some(_), Some(_)) => Input::Gated,
        }
    }

    /// Whether the kernel takes it: `x` and the weight as [`matvec_fits`] takes them; `up` only
    /// with an activation, shaped and typed as `x`; an activated input's rows at most
    /// [`MAX_ACTIVATED_BYTES`] (whole 16-byte vectors, as a weight's whole chunks make them); a
    /// residual of the output's shape and `x`'s dtype.
    pub(crate) fn fits(&self) -> bool {
        let biases = self.bias.map(|bias| [bias]);
        let x = self.x;
        let up_fits = self.up.is_none_or(|up| {
            self.activation.is_some() && up.shape() == x.shape() && up.dtype() == x.dtype()
        });
        let residual_fits = self.residual.is_none_or(|residual| {
            let mut shape = x.shape().to_vec();
            if let Some(last) = shape.last_mut() {
                *last = self.weight.features();
            }
            residual.shape() == shape && residual.dtype() == x.dtype()
        });
        matvec_fits(
            x,
            std::slice::from_ref(&self.weight),
            biases.as_ref().map(|b| &b[..]),
        ) && up_fits
            && residual_fits
            && (self.activation.is_none() || x.nbytes() as i64 <= MAX_ACTIVATED_BYTES)
    }

    /// `[..., features]` in `x`'s dtype, each value of an activated input rounded to that dtype
    /// before it is multiplied. Callers check [`fits`](Self::fits).
    pub(crate) fn product(&self) -> Result<Array> {
        let mut inputs = vec![self.x.clone()];
        inputs.extend(self.up.cloned());
        inputs.extend(self.weight.arrays());
        inputs.extend(self.bias.cloned());
        inputs.extend(self.residual.cloned());
        let input = self.input();
        let (biased, residual) = (
            usize::from(self.bias.is_some()),
            usize::from(self.residual.is_some()),
        );
        let template = match self.activation {
            Some(activation) => vec![
                TemplateArg::Int("ACT", activation as i32),
                TemplateArg::Int("KT", *self.x.shape().last().unwrap_or(&1)),
            ],
            None => Vec::new(),
        };
        let threads = match input {
            Input::Plain => THREADS,
            _ => ACTIVATED_THREADS,
        };
        let format = self.weight.format() as usize;
        let weights = std::slice::from_ref(&self.weight);
        let mut outputs = ONE_KERNELS.with(|kernels| {
            let kernel = &kernels[format][input as usize][biased][residual];
            launch(kernel, &inputs, weights, (threads, template))
        })?;
        Ok(outputs.remove(0))
    }
}

/// One launch of `kernel` over `inputs` (`x` first), a warp per output feature of `weights`, in
/// whole blocks of `threads` (MLX shrinks a block to a smaller grid, and a norm's block sums
/// count on every warp of the block: a router's few features would sum shared memory no warp
/// wrote), with the template arguments `more` besides `T`, `R` and the weights' form's: an
/// output per weight.
fn launch(
    kernel: &Result<Kernel>,
    inputs: &[Array],
    weights: &[Weight],
    (threads, mut more): (i32, Vec<TemplateArg>),
) -> Result<Vec<Array>> {
    let kernel = kernel
        .as_ref()
        .map_err(|err| Error::Layout(err.to_string()))?;
    let x = &inputs[0];
    let k = *x.shape().last().unwrap_or(&1);
    let rows = x.size() as i32 / k.max(1);
    let features: i32 = weights.iter().map(Weight::features).sum();
    let shapes: Vec<Vec<i32>> = weights
        .iter()
        .map(|w| {
            let mut shape = x.shape().to_vec();
            *shape.last_mut().unwrap_or(&mut 0) = w.features();
            shape
        })
        .collect();
    let outputs: Vec<(&[i32], Dtype)> = shapes.iter().map(|s| (&s[..], x.dtype())).collect();
    let mut template = vec![
        TemplateArg::Type("T", x.dtype()),
        TemplateArg::Int("R", rows),
    ];
    template.extend(weights[0].template());
    template.append(&mut more);
    kernel.launch(
        inputs,
        &Launch {
            outputs: &outputs,
            grid: ((features * 32 + threads - 1) / threads * threads, 1, 1),
            block: (threads, 1, 1),
            template: &template,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_arrays::normal;
    use mlx_rs::ops;
    use mlx_rs::ops::indexing::IndexOp;

    fn dense<'a>(weights: &[&'a Array]) -> Vec<Weight<'a>> {
        weights.iter().map(|&w| Weight::Dense(w)).collect()
    }

    /// Up to three float weights of one dtype and width in whole 16-byte rows, some features,
    /// at most eight input rows, biases of the weights' lengths: nothing else fits.
    #[test]
    fn what_fits() {
        let bf = Dtype::Bfloat16;
        let (x, w, b) = (
            normal(&[1, 1, 64], bf),
            normal(&[8, 64], bf),
            normal(&[8], bf),
        );
        assert!(matvec_fits(&x, &dense(&[&w]), None));
        assert!(matvec_fits(&x, &dense(&[&w, &w, &w]), Some(&[&b, &b, &b])));
        assert!(matvec_fits(&normal(&[8, 64], bf), &dense(&[&w]), None));
        assert!(!matvec_fits(&normal(&[9, 64], bf), &dense(&[&w]), None));
        assert!(!matvec_fits(&x, &dense(&[&w, &w, &w, &w]), None));
        assert!(!matvec_fits(&x, &dense(&[]), None));
        assert!(!matvec_fits(&x, &dense(&[&w]), Some(&[&normal(&[7], bf)])));
        assert!(!matvec_fits(&x, &dense(&[&w, &w]), Some(&[&b])));
        assert!(!matvec_fits(
            &x,
            &dense(&[&w.as_dtype(Dtype::Float32).unwrap()]),
            None
        ));
        let (x12, w12) = (normal(&[1, 12], bf), normal(&[4, 12], bf));
        assert!(!matvec_fits(&x12, &dense(&[&w12]), None));
        let (x12, w12) = (
            normal(&[1, 12], Dtype::Float32),
            normal(&[4, 12], Dtype::Float32),
        );
        assert!(matvec_fits(&x12, &dense(&[&w12]), None));
        assert!(!matvec_fits(
            &x.as_dtype(Dtype::Int32).unwrap(),
            &dense(&[&w]),
            None
        ));
        assert!(!matvec_fits(&x, &dense(&[&normal(&[0, 64], bf)]), None));
        // One layer: `up` only with an activation and as `x`, an activated input's rows within
        // the shared memory, a residual of the output's shape and dtype.
        let one = |x, activation, up, residual| OneLayer {
            x,
            activation,
            up,
            weight: Weight::Dense(&w),
            bias: Some(&b),
            residual,
        };
        let silu = Some(Activation::Silu);
        let (y, wide_x) = (normal(&[1, 1, 8], bf), normal(&[1, 16384], bf));
        let (other_up, flat_y) = (normal(&[1, 2, 64], bf), normal(&[1, 8], bf));
        let (float_y, wide_rows) = (y.as_dtype(Dtype::Float32).unwrap(), normal(&[2, 16384], bf));
        assert!(one(&x, silu, None, None).fits());
        assert!(one(&x, silu, Some(&x), Some(&y)).fits());
        assert!(one(&x, None, None, Some(&y)).fits());
        assert!(!one(&x, None, Some(&x), None).fits());
        assert!(!one(&x, silu, Some(&other_up), None).fits());
        assert!(!one(&x, None, None, Some(&flat_y)).fits());
        assert!(!one(&x, None, None, Some(&float_y)).fits());
        let wide = normal(&[8, 16384], bf);
        let wide_one = |x| OneLayer {
            x,
            activation: silu,
            up: None,
            weight: Weight::Dense(&wide),
            bias: None,
            residual: None,
        };
        assert!(wide_one(&wide_x).fits());
        assert!(!wide_one(&wide_rows).fits());
        assert!(OneLayer {
            activation: None,
            ..wide_one(&wide_rows)
        }
        .fits());
    }

    /// The largest difference of `got` from `want` (float32), relative to `want`'s largest
    /// magnitude (at least 1).
    fn relative_error(got: &Array, want: &Array) -> f32 {
        let largest = |a: Array| a.abs().unwrap().max(None).unwrap().item_cast::<f32>();
        let got = got.as_dtype(Dtype::Float32).unwrap();
        largest(got.subtract(want).unwrap()) / largest(want.clone()).max(1.0)
    }

    /// MLX's `quantize` of `w`, and its bits and group size.
    fn packed(w: &Array, bits: i32, group_size: i32) -> (Array, Array, Array, i32, i32) {
        let (p, s, b) = ops::quantize(w, group_size, bits).unwrap();
        (p, s, b, bits, group_size)
    }

    fn affine(p: &(Array, Array, Array, i32, i32)) -> Weight<'_> {
        Weight::Affine {
            packed: &p.0,
            scales: &p.1,
            biases: &p.2,
            bits: p.3,
            group_size: p.4,
        }
    }

    /// The weight `p` reads, dequantized in float32 (MLX's `dequantize` of the same words).
    fn dequantized(p: &(Array, Array, Array, i32, i32)) -> Array {
        let f32 = |a: &Array| a.as_dtype(Dtype::Float32).unwrap();
        ops::dequantize(&p.0, f32(&p.1), &f32(&p.2), p.4, p.3).unwrap()
    }

    /// A packed weight fits in 4 and 8 bits by groups of 32, 64 and 128, as wide as the input,
    /// its scales and offsets of the input's dtype, beside weights packed alike; not in 2, 3 or
    /// 6 bits, with scales of another dtype or count, for an input of another width or dtype,
    /// beside a dense weight or one packed otherwise.
    #[test]
    fn what_packed_weights_fit() {
        let bf = Dtype::Bfloat16;
        let (w, x) = (normal(&[8, 256], bf), normal(&[1, 1, 256], bf));
        for bits in [2, 3, 4, 6, 8] {
            for group_size in [32, 64, 128] {
                let p = packed(&w, bits, group_size);
                let fits = matvec_fits(&x, &[affine(&p)], None);
                assert_eq!(fits, bits == 4 || bits == 8, "{bits} bits by {group_size}");
            }
        }
        let (four, eight) = (packed(&w, 4, 64), packed(&w, 8, 64));
        assert!(matvec_fits(&x, &[affine(&four), affine(&four)], None));
        assert!(!matvec_fits(&x, &[affine(&four), affine(&eight)], None));
        assert!(!matvec_fits(&x, &[affine(&four), Weight::Dense(&w)], None));
        assert!(!matvec_fits(&normal(&[1, 128], bf), &[affine(&four)], None));
        assert!(!matvec_fits(
            &x.as_dtype(Dtype::Float32).unwrap(),
            &[affine(&four)],
            None
        ));
        // Scales of float32: a float32 input's, not a bfloat16 one's.
        let float = |a: &Array| a.as_dtype(Dtype::Float32).unwrap();
        let other = (four.0.clone(), float(&four.1), float(&four.2), 4, 64);
        assert!(matvec_fits(&float(&x), &[affine(&other)], None));
        assert!(!matvec_fits(&x, &[affine(&other)], None));
        let fewer = (
            four.0.clone(),
            four.1.index((.., ..2)),
            four.2.index((.., ..2)),
            4,
            64,
        );
        assert!(!matvec_fits(&x, &[affine(&fewer)], None));
    }

    /// Three weights (a query's and a narrower key's and value's) over 1, 3 and 8 rows, with and
    /// without biases, in every float dtype, each its own output, equal the products computed in
    /// float32, to the
    /// output dtype's rounding; an input one value off 16 bytes (read value by value) too.
    #[test]
    fn products_equal_float32_products() {
        if !crate::cuda::available() {
            return;
        }
        for (dtype, tolerance) in [
            (Dtype::Float32, 1e-4),
            (Dtype::Float16, 4e-3),
            (Dtype::Bfloat16, 2e-2),
        ] {
            let weights = [
                normal(&[40, 136], dtype),
                normal(&[8, 136], dtype),
                normal(&[8, 136], dtype),
            ];
            let biases = [
                normal(&[40], dtype),
                normal(&[8], dtype),
                normal(&[8], dtype),
            ];
            let w: Vec<&Array> = weights.iter().collect();
            let b: Vec<&Array> = biases.iter().collect();
            let f32 = |a: &Array| a.as_dtype(Dtype::Float32).unwrap();
            let whole = ops::concatenate(&weights.iter().map(f32).collect::<Vec<_>>(), 0).unwrap();
            let bias = ops::concatenate(&biases.iter().map(f32).collect::<Vec<_>>(), 0).unwrap();
            for rows in [1, 3, 8] {
                let flat = normal(&[rows * 136 + 1], dtype);
                let aligned = flat.index(..rows * 136).reshape(&[rows, 1, 136]).unwrap();
                let misaligned = flat.index(1..).reshape(&[rows, 1, 136]).unwrap();
                for x in [aligned, misaligned] {
                    let want = f32(&x).matmul(whole.t()).unwrap();
                    let outputs = matvec(&x, &dense(&w), None).unwrap();
                    let shapes: Vec<&[i32]> = outputs.iter().map(Array::shape).collect();
                    assert_eq!(shapes, [&[rows, 1, 40], &[rows, 1, 8], &[rows, 1, 8]]);
                    assert!(outputs.iter().all(|y| y.dtype() == dtype));
                    let got = ops::concatenate(&outputs, -1).unwrap();
                    let e = relative_error(&got, &want);
                    assert!(e <= tolerance, "{dtype:?} rows {rows}: {e}");
                    let got =
                        ops::concatenate(&matvec(&x, &dense(&w), Some(&b)).unwrap(), -1).unwrap();
                    let e = relative_error(&got, &want.add(&bias).unwrap());
                    assert!(e <= tolerance, "{dtype:?} rows {rows} biased: {e}");
                }
            }
        }
    }

    /// One weight over an activated input and over a gated product, with and without a bias,
    /// equal the products in float32 of the activated input rounded to the dtype: every
    /// activation, over 1 and 3 rows, in bfloat16; GELU's tanh form and the SiLU-gated product
    /// over one row in float32 and float16 (each case is a kernel compiled at its first launch);
    /// an input off 16 bytes too. With a residual (the plain input and the gated one, with a
    /// bias), the residual plus the product rounded to the dtype.
    #[test]
    fn activated_and_gated_inputs_equal_float32_products() {
        if !crate::cuda::available() {
            return;
        }
        use Activation::{Gelu, GeluTanh, Silu};
        let f32 = |a: &Array| a.as_dtype(Dtype::Float32).unwrap();
        let bf16 = (Dtype::Bfloat16, 2e-2, &[1, 3][..]);
        let cases = [
            (bf16, Some(Gelu), false),
            (bf16, Some(GeluTanh), false),
            (bf16, Some(Silu), false),
            (bf16, Some(Silu), true),
            (bf16, None, false),
            ((Dtype::Float32, 1e-4, &[1][..]), Some(GeluTanh), false),
            ((Dtype::Float32, 1e-4, &[1][..]), Some(Silu), true),
            ((Dtype::Float16, 4e-3, &[1][..]), Some(GeluTanh), false),
            ((Dtype::Float16, 4e-3, &[1][..]), Some(Silu), true),
        ];
        for ((dtype, tolerance, rows), activation, gated) in cases {
            let (w, b) = (normal(&[40, 136], dtype), normal(&[40], dtype));
            for &rows in rows {
                let flat = normal(&[rows * 136 + 1], dtype);
                let aligned = flat.index(..rows * 136).reshape(&[rows, 1, 136]).unwrap();
                let misaligned = flat.index(1..).reshape(&[rows, 1, 136]).unwrap();
                let up = normal(&[rows, 1, 136], dtype);
                let up = gated.then_some(&up);
                let residual = normal(&[rows, 1, 40], dtype);
                for x in [aligned, misaligned] {
                    let mut input = match activation {
                        Some(activation) => activation.of(&f32(&x)).unwrap(),
                        None => f32(&x),
                    };
                    if let Some(up) = up {
                        input = input.multiply(f32(up)).unwrap();
                    }
                    let input = f32(&input.as_dtype(dtype).unwrap());
                    let want = input.matmul(f32(&w).t()).unwrap();
                    let plus = [None, Some(&residual)];
                    let settings = [None, Some(&b)].into_iter().flat_map(|bias| {
                        plus.into_iter()
                            .filter(move |r| r.is_none() || (bias.is_some() && rows == 1))
                            .map(move |r| (bias, r))
                    });
                    for (bias, residual) in settings {
                        let mut want = match bias {
                            Some(b) => want.add(f32(b)).unwrap(),
                            None => want.clone(),
                        };
                        if let Some(residual) = residual {
                            want = f32(&want.as_dtype(dtype).unwrap())
                                .add(f32(residual))
                                .unwrap();
                        }
                        let layer = OneLayer {
                            x: &x,
                            activation,
                            up,
                            weight: Weight::Dense(&w),
                            bias,
                            residual,
                        };
                        assert!(layer.fits());
                        let got = layer.product().unwrap();
                        assert_eq!(got.shape(), &[rows, 1, 40]);
                        assert_eq!(got.dtype(), dtype);
                        let err = relative_error(&got, &want);
                        assert!(
                            err <= tolerance,
                            "{dtype:?} {activation:?} rows {rows} gated {gated} biased {} \
                             residual {}: {err}",
                            bias.is_some(),
                            residual.is_some()
                        );
                    }
                }
            }
        }
    }

    /// Packed weights (4 and 8 bits, groups of 32, 64 and 128), three to a launch (a query's and
    /// a narrower key's and value's), with and without biases, equal the products in float32 of
    /// the weights MLX dequantizes from the same words, to the output dtype's rounding: over one
    /// row in bfloat16 for every packing; over 3 and 8 rows and an input one value off 16 bytes
    /// for 4 bits by 64; in float16 and float32 for 4 bits by 64 and 8 bits by 32.
    #[test]
    fn packed_products_equal_dequantized_products() {
        if !crate::cuda::available() {
            return;
        }
        let f32 = |a: &Array| a.as_dtype(Dtype::Float32).unwrap();
        let bf = (Dtype::Bfloat16, 2e-2);
        let mut cases = Vec::new();
        for bits in [4, 8] {
            for group_size in [32, 64, 128] {
                cases.push((bf, bits, group_size, &[1][..]));
            }
        }
        cases.push((bf, 4, 64, &[3, 8][..]));
        for dtype in [(Dtype::Float16, 4e-3), (Dtype::Float32, 1e-4)] {
            cases.push((dtype, 4, 64, &[1][..]));
            cases.push((dtype, 8, 32, &[1][..]));
        }
        for ((dtype, tolerance), bits, group_size, rows) in cases {
            let k = 256;
            let packs: Vec<_> = [40, 8, 8]
                .iter()
                .map(|&n| packed(&normal(&[n, k], dtype), bits, group_size))
                .collect();
            let weights: Vec<Weight> = packs.iter().map(affine).collect();
            let biases = [
                normal(&[40], dtype),
                normal(&[8], dtype),
                normal(&[8], dtype),
            ];
            let b: Vec<&Array> = biases.iter().collect();
            let whole =
                ops::concatenate(&packs.iter().map(dequantized).collect::<Vec<_>>(), 0).unwrap();
            let bias = ops::concatenate(&biases.iter().map(f32).collect::<Vec<_>>(), 0).unwrap();
            for &rows in rows {
                let flat = normal(&[rows * k + 1], dtype);
                let aligned = flat.index(..rows * k).reshape(&[rows, 1, k]).unwrap();
                let misaligned = flat.index(1..).reshape(&[rows, 1, k]).unwrap();
                for x in [aligned, misaligned] {
                    let want = f32(&x).matmul(whole.t()).unwrap();
                    for (biases, want) in [
                        (None, want.clone()),
                        (Some(&b[..]), want.add(&bias).unwrap()),
                    ] {
                        assert!(matvec_fits(&x, &weights, biases));
                        let outputs = matvec(&x, &weights, biases).unwrap();
                        let shapes: Vec<&[i32]> = outputs.iter().map(Array::shape).collect();
                        assert_eq!(shapes, [&[rows, 1, 40], &[rows, 1, 8], &[rows, 1, 8]]);
                        assert!(outputs.iter().all(|y| y.dtype() == dtype));
                        let err = relative_error(&ops::concatenate(&outputs, -1).unwrap(), &want);
                        assert!(
                            err <= tolerance,
                            "{dtype:?} {bits} bits by {group_size}, rows {rows}, biased {}: {err}",
                            biases.is_some()
                        );
                    }
                }
            }
        }
    }

    /// One packed weight over an input as it is plus a residual, over a GELU-activated input,
    /// and over a SiLU-gated product plus a residual, with a bias, equals the product in float32
    /// of the dequantized weight and the activated input rounded to the dtype (then the residual
    /// added to the rounded product): 4 bits by 64 in bfloat16, 8 bits by 128 in float32.
    #[test]
    fn packed_layers_of_activated_and_gated_inputs_equal_float32_products() {
        if !crate::cuda::available() {
            return;
        }
        use Activation::{GeluTanh, Silu};
        let f32 = |a: &Array| a.as_dtype(Dtype::Float32).unwrap();
        for (dtype, tolerance, bits, group_size) in [
            (Dtype::Bfloat16, 2e-2, 4, 64),
            (Dtype::Float32, 1e-4, 8, 128),
        ] {
            let k = 256;
            let p = packed(&normal(&[40, k], dtype), bits, group_size);
            let b = normal(&[40], dtype);
            let (x, up, residual) = (
                normal(&[1, 1, k], dtype),
                normal(&[1, 1, k], dtype),
                normal(&[1, 1, 40], dtype),
            );
            for (activation, gated, plus) in [
                (None, false, true),
                (Some(GeluTanh), false, false),
                (Some(Silu), true, true),
            ] {
                let mut input = match activation {
                    Some(activation) => activation.of(&f32(&x)).unwrap(),
                    None => f32(&x),
                };
                if gated {
                    input = input.multiply(f32(&up)).unwrap();
                }
                let input = f32(&input.as_dtype(dtype).unwrap());
                let mut want = input
                    .matmul(dequantized(&p).t())
                    .unwrap()
                    .add(f32(&b))
                    .unwrap();
                if plus {
                    want = f32(&want.as_dtype(dtype).unwrap())
                        .add(f32(&residual))
                        .unwrap();
                }
                let layer = OneLayer {
                    x: &x,
                    activation,
                    up: gated.then_some(&up),
                    weight: affine(&p),
                    bias: Some(&b),
                    residual: plus.then_some(&residual),
                };
                assert!(layer.fits());
                let got = layer.product().unwrap();
                assert_eq!((got.shape(), got.dtype()), (&[1, 1, 40][..], dtype));
                let err = relative_error(&got, &want);
                assert!(
                    err <= tolerance,
                    "{dtype:?} {activation:?} gated {gated}: {err}"
                );
            }
        }
    }
}
