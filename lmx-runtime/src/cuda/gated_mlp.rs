//! A pre-norm gated MLP in decoding, `res + down(f(gate(n)) * up(n))` with `n = rms_norm(x)`, as
//! one kernel.
//!
//! Decoding one token through such a block took three kernels (the norm, the gate and up
//! products, the down product over the gated input plus the residual), each an MLX operation
//! whose host time a token pays, and each a launch whose first and last microseconds leave the
//! memory idle. Here one launch does it all in two phases: every block computes the norm of `x`
//! into shared memory and takes tasks of 8 features of the gate and up products (the gated value
//! rounded to `T` into a scratch output), then tasks of 4 rows of the down product, each warp a
//! half row. A block takes its tasks in order from a counter (a ticket), loads the task's weight
//! rows into registers, and only then waits for the phase before to be done: the weights stream
//! while the last tasks of the first phase finish. A block waits only for tasks whose tickets are
//! smaller than its own, taken by blocks already running, so the launch finishes however many of
//! its blocks the GPU holds at once (no grid-wide barrier, which would need them all resident).
//!
//! The counters live in a control block per stream (zeros, reset by the launch's last block as it
//! leaves), so launches on one stream share it: a decoder's launches run one after another, each
//! layer's reading the output of the one before. (Two launches with no data between them in one
//! evaluation, which a CUDA graph may run at once, would share it too; lmx takes this kernel for
//! one row of one sequence, whose layers are such a chain.) Values are rounded
//! as the separate kernels round them: the norm as MLX's (`w * T(x * r)`), the products to `T`,
//! the gated value once (`T(f(g) * u)`), then the down product and its sum with the residual.

use super::kernel::{Inputs, Kernel, Launch, TemplateArg};
use super::sums::pack_width;
use crate::error::{Error, Result};
use crate::nn::Activation;
use mlx_rs::{Array, Dtype, Stream};
use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

/// Threads per block: eight warps.
const THREADS: i32 = 256;

/// Blocks per launch: two per streaming multiprocessor of an H100 or H200 (132); a smaller GPU
/// runs them as it can (see the module's note).
const BLOCKS: i32 = 264;

/// A warp's 16-byte loads in flight per row stretch, at most (registers).
const MAX_LOADS: i32 = 8;

/// Ints of the control block: three counters, each on a 128-byte line of its own.
const CONTROL: i32 = 3 * 32;

thread_local! {
    static KERNEL: Result<Kernel> = Kernel::new(
        "lmx_gated_mlp",
        (&["x", "nw", "wg", "wu", "wd", "res", "ctl"], Inputs::RowContiguous),
        &["y", "act"],
        &format!(
            "{}{}{HEADER}",
            super::activation::HEADER,
            super::matvec::HEADER
        ),
        BODY,
    );
}

/// Each stream's control block, by the stream's index: launches on one stream (from any thread)
/// run one after another and share one; launches on two streams never share one.
static CONTROLS: OnceLock<Mutex<HashMap<i32, Array>>> = OnceLock::new();

const HEADER: &str = r#"
__device__ __forceinline__ int lmx_mlp_acquire(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ long long lmx_mlp_now() {
  long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// 16 bytes of weights read once, around L1; value by value where `p` is not 16-byte aligned.
template <typename T>
__device__ __forceinline__ uint4 lmx_mlp_stream(const T* p, bool aligned) {
  if (!aligned) {
    return lmx_matvec_load<T, 16 / int(sizeof(T))>(p, false);
  }
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}

template <typename T>
__device__ __forceinline__ float lmx_mlp_dot(uint4 a, uint4 b) {
  const T* x = reinterpret_cast<const T*>(&a);
  const T* y = reinterpret_cast<const T*>(&b);
  float s = 0.0f;
#pragma unroll
  for (int j = 0; j < 16 / int(sizeof(T)); ++j) {
    s += static_cast<float>(x[j]) * static_cast<float>(y[j]);
  }
  return s;
}

__device__ __forceinline__ float lmx_mlp_warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o /= 2) {
    v += __shfl_xor_sync(0xffffffff, v, o);
  }
  return v;
}

