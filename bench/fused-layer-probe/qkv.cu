  // The body of `qkv_probe.py`'s kernel (once lmx's `cuda/normed_qkv.rs`, not kept: docs/benchmarks.md,
  // "Fifth session of 2026-11-28"): a pre-norm attention block's query, key and value for one
  // decoded row. Block `t` takes head `t / (HD / 8)` of the queries, then the keys, then the
  // values, and its pairs `4 * (t % (HD / 8)) ..` (component `i` and `i + HD / 2`), each warp one
  // row: it loads its rows into registers, computes the norm of `x` into shared memory while they
  // arrive, then dots and rotates (RoPE, rotate-half) the query and key.
  constexpr int WARPS = 8;
  constexpr int ROWS = HD / 8;
  const float eps = __int_as_float(EPS_BITS);
  __shared__ __align__(16) T xs[D];
  __shared__ float red[WARPS];
  __shared__ float s_y[WARPS];
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  // Whether every operand starts on a 16-byte boundary (rows of D values then do too).
  const bool aligned = ((reinterpret_cast<size_t>(x) | reinterpret_cast<size_t>(nw) |
                         reinterpret_cast<size_t>(wq) | reinterpret_cast<size_t>(wk) |
                         reinterpret_cast<size_t>(wv)) % 16) == 0;
  const int head = blockIdx.x / ROWS;
  const int pair = (blockIdx.x % ROWS) * 4 + warp / 2;
  const int row = pair + (warp & 1) * (HD / 2);
  const T* w = head < HQ ? wq + size_t(head * HD + row) * D
             : head < HQ + HKV ? wk + size_t((head - HQ) * HD + row) * D
             : wv + size_t((head - HQ - HKV) * HD + row) * D;
  lmx_task_rows<lmx_dense<T>, D / 2> rows;
  rows.load(w, w + D / 2, lane, aligned);
  lmx_task_rms_norm<T, D, WARPS>(x, nw, xs, eps, red, aligned);
  float a0, a1;
  rows.dot(xs, xs + D / 2, lane, a0, a1);
  if (lane == 0) {
    s_y[warp] = static_cast<float>(static_cast<T>(a0 + a1));
  }
  __syncthreads();
  if (lane == 0 && (warp & 1) == 0) {
    float y0 = s_y[warp];
    float y1 = s_y[warp + 1];
    if (head < HQ + HKV) {
      // Rotate-half RoPE, as lmx's RoPE kernel computes it.
      const bool query = head < HQ;
      const float at = static_cast<float>(query ? q_at[0] : k_at[0]);
      float s, c;
      sincosf(at * (query ? q_rates : k_rates)[pair], &s, &c);
      const float a = y0;
      y0 = a * c - y1 * s;
      y1 = a * s + y1 * c;
    }
    T* o = head < HQ ? q + head * HD
         : head < HQ + HKV ? k + (head - HQ) * HD
         : v + (head - HQ - HKV) * HD;
    o[pair] = static_cast<T>(y0);
    o[pair + HD / 2] = static_cast<T>(y1);
  }
