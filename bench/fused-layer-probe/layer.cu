  // The body of `probe.py`'s kernel: a LLaMA decoder layer's decoding step for one row, in five
  // phases of tasks (q/k/v rows with RoPE and the cache written at `pos`; attention of a head over
  // a chunk of the cache; the output product plus the residual; the gate and up products, gated;
  // the down product plus the residual). Blocks take tickets in order from `ctl` (counters on
  // 128-byte lines: ticket, blocks left, each phase's tasks done, then the position), load a
  // task's weight rows and then wait for the phase before; the last block to leave resets the
  // counters and advances the position.
  constexpr int WARPS = 8;
  constexpr int V = 16 / int(sizeof(T));
  constexpr int GROUP = NQ / NKV;
  constexpr int E = HD / 32;
  constexpr int TA = (NQ + 2 * NKV) * HD / 8;
  constexpr int TB = NQ * CH;
  constexpr int TC = D / 8;
  constexpr int TD = F / 8;
  constexpr int TE = D / 4;
  constexpr int SB = TA, SC = SB + TB, SD = SC + TC, SE = SD + TD, TOTAL = SE + TE;
  const float eps = __int_as_float(EPS_BITS);
  const float NEG_INF = -__int_as_float(0x7f800000);
  int* ctl_w = const_cast<int*>(ctl);
  T* kc_w = const_cast<T*>(kc);
  T* vc_w = const_cast<T*>(vc);

  __shared__ int s_ticket;
  __shared__ int s_pos;
  __shared__ __align__(16) T xs[KX];
  __shared__ float red[WARPS];
  __shared__ float s_m[WARPS];
  __shared__ float s_l[WARPS];
  __shared__ float s_acc[WARPS][HD];
  __shared__ float s_f[NQ * CH];
  __shared__ float s_y[WARPS];
  __shared__ float s_cm[NQ * CH];
  __shared__ float s_cl[NQ * CH];
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  if (threadIdx.x == 0) {
    s_pos = lmx_ld_acquire(ctl + 8 * 32);
  }
  __syncthreads();
  const int pos = s_pos;
  const int len = pos + 1;
  int have = -1;  // which phase's input xs holds


  // Row j of task t's weights: 8 rows (0..7: warp w takes row w, in two halves) but for the
  // gated MLP's 16 (warp w takes gate row and up row of one feature: 2w and 2w+1).
  auto row_of = [&](int t, int j) -> const T* {
    if (t < SB) {
      const int slot = t / (HD / 8);
      const int pair = (t % (HD / 8)) * 4 + j / 2;
      const T* w = slot < NQ ? wq : slot < NQ + NKV ? wk : wv;
      const int base = (slot < NQ ? slot : slot < NQ + NKV ? slot - NQ : slot - NQ - NKV) * HD;
      return w + size_t(base + pair + (j & 1) * (HD / 2)) * D;
    } else if (t < SD) {
      return wo + size_t((t - SC) * 8 + j) * (NQ * HD);
    } else if (t < SE) {
      return ((j & 1) ? wu : wg) + size_t((t - SD) * 8 + j / 2) * D;
    }
    return wd + size_t((t - SE) * 4 + j / 2) * F + (j & 1) * (F / 2);
  };
  if (threadIdx.x == 0) {
    s_ticket = atomicAdd(ctl_w + 0, 1);
  }
  __syncthreads();
  int t = s_ticket;
  while (t < TOTAL) {
    __syncthreads();
    // The next ticket, asked for now and waited for only at the task's end.
    int claimed = 0;
    if (threadIdx.x == 0) {
      claimed = atomicAdd(ctl_w + 0, 1);
    }
    const int phase = t < SB ? 0 : t < SC ? 1 : t < SD ? 2 : t < SE ? 3 : 4;
    if (PROF && threadIdx.x == 0) prof[3 * t] = lmx_now();
    // Waits for every task of the phase before (their results read here on).
    auto wait = [&]() {
      if (phase > 0) {
        const int need = phase == 1 ? TA : phase == 2 ? TB : phase == 3 ? TC : TD;
        if (threadIdx.x == 0) {
          while (lmx_ld_acquire(ctl + (2 + phase - 1) * 32) < need) {
            __nanosleep(32);
          }
        }
      }
      __syncthreads();
      if (PROF && threadIdx.x == 0) prof[3 * t + 1] = lmx_now();
    };
    const T* r0 = phase == 3 ? row_of(t, 2 * warp) : row_of(t, warp);
    const T* r1 = phase == 3 ? row_of(t, 2 * warp + 1) : nullptr;
    const int row0 = phase == 3 ? (t - SD) * 8 + warp : phase == 2 ? (t - SC) * 8 + warp : (t - SE) * 4 + warp / 2;

    if (phase == 0) {
      lmx_task_rows<lmx_dense<T>, D / 2> w;
      w.load(r0, r0 + D / 2, lane, true);
      wait();
      if (have != 0) {
        lmx_rms_into<T, D, false>(x, n1, xs, eps, red);
        have = 0;
      }
      float a0, a1;
      w.dot(xs, xs + D / 2, lane, a0, a1);
      if (lane == 0) {
        s_y[warp] = lmx_round<T>(a0 + a1);
      }
      __syncthreads();
      if (lane == 0 && (warp & 1) == 0) {
        const int slot = t / (HD / 8);
        const int pair = (t % (HD / 8)) * 4 + warp / 2;
        float y0 = s_y[warp], y1 = s_y[warp + 1];
        if (slot < NQ + NKV) {
          float sn, cs;
          sincosf(float(pos) * inv_freq[pair], &sn, &cs);
          const float z0 = y0 * cs - y1 * sn;
          const float z1 = y0 * sn + y1 * cs;
          y0 = z0;
          y1 = z1;
        }
        if (slot < NQ) {
          qbuf[slot * HD + pair] = static_cast<T>(y0);
          qbuf[slot * HD + pair + HD / 2] = static_cast<T>(y1);
        } else {
          T* cache = slot < NQ + NKV ? kc_w : vc_w;
          const int g = slot < NQ + NKV ? slot - NQ : slot - NQ - NKV;
          T* at = cache + (size_t(g) * MAXLEN + pos) * HD;
          at[pair] = static_cast<T>(y0);
          at[pair + HD / 2] = static_cast<T>(y1);
        }
      }
    } else if (phase == 1) {
      wait();
      const int h = (t - SB) / CH;
      const int chunk = (t - SB) % CH;
      const int g = h / GROUP;
      const int size = (len + CH - 1) / CH;
      const int lo = chunk * size;
      const int hi = min(len, lo + size);
      const float scale = rsqrtf(float(HD));
      float q[E], acc[E];
#pragma unroll
      for (int e = 0; e < E; ++e) {
        q[e] = static_cast<float>(__ldcg(qbuf + h * HD + lane * E + e)) * scale;
        acc[e] = 0.0f;
      }
      float m = NEG_INF, l = 0.0f;
      for (int p = lo + warp; p < hi; p += WARPS) {
        const T* kr = kc + (size_t(g) * MAXLEN + p) * HD + lane * E;
        const T* vr = vc + (size_t(g) * MAXLEN + p) * HD + lane * E;
        float kv[E], vv[E];
#pragma unroll
        for (int e = 0; e < E; ++e) {
          kv[e] = static_cast<float>(__ldcg(kr + e));
          vv[e] = static_cast<float>(__ldcg(vr + e));
        }
        float s = 0.0f;
#pragma unroll
        for (int e = 0; e < E; ++e) {
          s += q[e] * kv[e];
        }
        s = lmx_task_warp_sum(s);
        const float mn = fmaxf(m, s);
        const float corr = __expf(m - mn);
        const float pe = __expf(s - mn);
        l = l * corr + pe;
#pragma unroll
        for (int e = 0; e < E; ++e) {
          acc[e] = acc[e] * corr + pe * vv[e];
        }
        m = mn;
      }
      if (lane == 0) {
        s_m[warp] = m;
        s_l[warp] = l;
      }
#pragma unroll
      for (int e = 0; e < E; ++e) {
        s_acc[warp][lane * E + e] = acc[e];
      }
      __syncthreads();
      if (threadIdx.x < HD) {
        float mm = NEG_INF;
        for (int w = 0; w < WARPS; ++w) mm = fmaxf(mm, s_m[w]);
        float ll = 0.0f, aa = 0.0f;
        if (mm != NEG_INF) {
          for (int w = 0; w < WARPS; ++w) {
            if (s_m[w] != NEG_INF) {
              const float f = __expf(s_m[w] - mm);
              ll += f * s_l[w];
              aa += f * s_acc[w][threadIdx.x];
            }
          }
        }
        part[size_t(h * CH + chunk) * HD + threadIdx.x] = aa;
        if (threadIdx.x == 0) {
          reinterpret_cast<float2*>(part + NQ * CH * HD)[h * CH + chunk] = make_float2(mm, ll);
        }
      }
    } else if (phase == 2) {
      lmx_task_rows<lmx_dense<T>, NQ * HD / 2> w;
      w.load(r0, r0 + NQ * HD / 2, lane, true);
      wait();
      if (have != 2) {
        // Each head's chunks joined: a weight per chunk, then the weighted sum of their values.
        const float* ml = part + NQ * CH * HD;
        for (int i = threadIdx.x; i < NQ * CH; i += blockDim.x) {
          const float2 v = __ldcg(reinterpret_cast<const float2*>(ml) + i);
          s_cm[i] = v.x;
          s_cl[i] = v.y;
        }
        __syncthreads();
        for (int i = threadIdx.x; i < NQ * CH; i += blockDim.x) {
          const int h = i / CH;
          float mm = NEG_INF;
#pragma unroll
          for (int c = 0; c < CH; ++c) mm = fmaxf(mm, s_cm[h * CH + c]);
          float ll = 0.0f;
#pragma unroll
          for (int c = 0; c < CH; ++c) {
            const float mc = s_cm[h * CH + c];
            ll += mc == NEG_INF ? 0.0f : __expf(mc - mm) * s_cl[h * CH + c];
          }
          const float mi = s_cm[i];
          s_f[i] = mi == NEG_INF ? 0.0f : __expf(mi - mm) / ll;
        }
        __syncthreads();
        for (int g = threadIdx.x; g < NQ * HD / 4; g += blockDim.x) {
          const int h = (g * 4) / HD, d = (g * 4) % HD;
          float4 v[CH];
#pragma unroll
          for (int c = 0; c < CH; ++c) {
            v[c] = __ldcg(reinterpret_cast<const float4*>(part + size_t(h * CH + c) * HD + d));
          }
          float o0 = 0.0f, o1 = 0.0f, o2 = 0.0f, o3 = 0.0f;
#pragma unroll
          for (int c = 0; c < CH; ++c) {
            const float f = s_f[h * CH + c];
            o0 += f * v[c].x; o1 += f * v[c].y; o2 += f * v[c].z; o3 += f * v[c].w;
          }
          xs[g * 4] = static_cast<T>(o0);
          xs[g * 4 + 1] = static_cast<T>(o1);
          xs[g * 4 + 2] = static_cast<T>(o2);
          xs[g * 4 + 3] = static_cast<T>(o3);
        }
        __syncthreads();
        have = 2;
      }
      float a0, a1;
      w.dot(xs, xs + NQ * HD / 2, lane, a0, a1);
      if (lane == 0) {
        hbuf[row0] = static_cast<T>(static_cast<float>(x[row0]) + lmx_round<T>(a0 + a1));
      }
    } else if (phase == 3) {
      lmx_task_rows<lmx_dense<T>, D> w;
      w.load(r0, r1, lane, true);
      wait();
      if (have != 3) {
        lmx_rms_into<T, D, true>(hbuf, n2, xs, eps, red);
        have = 3;
      }
      float a0, a1;
      w.dot(xs, xs, lane, a0, a1);
      if (lane == 0) {
        const float g = lmx_round<T>(a0);
        const float u = lmx_round<T>(a1);
        const float sg = lmx_round<T>(g / (1.0f + __expf(-g)));
        act[row0] = static_cast<T>(sg * u);
      }
    } else {
      lmx_task_rows<lmx_dense<T>, F / 4> w;
      w.load(r0, r0 + F / 4, lane, true);
      wait();
      if (have != 4) {
        constexpr int PER = (F / V + WARPS * 32 - 1) / (WARPS * 32);
        uint4 a[PER];
#pragma unroll
        for (int k = 0; k < PER; ++k) {
          const int i = k * WARPS * 32 + threadIdx.x;
          if (i < F / V) a[k] = __ldcg(reinterpret_cast<const uint4*>(act) + i);
        }
#pragma unroll
        for (int k = 0; k < PER; ++k) {
          const int i = k * WARPS * 32 + threadIdx.x;
          if (i < F / V) reinterpret_cast<uint4*>(xs)[i] = a[k];
        }
        __syncthreads();
        have = 4;
      }
      float a0, a1;
      const int half = (warp & 1) * (F / 2);
      w.dot(xs + half, xs + half + F / 4, lane, a0, a1);
      if (lane == 0) {
        s_y[warp] = a0 + a1;
      }
      __syncthreads();
      if (lane == 0 && (warp & 1) == 0) {
        out[row0] = static_cast<T>(static_cast<float>(__ldcg(hbuf + row0)) + lmx_round<T>(s_y[warp] + s_y[warp + 1]));
      }
    }
    // The threads that wrote this task's results make them visible before it counts as done.
    if (lane == 0 || threadIdx.x < HD) {
      __threadfence();
    }
    if (threadIdx.x == 0) {
      s_ticket = claimed;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      atomicAdd(ctl_w + (2 + phase) * 32, 1);
      if (PROF) prof[3 * t + 2] = lmx_now();
    }
    t = s_ticket;
  }
  if (threadIdx.x == 0) {
    const int exited = atomicAdd(ctl_w + 32, 1);
    if (exited == int(gridDim.x) - 1) {
      // Every block has left: none touches the control block again in this launch.
      ctl_w[0] = 0;
      for (int i = 2; i < 8; ++i) ctl_w[i * 32] = 0;
      ctl_w[8 * 32] = pos + 1;
      ctl_w[32] = 0;
      __threadfence();
    }
  }