// Two stretches of K values of weight rows, loaded into a warp's registers (all loads issued
// before any is used), then dotted with two stretches of the shared input.
template <typename T, int K>
struct lmx_mlp_rows {
  static constexpr int V = 16 / int(sizeof(T));
  static constexpr int N = K / V;
  static constexpr int PER = (N + 31) / 32;
  uint4 p[PER], q[PER];
  __device__ __forceinline__ void load(const T* r0, const T* r1, int lane, bool aligned) {
#pragma unroll
    for (int u = 0; u < PER; ++u) {
      const int i = u * 32 + lane;
      if (i < N) {
        p[u] = lmx_mlp_stream<T>(r0 + size_t(i) * V, aligned);
        q[u] = lmx_mlp_stream<T>(r1 + size_t(i) * V, aligned);
      }
    }
  }
  __device__ __forceinline__ void dot(const T* x0, const T* x1, int lane, float& a0, float& a1) {
    a0 = 0.0f;
    a1 = 0.0f;
#pragma unroll
    for (int u = 0; u < PER; ++u) {
      const int i = u * 32 + lane;
      if (i < N) {
        a0 += lmx_mlp_dot<T>(p[u], reinterpret_cast<const uint4*>(x0)[i]);
        a1 += lmx_mlp_dot<T>(q[u], reinterpret_cast<const uint4*>(x1)[i]);
      }
    }
    a0 = lmx_mlp_warp_sum(a0);
    a1 = lmx_mlp_warp_sum(a1);
  }
};
"#;

/// The kernel's body. Template arguments: `T`, `D` (the model's width), `F` (the MLP's), `KX`
/// (the larger), `ACT` (the activation) and `EPS_BITS` (the norm's epsilon's float bits).
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
  const bool aligned = ((reinterpret_cast<size_t>(x) | reinterpret_cast<size_t>(nw) |
                         reinterpret_cast<size_t>(wg) | reinterpret_cast<size_t>(wu) |
                         reinterpret_cast<size_t>(wd)) % 16) == 0;
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
      lmx_mlp_rows<T, D> w;
      w.load(wg + size_t(f) * D, wu + size_t(f) * D, lane, aligned);
      if (have != 0) {
        // The norm of x: every thread's loads first, then the sum of squares over the block.
        constexpr int NV = D / V;
        constexpr int PER = (NV + WARPS * 32 - 1) / (WARPS * 32);
        uint4 xv[PER], nv[PER];
#pragma unroll
        for (int k = 0; k < PER; ++k) {
          const int i = k * WARPS * 32 + threadIdx.x;
          if (i < NV) {
            xv[k] = lmx_matvec_load<T, V>(x + size_t(i) * V, aligned);
            nv[k] = lmx_matvec_load<T, V>(nw + size_t(i) * V, aligned);
          }
        }
        float ss = 0.0f;
#pragma unroll
        for (int k = 0; k < PER; ++k) {
          if (k * WARPS * 32 + threadIdx.x < NV) {
            const T* v = reinterpret_cast<const T*>(&xv[k]);
#pragma unroll
            for (int j = 0; j < V; ++j) {
              ss += static_cast<float>(v[j]) * static_cast<float>(v[j]);
            }
          }
        }
        ss = lmx_mlp_warp_sum(ss);
        if (lane == 0) red[warp] = ss;
        __syncthreads();
        ss = 0.0f;
#pragma unroll
        for (int i = 0; i < WARPS; ++i) ss += red[i];
        const float r = rsqrtf(ss / float(D) + eps);
#pragma unroll
        for (int k = 0; k < PER; ++k) {
          const int i = k * WARPS * 32 + threadIdx.x;
          if (i < NV) {
            const T* v = reinterpret_cast<const T*>(&xv[k]);
            const T* n = reinterpret_cast<const T*>(&nv[k]);
            uint4 packed;
            T* o = reinterpret_cast<T*>(&packed);
#pragma unroll
            for (int j = 0; j < V; ++j) {
              o[j] = n[j] * static_cast<T>(static_cast<float>(v[j]) * r);
            }
            reinterpret_cast<uint4*>(xs)[i] = packed;
          }
        }
        __syncthreads();
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
      lmx_mlp_rows<T, F / 4> w;
      const T* r = wd + size_t(row) * F + half;
      w.load(r, r + F / 4, lane, aligned);
      if (threadIdx.x == 0) {
        // Every gated value written; bounded, so that a corrupted control block cannot hang
        // the GPU (its launch's numbers are then wrong, not its process stuck).
        const long long start = lmx_mlp_now();
        while (lmx_mlp_acquire(ctl + 64) < TG && lmx_mlp_now() - start < 200000000LL) {
          __nanosleep(32);
        }
      }
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
    // The writers make the task's results visible before it counts as done.
    if (lane == 0) {
      __threadfence();
    }
    if (threadIdx.x == 0) {
      s_ticket = claimed;
    }
    __syncthreads();
    if (threadIdx.x == 0 && t < TG) {
      atomicAdd(control + 64, 1);
    }
    t = s_ticket;
  }
  if (threadIdx.x == 0) {
    const int left = atomicAdd(control + 32, 1);
    if (left == int(gridDim.x) - 1) {
      // Every block has left: none reads or writes the counters again in this launch.
      control[0] = 0;
      control[64] = 0;
      control[32] = 0;
      __threadfence();
    }
  }
