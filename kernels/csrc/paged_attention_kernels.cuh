// Paged-attention decode kernels in the vLLM cache layout.
//
// One query token per sequence attends to its cached context, whose keys and values live in
// fixed-size blocks scattered over the caches and found through the sequence's block table.
//
//   key cache   [num_blocks, num_kv_heads, head_size / X, BLOCK, X]   X = 16 / sizeof(T)
//   value cache [num_blocks, num_kv_heads, head_size, BLOCK]
//
// Work split (per thread block of NTHREADS = 4 warps, for one query head of one sequence, and in
// v2 one 512-token partition of its context):
//   * q . k: each warp takes one cache block at a time (warps stride over the blocks). Inside the
//     warp a thread group of TG = 32 / BLOCK lanes owns one token of the block; lane g of the
//     group owns the 16-byte key chunks g, g + TG, g + 2 TG, ... of that token. A chunk is one
//     128-bit load, and for a fixed chunk index the BLOCK tokens of a block are contiguous, so a
//     warp's loads cover whole 256-byte rows. The partial dot products are summed across the
//     group with shuffles. Logits go to shared memory (one float per token).
//   * softmax: block-wide max and sum (shuffles inside warps, a few floats of shared memory
//     between warps); the logits are turned into probabilities in place.
//   * p . v: each warp again takes one block at a time; a lane reads 16 bytes (X consecutive
//     tokens of one head dimension) per load and keeps float accumulators for the head
//     dimensions it owns. Lanes sharing a dimension are summed with shuffles, then the warps'
//     partial outputs are summed through shared memory.
//   * v2 writes each partition's normalised output with its max logit and exp-sum; the reduce
//     kernel rescales the partitions onto the global max and combines them.
//
// All arithmetic is in float: elements are widened on load, the output is rounded once at the
// end. A block id outside [0, num_blocks) is never dereferenced: it poisons the output with NaN
// (the host API rejects such tables before launch; this is the last line of defence).
#pragma once

#include <algorithm>

#include "common.cuh"
#include "paged_attention.h"

