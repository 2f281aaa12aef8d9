//! Launches whose blocks take tasks in order ("tickets") from a control block, and the device
//! helpers their kernels share ([`HEADER`]).
//!
//! A decoding kernel that does several dependent steps in one launch (a norm, then products of
//! its output, then a product of theirs) splits each step into tasks. A block takes its task's
//! ticket from a counter, loads the task's weight rows into registers, and only then waits for
//! the step before to be done (a counter of tasks done per step): the weights stream while the
//! last tasks of the step before finish. A block waits only for tasks whose tickets are smaller
//! than its own, taken by blocks already running, so a launch finishes however many of its blocks
//! the GPU holds at once (no grid-wide barrier, which would need them all resident).
//!
//! The counters live in a control block per kernel and stream (zeros in device memory, reset by
//! each launch's last block as it leaves), each counter on a 128-byte line of its own: the ticket
//! at line 0, the blocks that left at line 1, then each step's tasks done. Launches of one kernel
//! on one stream share it: a decoder's launches run one after another, each layer's reading the
//! output of the one before. (Two launches of one kernel with no data between them in one
//! evaluation, which a CUDA graph may run at once, would share it too; lmx takes these kernels,
//! and decode attention's split launches, which count on a block of [`zeroed`] counters the same
//! way, only in a decoder's layers, whatever its rows: such a chain.)

use crate::error::{Error, Result};
use mlx_rs::ops::zeros_dtype;
use mlx_rs::transforms::eval;
use mlx_rs::{Array, Dtype, Stream};
use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

/// Ints of a control block: eight counters, each on a 128-byte line of its own.
const CONTROL: i32 = 8 * 32;

/// Each kernel's control block (and other blocks, [`zeroed`]) per stream, by its name and the
/// stream's index: launches on one stream (from any thread) run one after another; launches on
/// two streams never share one.
static CONTROLS: OnceLock<Mutex<HashMap<(&'static str, i32), Array>>> = OnceLock::new();

/// The control block of kernel `kernel` on the stream this thread launches on.
pub(super) fn control(kernel: &'static str) -> Result<Array> {
    zeroed(kernel, CONTROL, Dtype::Int32)
}

/// The block named `name` of at least `n` values of `dtype` (and of a control block's size at
/// least) on the stream this thread launches on: a kernel's counters, which every launch leaves
/// zeroed, or its scratch values. Made once (again where a launch needs more) by a device
/// operation, so in device memory (a block made by the host would lie in host memory on the GPU
/// machines, each atomic a trip across PCIe: [`crate::nn::device_resident`]'s note), and evaluated then,
/// so that a compiled step's trace captures it as a constant; kernels write it through their
/// input's pointer, so it costs a launch no output of its own.
pub(super) fn zeroed(name: &'static str, n: i32, dtype: Dtype) -> Result<Array> {
    let key = (name, Stream::thread_local_or_default().get_index()?);
    let controls = CONTROLS.get_or_init(Mutex::default);
    let mut controls = controls
        .lock()
        .map_err(|_| Error::Layout("the kernels' control blocks were poisoned".into()))?;
    if let Some(block) = controls
        .get(&key)
        .filter(|block| block.size() >= n as usize && block.dtype() == dtype)
    {
        return Ok(block.clone());
    }
    let size = n.max(CONTROL);
    let block = zeros_dtype(&[size], dtype)?;
    // Made from no traced input, the block is no tracer: MLX evaluates it inside a trace.
    eval([&block])?;
    controls.insert(key, block.clone());
    Ok(block)
}

/// Device helpers: the counters' acquire loads, bounded waits and the leaving block's reset;
/// weight rows streamed into registers and dotted with a shared input. Needs
/// [`super::matvec::HEADER`], [`super::row_norm::HEADER`] and a weight form's header
/// ([`Format::header`](super::weights::Format::header)) before it.
pub(super) const HEADER: &str = r#"
__device__ __forceinline__ int lmx_task_acquire(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ long long lmx_task_now() {
  long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Thread 0 waits until `*counter` reaches `need` (the tasks of a phase before, done); bounded, so
// that a corrupted control block cannot hang the GPU (its launch's numbers are then wrong, not
// its process stuck). The caller's `__syncthreads()` then releases the block.
__device__ __forceinline__ void lmx_task_wait(const int* counter, int need) {
  if (threadIdx.x == 0) {
    const long long start = lmx_task_now();
    while (lmx_task_acquire(counter) < need && lmx_task_now() - start < 200000000LL) {
      __nanosleep(32);
    }
  }
}

// Counts this block out of the launch (counter 1); the last block to leave zeroes the first
// `LINES` counters: every block has left, none reads or writes them again in this launch.
template <int LINES>
__device__ __forceinline__ void lmx_task_leave(int* control) {
  if (threadIdx.x == 0) {
    const int left = atomicAdd(control + 32, 1);
    if (left == int(gridDim.x) - 1) {
#pragma unroll
      for (int i = 0; i < LINES; ++i) control[i * 32] = 0;
      __threadfence();
    }
  }
}

// Two stretches of K values of weight rows (rows of the matrix type `W`: `lmx_dense<T>` or
// `lmx_affine<T, BITS, GS>`), loaded into a warp's registers (all loads issued before any is
// used), then dotted with two stretches of the shared input.
template <typename W, int K>
struct lmx_task_rows {
  using T = typename W::value;
  static constexpr int N = K / W::VALUES;
  static constexpr int PER = (N + 31) / 32;
  typename W::chunk p[PER], q[PER];
  __device__ __forceinline__ void load(
      const typename W::row& r0, const typename W::row& r1, int lane, bool aligned) {
#pragma unroll
    for (int u = 0; u < PER; ++u) {
      const int i = u * 32 + lane;
      if (i < N) {
        p[u] = r0.stream(i, aligned);
        q[u] = r1.stream(i, aligned);
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
        W::dot(p[u], x0 + size_t(i) * W::VALUES, true, a0);
        W::dot(q[u], x1 + size_t(i) * W::VALUES, true, a1);
      }
    }
    a0 = lmx_warp_sum(a0);
    a1 = lmx_warp_sum(a1);
  }
};
"#;