"#;

/// A pre-norm gated MLP over one row: `res + down(f(gate(n)) * up(n))`, `n = rms_norm(x) * norm`.
pub(crate) struct GatedMlp<'a> {
    pub x: &'a Array,
    pub norm: &'a Array,
    pub eps: f32,
    pub activation: Activation,
    pub gate: &'a Array,
    pub up: &'a Array,
    pub down: &'a Array,
    pub residual: &'a Array,
}

impl GatedMlp<'_> {
    /// Whether the kernel takes it: one row `x` of width `D` and a residual of its shape, a
    /// norm `[D]`, gate and up `[F, D]`, down `[D, F]`, all of one floating-point dtype; `D` a
    /// whole number of 16-byte vectors (and of 4 rows), `F` of four times that (the down
    /// product's quarters), each row stretch at most [`MAX_LOADS`] loads a lane.
    pub(crate) fn fits(&self) -> bool {
        use Dtype::{Bfloat16, Float16, Float32};
        let dtype = self.x.dtype();
        let Some(&d) = self.x.shape().last() else {
            return false;
        };
        let f = self.gate.shape().first().copied().unwrap_or(0);
        let v = pack_width(dtype);
        let same = |a: &Array| a.dtype() == dtype;
        let lanes = |k: i32| (k / v + 31) / 32;
        matches!(dtype, Float32 | Float16 | Bfloat16)
            && self.x.size() as i32 == d
            && self.residual.shape() == self.x.shape()
            && self.norm.shape() == [d]
            && self.gate.shape() == [f, d]
            && self.up.shape() == [f, d]
            && self.down.shape() == [d, f]
            && [self.norm, self.gate, self.up, self.down, self.residual]
                .into_iter()
                .all(same)
            && d > 0
            && f > 0
            && d % v == 0
            && d % 4 == 0
            && f % (4 * v) == 0
            && lanes(d) <= MAX_LOADS
            && lanes(f / 4) <= MAX_LOADS
    }

    /// The block's output, shaped as `x`. Callers check [`fits`](Self::fits).
    pub(crate) fn apply(&self) -> Result<Array> {
        let d = *self.x.shape().last().unwrap_or(&1);
        let f = self.gate.shape()[0];
        let inputs = [
            self.x.clone(),
            self.norm.clone(),
            self.gate.clone(),
            self.up.clone(),
            self.down.clone(),
            self.residual.clone(),
            control()?,
        ];
        let template = [
            TemplateArg::Type("T", self.x.dtype()),
            TemplateArg::Int("D", d),
            TemplateArg::Int("F", f),
            TemplateArg::Int("KX", d.max(f)),
            TemplateArg::Int("ACT", self.activation as i32),
            TemplateArg::Int("EPS_BITS", self.eps.to_bits() as i32),
        ];
        let tasks = f / 8 + d / 4;
        let outputs = KERNEL.with(|kernel| {
            let kernel = kernel
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

/// The control block of the stream this thread launches on: zeros, made once from host data (so
/// that no evaluation is needed, which a compiled step's trace would refuse) and then kept as
/// each launch leaves it.
fn control() -> Result<Array> {
    let key = Stream::thread_local_or_default().get_index()?;
    let controls = CONTROLS.get_or_init(Mutex::default);
    let mut controls = controls
        .lock()
        .map_err(|_| Error::Layout("the gated MLP's control blocks were poisoned".into()))?;
    if let Some(block) = controls.get(&key) {
        return Ok(block.clone());
    }
    let block = Array::from_slice(&[0i32; CONTROL as usize], &[CONTROL]);
    controls.insert(key, block.clone());
    Ok(block)
}
