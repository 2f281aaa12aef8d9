//! Elementwise activations and their derivatives, and the gated product `f(gate) * up`, one pass
//! each.
//!
//! Each kernel reads its inputs once and writes its outputs once, computing in float32: the
//! forward pass `y = f(x)`, the backward pass `dx = dy f'(x)` from `x` alone, and the gated
//! product and both its gradients (the activation recomputed from `gate`). Written with
//! MLX's operations, GELU's gradient keeps `1 + erf(x / sqrt 2)` from the forward pass and both
//! passes compile into two kernels each (docs/benchmarks.md).

use super::kernel::{with_kernel, Inputs, Kernel, Launch, TemplateArg};
use super::sums::pack_width;
use crate::error::Result;
use crate::nn::Activation;
use mlx_rs::Array;

/// `lmx_activation<ACT>` and its derivative in float32, `ACT` an [`Activation`]'s discriminant.
pub(super) const HEADER: &str = r#"
template <int ACT>
__device__ __forceinline__ float lmx_activation(float x) {
  if constexpr (ACT == 0) {
    return 0.5f * x * (1.f + erff(x * 0.70710678118654752f));
  } else if constexpr (ACT == 1) {
    return 0.5f * x * (1.f + tanhf(0.79788456080286536f * (x + 0.044715f * x * x * x)));
  } else {
    return x / (1.f + expf(-x));
  }
}

template <int ACT>
__device__ __forceinline__ float lmx_activation_derivative(float x) {
  if constexpr (ACT == 0) {
    const float cdf = 0.5f * (1.f + erff(x * 0.70710678118654752f));
    return cdf + x * expf(-0.5f * x * x) * 0.39894228040143268f;
  } else if constexpr (ACT == 1) {
    const float t = tanhf(0.79788456080286536f * (x + 0.044715f * x * x * x));
    const float slope = 0.79788456080286536f * (1.f + 3.f * 0.044715f * x * x);
    return 0.5f * (1.f + t) + 0.5f * x * (1.f - t * t) * slope;
  } else {
    const float s = 1.f / (1.f + expf(-x));
    return s * (1.f + x * (1.f - s));
  }
}
"#;

/// A kernel's body: what every kernel here opens with, then `$rest`. The opening declares `Pack`
/// (`VEC` values of `T`, loaded or stored at once) and `i`, this thread's first value; a thread
/// past the end returns.
macro_rules! elementwise_body {
    ($rest:literal) => {
        concat!(
            r#"
  struct alignas(sizeof(T) * VEC) Pack {
    T v[VEC];
  };
  const size_t size = x_shape[0];
  const size_t i = (static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x) * VEC;
  if (i >= size) {
    return;
  }
"#,
            $rest
        )
    };
}

/// `y[i] = f(x[i])`; each thread takes `VEC` neighbouring values, at once where aligned.
const FORWARD: &str = elementwise_body!(
    r#"  if (i + VEC <= size &&
      (reinterpret_cast<size_t>(x) | reinterpret_cast<size_t>(y)) % sizeof(Pack) == 0) {
    const Pack in = *reinterpret_cast<const Pack*>(x + i);
    Pack out;
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      out.v[j] = static_cast<T>(lmx_activation<ACT>(static_cast<float>(in.v[j])));
    }
    *reinterpret_cast<Pack*>(y + i) = out;
  } else {
    for (size_t j = i; j < i + VEC && j < size; ++j) {
      y[j] = static_cast<T>(lmx_activation<ACT>(static_cast<float>(x[j])));
    }
  }
"#
);