namespace blocksim {

template <typename T, int HEAD, int BLOCK, int NTHREADS, int PARTITION>
__global__ void __launch_bounds__(NTHREADS) paged_attention_kernel(const AttentionParams p) {
  using Chunk = Chunk16<T>;
  constexpr int X = Chunk::kElems;
  constexpr int NWARPS = NTHREADS / kWarpSize;
  constexpr int TG = BLOCK < kWarpSize ? kWarpSize / BLOCK : 1;  // lanes per key token
  constexpr int NCHUNK = HEAD / X;                                // 16-byte chunks per head
  constexpr int K_CHUNKS = (NCHUNK + TG - 1) / TG;                // chunks per lane per token
  constexpr int K_BATCH = K_CHUNKS < 8 ? K_CHUNKS : 8;            // loads kept in flight
  constexpr int V_PER_ROW = BLOCK / X;                            // lanes per head dimension
  constexpr int ROWS_PER_ITER = kWarpSize / V_PER_ROW;
  constexpr int ROWS = (HEAD + ROWS_PER_ITER - 1) / ROWS_PER_ITER;  // dimensions per lane
  constexpr int V_BATCH = ROWS < 8 ? ROWS : 8;
  static_assert(HEAD % X == 0, "head size must be a multiple of 16 bytes");
  static_assert(BLOCK <= kWarpSize && kWarpSize % BLOCK == 0, "block size must divide 32");
  static_assert(BLOCK % X == 0, "block size must hold whole 16-byte value chunks");
  static_assert(PARTITION == 0 || PARTITION % BLOCK == 0, "partition must hold whole blocks");

  const int head = blockIdx.x;
  const int seq = blockIdx.y;
  const int part = blockIdx.z;
  const int tid = threadIdx.x;
  const int warp = tid / kWarpSize;
  const int lane = tid % kWarpSize;

  const int ctx = p.context_lens[seq];
  const int ctx_blocks = ctx > 0 ? (ctx + BLOCK - 1) / BLOCK : 0;
  int first_blk = 0;
  int end_blk = ctx_blocks;
  if constexpr (PARTITION > 0) {
    first_blk = part * (PARTITION / BLOCK);
    if (first_blk >= ctx_blocks) return;  // partition past this sequence's context
    end_blk = min(first_blk + PARTITION / BLOCK, ctx_blocks);
  }
  const int first_tok = first_blk * BLOCK;
  const int end_tok = min(end_blk * BLOCK, ctx);
  const int64_t row = static_cast<int64_t>(seq) * p.num_heads + head;

  if (ctx <= 0) {  // v1 only (v2 returned above): an empty context attends to nothing
    for (int d = tid; d < HEAD; d += NTHREADS) static_cast<T*>(p.out)[row * HEAD + d] = narrow<T>(0.f);
    return;
  }

  const int kv_head = head / (p.num_heads / p.num_kv_heads);
  const float slope = p.alibi_slopes != nullptr ? p.alibi_slopes[head] : 0.f;
  const int* table = p.block_tables + static_cast<int64_t>(seq) * p.max_blocks_per_seq;

  __shared__ __align__(16) float q_s[HEAD];
  __shared__ float red_s[2 * NWARPS];
  extern __shared__ __align__(16) float dyn_s[];  // logits, then the warps' partial outputs
  float* logits = dyn_s;

  // Query, widened to float, shared by all thread groups.
  const T* q = static_cast<const T*>(p.query) + seq * p.q_stride + head * HEAD;
  for (int c = tid; c < NCHUNK; c += NTHREADS) {
    float f[X];
    Chunk::widen(load_chunk16(q + c * X), f);
#pragma unroll
    for (int e = 0; e < X; ++e) q_s[c * X + e] = f[e];
  }
  __syncthreads();

  // ---- q . k ----
  const int tok_in_blk = lane / TG;
  const int grp_lane = lane % TG;
  const T* k_head = static_cast<const T*>(p.key_cache) + kv_head * p.k_head_stride;
  float qk_max = -FLT_MAX;
  for (int b = first_blk + warp; b < end_blk; b += NWARPS) {
    const int phys = table[b];
    const bool valid = static_cast<unsigned>(phys) < static_cast<unsigned>(p.num_blocks);
    const int tok = b * BLOCK + tok_in_blk;
    float dot = 0.f;
    if (valid && tok < end_tok) {
      const T* k_tok = k_head + phys * p.k_block_stride + tok_in_blk * X;
#pragma unroll
      for (int j0 = 0; j0 < K_CHUNKS; j0 += K_BATCH) {
        uint4 raw[K_BATCH];
#pragma unroll
        for (int j = 0; j < K_BATCH; ++j) {
          const int c = grp_lane + (j0 + j) * TG;
          if (j0 + j < K_CHUNKS && c < NCHUNK) raw[j] = load_chunk16(k_tok + c * (BLOCK * X));
        }
#pragma unroll
        for (int j = 0; j < K_BATCH; ++j) {
          const int c = grp_lane + (j0 + j) * TG;
          if (j0 + j < K_CHUNKS && c < NCHUNK) {
            float f[X];
            Chunk::widen(raw[j], f);
#pragma unroll
            for (int e = 0; e < X; ++e) dot = fmaf(q_s[c * X + e], f[e], dot);
          }
        }
      }
    }
    if constexpr (TG > 1) dot = warp_sum<TG / 2, 1>(dot);
    if (grp_lane == 0) {
      float qk = 0.f;  // tokens past the context keep a zero probability
      if (tok < end_tok) {
        qk = valid ? dot * p.scale + slope * static_cast<float>(tok - ctx + 1) : __int_as_float(0x7fc00000);
        qk_max = fmaxf(qk_max, qk);
      }
      logits[tok - first_tok] = qk;
    }
  }

  // ---- softmax over this thread block's tokens ----
  qk_max = block_max<NWARPS>(qk_max, red_s);
  const int n_tok = end_tok - first_tok;
  float exp_sum = 0.f;
  for (int i = tid; i < n_tok; i += NTHREADS) {
    const float e = __expf(logits[i] - qk_max);
    logits[i] = e;
    exp_sum += e;
  }
  exp_sum = block_sum<NWARPS>(exp_sum, red_s + NWARPS);  // >= 1: the max token contributes 1
  const float inv_sum = __fdividef(1.f, exp_sum);
  for (int i = tid; i < n_tok; i += NTHREADS) logits[i] *= inv_sum;
  if constexpr (PARTITION > 0) {
    if (tid == 0) {
      const int64_t idx = row * p.max_partitions + part;
      p.max_logits[idx] = qk_max;
      p.exp_sums[idx] = exp_sum;
    }
  }
  __syncthreads();

  // ---- p . v ----
  const int col = (lane % V_PER_ROW) * X;  // first of this lane's X tokens in the block
  const int row0 = lane / V_PER_ROW;       // first head dimension of this lane
  const T* v_head = static_cast<const T*>(p.value_cache) + kv_head * p.v_head_stride;
  float acc[ROWS];
#pragma unroll
  for (int i = 0; i < ROWS; ++i) acc[i] = 0.f;
  for (int b = first_blk + warp; b < end_blk; b += NWARPS) {
    const int phys = table[b];
    if (static_cast<unsigned>(phys) >= static_cast<unsigned>(p.num_blocks)) continue;  // NaN logits already
    const int tok0 = b * BLOCK + col;
    float w[X];
#pragma unroll
    for (int e = 0; e < X; ++e) w[e] = logits[tok0 - first_tok + e];
    const bool tail = tok0 + X > ctx;  // some of these tokens lie past the context: their values may be garbage
    const T* v_blk = v_head + phys * p.v_block_stride + col;
#pragma unroll
    for (int i0 = 0; i0 < ROWS; i0 += V_BATCH) {
      uint4 raw[V_BATCH];
#pragma unroll
      for (int i = 0; i < V_BATCH; ++i) {
        const int d = row0 + (i0 + i) * ROWS_PER_ITER;
        if (i0 + i < ROWS && d < HEAD) raw[i] = load_chunk16(v_blk + d * BLOCK);
      }
#pragma unroll
      for (int i = 0; i < V_BATCH; ++i) {
        const int d = row0 + (i0 + i) * ROWS_PER_ITER;
        if (i0 + i < ROWS && d < HEAD) {
          float f[X];
          Chunk::widen(raw[i], f);
          if (tail) {
#pragma unroll
            for (int e = 0; e < X; ++e) f[e] = tok0 + e < ctx ? f[e] : 0.f;
          }
          float s = acc[i0 + i];
#pragma unroll
          for (int e = 0; e < X; ++e) s = fmaf(w[e], f[e], s);
          acc[i0 + i] = s;
        }
      }
    }
  }
  if constexpr (V_PER_ROW > 1) {
#pragma unroll
    for (int i = 0; i < ROWS; ++i) acc[i] = warp_sum<V_PER_ROW / 2, 1>(acc[i]);
  }

  __syncthreads();  // logits are dead: reuse the buffer for the warps' partial outputs
  float* partial = dyn_s;
  if (lane % V_PER_ROW == 0) {
#pragma unroll
    for (int i = 0; i < ROWS; ++i) {
      const int d = row0 + i * ROWS_PER_ITER;
      if (d < HEAD) partial[warp * HEAD + d] = acc[i];
    }
  }
  __syncthreads();
  for (int d = tid; d < HEAD; d += NTHREADS) {
    float s = 0.f;
#pragma unroll
    for (int w2 = 0; w2 < NWARPS; ++w2) s += partial[w2 * HEAD + d];
    if constexpr (PARTITION > 0) {
      p.tmp_out[(row * p.max_partitions + part) * HEAD + d] = s;
    } else {
      static_cast<T*>(p.out)[row * HEAD + d] = narrow<T>(s);
    }
  }
}

// Combines the partitions of v2: out = sum_p o_p * s_p exp(m_p - M) / sum_p s_p exp(m_p - M).
template <typename T, int NTHREADS>
__global__ void __launch_bounds__(NTHREADS) paged_attention_reduce_kernel(const AttentionParams p) {
  constexpr int NWARPS = NTHREADS / kWarpSize;
  const int head = blockIdx.x;
  const int seq = blockIdx.y;
  const int tid = threadIdx.x;
  const int hs = p.head_size;
  const int64_t row = static_cast<int64_t>(seq) * p.num_heads + head;
  T* out = static_cast<T*>(p.out) + row * hs;
  const int ctx = p.context_lens[seq];
  if (ctx <= 0) {
    for (int d = tid; d < hs; d += NTHREADS) out[d] = narrow<T>(0.f);
    return;
  }
  const int n_parts = (ctx + kPartitionSize - 1) / kPartitionSize;
  const float* parts_out = p.tmp_out + row * p.max_partitions * hs;
  if (n_parts == 1) {
    for (int d = tid; d < hs; d += NTHREADS) out[d] = narrow<T>(parts_out[d]);
    return;
  }
  extern __shared__ float weight_s[];  // [n_parts]
  __shared__ float red_s[2 * NWARPS];
  const float* m = p.max_logits + row * p.max_partitions;
  const float* s = p.exp_sums + row * p.max_partitions;
  float gmax = -FLT_MAX;
  for (int i = tid; i < n_parts; i += NTHREADS) gmax = fmaxf(gmax, m[i]);
  gmax = block_max<NWARPS>(gmax, red_s);
  float total = 0.f;
  for (int i = tid; i < n_parts; i += NTHREADS) {
    const float wgt = s[i] * __expf(m[i] - gmax);
    weight_s[i] = wgt;
    total += wgt;
  }
  total = block_sum<NWARPS>(total, red_s + NWARPS);  // its barrier also publishes weight_s
  const float inv_total = __fdividef(1.f, total);
  for (int d = tid; d < hs; d += NTHREADS) {
    float acc = 0.f;
    for (int i = 0; i < n_parts; ++i) acc = fmaf(parts_out[static_cast<int64_t>(i) * hs + d], weight_s[i], acc);
    out[d] = narrow<T>(acc * inv_total);
  }
}

template <typename T, int HEAD, int BLOCK>
cudaError_t launch_shape(const AttentionParams& p, int version, cudaStream_t stream) {
  constexpr int NT = kAttentionThreads;
  if (version == 1) {
    auto kernel = paged_attention_kernel<T, HEAD, BLOCK, NT, 0>;
    const size_t smem = paged_attention_v1_smem_bytes(HEAD, BLOCK, p.max_context_len);
    if (smem > 48 * 1024) {  // past the default dynamic limit: raise it (per device, so every time)
      const cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                   static_cast<int>(smem));
      if (err != cudaSuccess) return err;
    }
    kernel<<<dim3(p.num_heads, p.num_seqs, 1), NT, smem, stream>>>(p);
    return cudaGetLastError();
  }
  const size_t smem = static_cast<size_t>(std::max(kPartitionSize, (NT / kWarpSize) * HEAD)) * sizeof(float);
  paged_attention_kernel<T, HEAD, BLOCK, NT, kPartitionSize>
      <<<dim3(p.num_heads, p.num_seqs, p.max_partitions), NT, smem, stream>>>(p);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  paged_attention_reduce_kernel<T, NT>
      <<<dim3(p.num_heads, p.num_seqs), NT, static_cast<size_t>(p.max_partitions) * sizeof(float), stream>>>(p);
  return cudaGetLastError();
}