/// `dx[i] = dy[i] f'(x[i])`, laid out as [`FORWARD`].
const BACKWARD: &str = elementwise_body!(
    r#"  if (i + VEC <= size && (reinterpret_cast<size_t>(x) | reinterpret_cast<size_t>(dy) |
                          reinterpret_cast<size_t>(dx)) % sizeof(Pack) == 0) {
    const Pack in = *reinterpret_cast<const Pack*>(x + i);
    const Pack grad = *reinterpret_cast<const Pack*>(dy + i);
    Pack out;
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      const float slope = lmx_activation_derivative<ACT>(static_cast<float>(in.v[j]));
      out.v[j] = static_cast<T>(static_cast<float>(grad.v[j]) * slope);
    }
    *reinterpret_cast<Pack*>(dx + i) = out;
  } else {
    for (size_t j = i; j < i + VEC && j < size; ++j) {
      const float slope = lmx_activation_derivative<ACT>(static_cast<float>(x[j]));
      dx[j] = static_cast<T>(static_cast<float>(dy[j]) * slope);
    }
  }
"#
);

/// `y[i] = f(x[i]) u[i]`, the gated MLP's product, laid out as [`FORWARD`].
const GATED: &str = elementwise_body!(
    r#"  if (i + VEC <= size && (reinterpret_cast<size_t>(x) | reinterpret_cast<size_t>(u) |
                          reinterpret_cast<size_t>(y)) % sizeof(Pack) == 0) {
    const Pack gate = *reinterpret_cast<const Pack*>(x + i);
    const Pack up = *reinterpret_cast<const Pack*>(u + i);
    Pack out;
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      out.v[j] = static_cast<T>(lmx_activation<ACT>(static_cast<float>(gate.v[j])) *
                                static_cast<float>(up.v[j]));
    }
    *reinterpret_cast<Pack*>(y + i) = out;
  } else {
    for (size_t j = i; j < i + VEC && j < size; ++j) {
      y[j] = static_cast<T>(lmx_activation<ACT>(static_cast<float>(x[j])) *
                            static_cast<float>(u[j]));
    }
  }
"#
);

/// The gated product's gradients, `dx[i] = dy[i] u[i] f'(x[i])` and `du[i] = dy[i] f(x[i])`, the
/// activation computed again from `x`; laid out as [`FORWARD`].
const GATED_BACKWARD: &str = elementwise_body!(
    r#"  if (i + VEC <= size &&
      (reinterpret_cast<size_t>(x) | reinterpret_cast<size_t>(u) | reinterpret_cast<size_t>(dy) |
       reinterpret_cast<size_t>(dx) | reinterpret_cast<size_t>(du)) % sizeof(Pack) == 0) {
    const Pack gate = *reinterpret_cast<const Pack*>(x + i);
    const Pack up = *reinterpret_cast<const Pack*>(u + i);
    const Pack grad = *reinterpret_cast<const Pack*>(dy + i);
    Pack d_gate;
    Pack d_up;
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      const float g = static_cast<float>(gate.v[j]);
      const float d = static_cast<float>(grad.v[j]);
      const float slope = lmx_activation_derivative<ACT>(g);
      d_gate.v[j] = static_cast<T>(d * static_cast<float>(up.v[j]) * slope);
      d_up.v[j] = static_cast<T>(d * lmx_activation<ACT>(g));
    }
    *reinterpret_cast<Pack*>(dx + i) = d_gate;
    *reinterpret_cast<Pack*>(du + i) = d_up;
  } else {
    for (size_t j = i; j < i + VEC && j < size; ++j) {
      const float g = static_cast<float>(x[j]);
      const float d = static_cast<float>(dy[j]);
      dx[j] = static_cast<T>(d * static_cast<float>(u[j]) * lmx_activation_derivative<ACT>(g));
      du[j] = static_cast<T>(d * lmx_activation<ACT>(g));
    }
  }
"#
);

thread_local! {
    static FORWARD_KERNEL: Result<Kernel> =
        Kernel::new("lmx_activation", (&["x"], Inputs::RowContiguous), &["y"], HEADER, FORWARD);
    static BACKWARD_KERNEL: Result<Kernel> = Kernel::new(
        "lmx_activation_backward",
        (&["x", "dy"], Inputs::RowContiguous),
        &["dx"],
        HEADER,
        BACKWARD,
    );
    static GATED_KERNEL: Result<Kernel> =
        Kernel::new("lmx_gated", (&["x", "u"], Inputs::RowContiguous), &["y"], HEADER, GATED);
    static GATED_BACKWARD_KERNEL: Result<Kernel> = Kernel::new(
        "lmx_gated_backward",
        (&["x", "u", "dy"], Inputs::RowContiguous),
        &["dx", "du"],
        HEADER,
        GATED_BACKWARD,
    );
}

/// Threads per block.
const THREADS: i32 = 256;

/// The largest array the kernels take: its flat size, rounded up to a whole pack, indexes as an
/// `int`, as MLX's launch grid counts.
const MAX_SIZE: usize = (i32::MAX - 16) as usize;

/// Whether the kernels take `x`: a floating-point array of at most [`MAX_SIZE`] values, and not
/// an empty one (MLX cannot launch an empty grid).
pub(crate) fn activation_fits(x: &Array) -> bool {
    use mlx_rs::Dtype::{Bfloat16, Float16, Float32};
    matches!(x.dtype(), Float32 | Float16 | Bfloat16) && (1..=MAX_SIZE).contains(&x.size())
}

/// Launches the kernel made in `cell` on `inputs` (all of `x`'s shape, flattened), giving
/// `outputs` arrays of `x`'s shape and dtype.
fn elementwise(
    cell: &'static std::thread::LocalKey<Result<Kernel>>,
    activation: Activation,
    inputs: &[&Array],
    outputs: usize,
) -> Result<Vec<Array>> {
    let x = inputs[0];
    let size = x.size() as i32;
    let vec = pack_width(x.dtype());
    let flat = inputs
        .iter()
        .map(|input| Ok(input.reshape(&[-1])?))
        .collect::<Result<Vec<Array>>>()?;
    let flat_shape = [size];
    let shapes = vec![(&flat_shape[..], x.dtype()); outputs];
    let results = with_kernel(cell, |kernel| {
        kernel.launch(
            &flat,
            &Launch {
                outputs: &shapes,
                grid: ((size + vec - 1) / vec, 1, 1),
                block: (THREADS, 1, 1),
                template: &[
                    TemplateArg::Type("T", x.dtype()),
                    TemplateArg::Int("VEC", vec),
                    TemplateArg::Int("ACT", activation as i32),
                ],
            },
        )
    })?;
    results
        .into_iter()
        .map(|flat| Ok(flat.reshape(x.shape())?))
        .collect()
}

/// The one array a kernel made.
fn single(mut outputs: Vec<Array>) -> Array {
    outputs.remove(0)
}

/// `f(x)`, elementwise, in `x`'s dtype.
pub(crate) fn activation(activation: Activation, x: &Array) -> Result<Array> {
    elementwise(&FORWARD_KERNEL, activation, &[x], 1).map(single)
}

/// `dy f'(x)`, elementwise, in `x`'s dtype (`dy` of `x`'s shape, read in `x`'s precision: a wider
/// `dy` is rounded to it first).
pub(crate) fn activation_backward(activation: Activation, x: &Array, dy: &Array) -> Result<Array> {
    let dy = dy.as_dtype(x.dtype())?;
    elementwise(&BACKWARD_KERNEL, activation, &[x, &dy], 1).map(single)
}

/// `silu(gate) * up` in `gate`'s dtype (`up` of `gate`'s shape and dtype).
pub(crate) fn swiglu(gate: &Array, up: &Array) -> Result<Array> {
    elementwise(&GATED_KERNEL, Activation::Silu, &[gate, up], 1).map(single)
}

/// The gradients of [`swiglu`] in `gate` and in `up` for the cotangent `dy` (read in `gate`'s
/// precision).
pub(crate) fn swiglu_backward(gate: &Array, up: &Array, dy: &Array) -> Result<[Array; 2]> {
    let dy = dy.as_dtype(gate.dtype())?;
    let both = elementwise(
        &GATED_BACKWARD_KERNEL,
        Activation::Silu,
        &[gate, up, &dy],
        2,
    )?;
    both.try_into().map_err(|_| {
        crate::error::Error::Layout("the gated product's gradient kernel made no two arrays".into())
    })
}