template <typename T, int HEAD>
cudaError_t launch_head(const AttentionParams& p, int version, cudaStream_t stream) {
  switch (p.block_size) {
    case 8: return launch_shape<T, HEAD, 8>(p, version, stream);
    case 16: return launch_shape<T, HEAD, 16>(p, version, stream);
    case 32: return launch_shape<T, HEAD, 32>(p, version, stream);
    default: return cudaErrorInvalidValue;
  }
}

// BLOCKSIM_FEW_INSTANCES keeps one head size per code path (a quick compile-only check of the
// templates, used by the CPU tests); real builds instantiate every supported shape.
template <typename T>
cudaError_t launch_paged_attention(const AttentionParams& p, int version, cudaStream_t stream) {
  if (version != 1 && version != 2) return cudaErrorInvalidValue;
  switch (p.head_size) {
#ifndef BLOCKSIM_FEW_INSTANCES
    case 32: return launch_head<T, 32>(p, version, stream);
    case 64: return launch_head<T, 64>(p, version, stream);
    case 80: return launch_head<T, 80>(p, version, stream);
    case 96: return launch_head<T, 96>(p, version, stream);
    case 112: return launch_head<T, 112>(p, version, stream);
    case 192: return launch_head<T, 192>(p, version, stream);
    case 256: return launch_head<T, 256>(p, version, stream);
#endif
    case 120: return launch_head<T, 120>(p, version, stream);
    case 128: return launch_head<T, 128>(p, version, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace blocksim
