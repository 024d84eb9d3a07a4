// Paged prefill attention on tensor cores (FlashAttention-2's scheme over a block table).
//
// Rows. The queries of one KV head's GQA group are packed into the product's M dimension: packed
// row R of a sequence is (new token R / group, query head kvh * group + R % group), so every K/V
// tile a thread block loads serves all heads of the group, and a sequence with few new tokens (a
// decode-like p = 1) still fills rows. A thread block of kWarps warps takes BM consecutive packed
// rows of one (sequence, KV head); each warp owns MT tiles of 16 rows.
//
// Keys. The block streams the keys its rows see, BN at a time, through a ring of STAGES
// shared-memory stages filled with cp.async: each 16-byte chunk (8 elements) of a key or value
// row is gathered through the block table (any block size from 8), so the K/V of the cached
// prefix and of the new tokens are read in place; each thread reads its rows' block ids one tile
// ahead. Rows are stored with their chunks XOR-swizzled by the row (chunk c of row r at
// c ^ (r % 8), rows a multiple of 128 bytes), which makes both the copies and the ldmatrix reads
// of 8 rows conflict-free; a lane's fragment addresses are one XOR and one add from a few lane
// constants, derived per tile (held across the loop they cost spills). Head sizes that are no multiple of 16
// (120) read zero-filled padding chunks. fp8 caches are copied raw (8-byte chunks) into the ring
// and converted to float16 once per tile into a separate buffer; k_scale is folded into the
// softmax scale and v_scale into the output.
//
// Per tile, for each warp's 16-row tiles: S = Q K^T (ldmatrix of Q and K, mma.sync.m16n8k16,
// float accumulators), the causal mask on the tiles that cross a row's position only, the online
// softmax in the log2 domain (ex2; the output rescaled only where a row's max moved), and O += P V with P taken from S's accumulators as the A
// fragment (probabilities never leave registers) and V read with ldmatrix.trans. Tiles past the
// block's last position are never loaded; keys past a row's position get -inf. Chunks past the
// context or of an invalid block id are zero-filled without reading memory, so unused cache slots
// (whatever they hold, NaN included) never reach the arithmetic.
#pragma once

#include <type_traits>

#include "fast_decode.cuh"
#include "paged_prefill.h"

namespace blocksim {
namespace prefill {

using fast::cp_async16;
using fast::cp_async_commit;
using fast::cp_async_wait;
using fast::kLog2e;
using fast::kMask;
using fast::Mma;

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;

// Tile configurations (PagedPrefillParams::config): MT 16-row tiles per warp (rows per block
// BM = 64 MT), BN keys per tile, STAGES ring stages. Every head size has config 0 (the large
// blocks) and 1 (the small blocks, for few or badly filled row blocks; the same as 0 above head
// 128); configs 2-5 exist for float16 at head 128, for measurements.
struct Config {
  int mt, bn, stages;
};
constexpr Config kConfigs[] = {{0, 0, 0}, {0, 0, 0}, {2, 32, 2}, {2, 32, 3}, {1, 32, 3}, {2, 64, 2}};
constexpr int kNumConfigs = sizeof(kConfigs) / sizeof(kConfigs[0]);
template <int HEAD, int CONFIG>
constexpr Config kHeadConfig = HEAD > 128 ? Config{1, 32, 2} : CONFIG == 0 ? Config{2, 32, 4} : Config{1, 64, 2};

template <int HEAD, int CONFIG>
struct Shape {
  static constexpr Config C = CONFIG <= 1 ? kHeadConfig<HEAD, CONFIG> : kConfigs[CONFIG];
  static constexpr int MT = C.mt;
  static constexpr int BN = C.bn;
  static constexpr int STAGES = C.stages;
  static constexpr int BM = kWarps * 16 * MT;
  static constexpr int DP = (HEAD + 15) / 16 * 16;   // head dims the products run over
  static constexpr int NCH = HEAD / 8;               // real 8-element chunks of a row
  static constexpr int NCP = DP / 8;                 // chunks the products read (padding zero)
  static constexpr int SCH = (NCP + 7) / 8 * 8;      // chunks per shared-memory row (swizzle span)
};

template <typename KV, int HEAD, int CONFIG>
struct Smem {
  using S = Shape<HEAD, CONFIG>;
  static constexpr bool kFp8 = sizeof(KV) == 1;
  static constexpr int Q_BYTES = S::BM * S::SCH * 16;
  static constexpr int TILE16 = S::BN * S::SCH * 16;                 // one 16-bit K or V tile
  static constexpr int RAW = kFp8 ? S::BN * S::NCP * 8 : TILE16;     // one K or V tile as loaded
  static constexpr int STAGE = 2 * RAW;
  static constexpr int BYTES = Q_BYTES + S::STAGES * STAGE + (kFp8 ? 2 * TILE16 : 0);
};

extern __shared__ __align__(128) unsigned char prefill_smem[];

// Byte offset of chunk c of row r in a swizzled 16-bit tile.
template <int SCH>
__device__ __forceinline__ uint32_t swz(int r, int c) {
  return static_cast<uint32_t>((r * SCH + (c ^ (r & 7))) * 16);
}

__device__ __forceinline__ void ldsm_x4(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}
// 8-byte asynchronous copy (fp8 chunks); a dead chunk is zero-filled without reading memory.
__device__ __forceinline__ void cp_async8(uint32_t dst, const void* src, bool live) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(dst), "l"(src), "r"(live ? 8 : 0) : "memory");
}
__device__ __forceinline__ uint32_t fp8x2_to_half2(uint32_t two) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two), __NV_E4M3);
  return static_cast<uint32_t>(h.x) | (static_cast<uint32_t>(h.y) << 16);
}

// 2^x, flushing denormals (the probabilities' precision ends far above them)
__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

template <int HEAD, int CONFIG>
constexpr int kMinBlocks = HEAD > 128 ? 1 : Shape<HEAD, CONFIG>::MT == 1 && Shape<HEAD, CONFIG>::BN == 32 ? 3 : 2;

template <typename T, typename KV, int HEAD, int CONFIG>
__global__ void __launch_bounds__(kThreads, (kMinBlocks<HEAD, CONFIG>)) paged_prefill_kernel(const PagedPrefillParams p) {
  using S = Shape<HEAD, CONFIG>;
  using M = Smem<KV, HEAD, CONFIG>;
  constexpr int MT = S::MT, BN = S::BN, BM = S::BM, STAGES = S::STAGES;
  constexpr int NCH = S::NCH, NCP = S::NCP, SCH = S::SCH;
  constexpr int KSTEPS = S::DP / 16;
  constexpr int NT = BN / 8;      // 8-key column tiles of S
  constexpr int DT = S::DP / 8;   // 8-dim column tiles of O
  static_assert(NT % 2 == 0 && DT % 2 == 0 && BN % 16 == 0, "ldmatrix.x4 pairs");

  const int seq = blockIdx.z;
  const int kvh = blockIdx.y;
  const int group = p.num_heads / p.num_kv_heads;
  const int q_start = p.query_start_loc[seq];
  const int new_tokens = p.query_start_loc[seq + 1] - q_start;
  const int rows = new_tokens * group;                           // packed rows of this (sequence, KV head)
  const int m0 = (gridDim.x - 1 - blockIdx.x) * BM;              // the longest blocks start first
  if (m0 >= rows) return;
  const int ctx = p.context_lens[seq];
  const int cached = ctx - new_tokens;
  const int last_tok = (min(m0 + BM, rows) - 1) / group;           // the block's last new token
  const int first_pos = cached + m0 / group;                     // position of the block's first row
  const int kv_end = cached + last_tok + 1;                      // keys any row of the block sees
  const int n_tiles = (kv_end + BN - 1) / BN;

  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int g = lane >> 2;
  const int t = lane & 3;
  const uint32_t smem = static_cast<uint32_t>(__cvta_generic_to_shared(prefill_smem));
  const uint32_t q_smem = smem;
  const uint32_t ring = smem + M::Q_BYTES;
  const uint32_t conv = ring + STAGES * M::STAGE;  // fp8: the converted K and V tiles

  // ---- query rows into shared memory (zero for dead rows and padding) ----
  {
    const T* q = static_cast<const T*>(p.query);
    for (int i = tid; i < BM * NCP; i += kThreads) {
      const int r = i / NCP, c = i % NCP;
      const int R = m0 + r;
      const bool live = R < rows && c < NCH;
      const T* src = q;
      if (live) src = q + (q_start + R / group) * p.q_token_stride + static_cast<int64_t>(kvh * group + R % group) * HEAD + c * 8;
      cp_async16(prefill_smem + swz<SCH>(r, c), src, live);
    }
  }
  const int* table = p.block_tables + static_cast<int64_t>(seq) * p.max_blocks_per_seq;
  const KV* kc = static_cast<const KV*>(p.key_cache) + kvh * p.k_head_stride;
  const KV* vc = static_cast<const KV*>(p.value_cache) + kvh * p.v_head_stride;
  const int bs_mask = (1 << p.block_size_log2) - 1;
  // Each thread copies chunks i = tid + kThreads * k of a tile; the block ids of its rows are read
  // one tile ahead of their copies, so the table's latency hides behind a tile's products.
  constexpr int LOADS = (BN * NCP + kThreads - 1) / kThreads;
  int bid[LOADS];
  auto fetch_ids = [&](int tile) {
#pragma unroll
    for (int k = 0; k < LOADS; ++k) {
      const int i = tid + kThreads * k;
      const int key = tile * BN + i / NCP;
      bid[k] = i < BN * NCP && key < kv_end ? __ldg(table + (key >> p.block_size_log2)) : -1;
    }
  };
  auto load_tile = [&](int tile, int stage) {
    const uint32_t kd = ring + stage * M::STAGE;
    const uint32_t vd = kd + M::RAW;
    int me = tid;
    asm volatile("" : "+r"(me));  // the chunks' offsets derived per tile, not held in registers across the loop
#pragma unroll
    for (int k = 0; k < LOADS; ++k) {
      const int i = me + kThreads * k;
      if (i >= BN * NCP) break;
      const int r = i / NCP, c = i % NCP;
      const int key = tile * BN + r;
      const int b = bid[k];
      const bool live = static_cast<unsigned>(b) < static_cast<unsigned>(p.num_blocks) && c < NCH;
      const int off = key & bs_mask;
      const KV* ks = kc;
      const KV* vs = vc;
      if (live) {
        ks = kc + b * p.k_block_stride + off * p.k_token_stride + c * 8;
        vs = vc + b * p.v_block_stride + off * p.v_token_stride + c * 8;
      }
      if constexpr (M::kFp8) {
        const uint32_t o = static_cast<uint32_t>((r * NCP + c) * 8);
        cp_async8(kd + o, ks, live);
        cp_async8(vd + o, vs, live);
      } else {
        cp_async16(prefill_smem + (kd - smem) + swz<SCH>(r, c), ks, live);
        cp_async16(prefill_smem + (vd - smem) + swz<SCH>(r, c), vs, live);
      }
    }
  };
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < n_tiles) {
      fetch_ids(s);
      load_tile(s, s);
    }
    cp_async_commit();
  }
  fetch_ids(STAGES - 1);

  const int warp_row0 = warp * 16 * MT;
  const bool warp_live = m0 + warp_row0 < rows;
  const bool has_alibi = p.alibi_slopes != nullptr;
  const float scale2 = p.scale * kLog2e;

  float o[MT][DT][4];
  float m_run[MT][2], l_run[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int d = 0; d < DT; ++d) o[mt][d][0] = o[mt][d][1] = o[mt][d][2] = o[mt][d][3] = 0.f;
    m_run[mt][0] = m_run[mt][1] = -INFINITY;
    l_run[mt][0] = l_run[mt][1] = 0.f;
  }

  // ldmatrix lane roles: matrix lane / 8, its row lane % 8. The row's byte offset and the lane's
  // swizzled chunk offset (chunk x ^ row % 8, x = 0 or 1); chunk 2 k + x of the same row is then at
  // chunk offset ^ (k << 5) (bit 0 of 2 k is clear), one LOP3 per address.
  constexpr uint32_t ROW_BYTES = SCH * 16;
  const uint32_t lm = lane >> 3;
  const uint32_t lr = lane & 7;
  const uint32_t q_row0 = q_smem + (warp_row0 + (lm & 1) * 8 + lr) * ROW_BYTES;
  const uint32_t q_x0 = ((lm >> 1) ^ lr) << 4;
  const uint32_t k_row0 = ((lm >> 1) * 8 + lr) * ROW_BYTES;
  const uint32_t k_x0 = ((lm & 1) ^ lr) << 4;
  const uint32_t v_row0 = ((lm & 1) * 8 + lr) * ROW_BYTES;
  const uint32_t v_x0 = ((lm >> 1) ^ lr) << 4;

  for (int n = 0; n < n_tiles; ++n) {
    cp_async_wait<STAGES - 2>();
    __syncthreads();  // tile n landed for every thread; every warp is done with tile n - 1's stage
    if (n + STAGES - 1 < n_tiles) {
      load_tile(n + STAGES - 1, (n + STAGES - 1) % STAGES);
      fetch_ids(n + STAGES);
    }
    cp_async_commit();
    uint32_t kt = ring + (n % STAGES) * M::STAGE;
    uint32_t vt = kt + M::RAW;
    if constexpr (M::kFp8) {
      const unsigned char* raw = prefill_smem + (kt - smem);
      for (int i = tid; i < 2 * BN * NCP; i += kThreads) {
        const int which = i / (BN * NCP), j = i % (BN * NCP);
        const int r = j / NCP, c = j % NCP;
        const uint2 v = *reinterpret_cast<const uint2*>(raw + which * M::RAW + j * 8);
        const uint4 h = make_uint4(fp8x2_to_half2(v.x & 0xffffu), fp8x2_to_half2(v.x >> 16),
                                   fp8x2_to_half2(v.y & 0xffffu), fp8x2_to_half2(v.y >> 16));
        *reinterpret_cast<uint4*>(prefill_smem + (conv - smem) + which * M::TILE16 + swz<SCH>(r, c)) = h;
      }
      __syncthreads();
      kt = conv;
      vt = conv + M::TILE16;
    }
    if (!warp_live) continue;
    // opaque per tile, so that the compiler derives the fragment addresses here (one LOP3 and one
    // add each) instead of keeping every one of them in a register across the loop
    uint32_t q_row = q_row0, q_x = q_x0, k_row = k_row0, k_x = k_x0, v_row = v_row0, v_x = v_x0;
    asm volatile("" : "+r"(q_row), "+r"(q_x), "+r"(k_row), "+r"(k_x), "+r"(v_row), "+r"(v_x));

    // S = Q K^T
    float s[MT][NT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int j = 0; j < NT; ++j) s[mt][j][0] = s[mt][j][1] = s[mt][j][2] = s[mt][j][3] = 0.f;
#pragma unroll
    for (int ks = 0; ks < KSTEPS; ++ks) {
      uint32_t qa[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        ldsm_x4(q_row + mt * 16 * ROW_BYTES + (q_x ^ (ks << 5)), qa[mt][0], qa[mt][1], qa[mt][2], qa[mt][3]);
      }
#pragma unroll
      for (int jp = 0; jp < NT / 2; ++jp) {
        uint32_t b0, b1, b2, b3;
        ldsm_x4(kt + k_row + jp * 16 * ROW_BYTES + (k_x ^ (ks << 5)), b0, b1, b2, b3);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          Mma<T>::run(s[mt][2 * jp], qa[mt][0], qa[mt][1], qa[mt][2], qa[mt][3], b0, b1);
          Mma<T>::run(s[mt][2 * jp + 1], qa[mt][0], qa[mt][1], qa[mt][2], qa[mt][3], b2, b3);
        }
      }
    }

    // online softmax (log2 domain). Plain tiles: the max over the raw scores, then
    // p = 2^(s * scale2 - m) in one FMA; tiles that cross a row's position (the causal mask) or
    // carry ALiBi get their scaled, biased and masked scores first.
    const int key0 = n * BN;
    const bool masked = key0 + BN - 1 > first_pos;
    float sc = scale2;
    if (masked || has_alibi) {
      sc = 1.f;
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          // rows g and g + 8 of the tile: position and ALiBi slope (log2 domain); dead rows take the last row's
          const int R = min(m0 + warp_row0 + mt * 16 + g + 8 * h, rows - 1);
          const int qpos = cached + R / group;
          const float slope2 = has_alibi ? __ldg(p.alibi_slopes + kvh * group + R % group) * kLog2e : 0.f;
#pragma unroll
          for (int j = 0; j < NT; ++j)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const int key = key0 + j * 8 + 2 * t + e;
              float v = s[mt][j][2 * h + e] * scale2;
              if (has_alibi) v += slope2 * static_cast<float>(key - qpos);
              s[mt][j][2 * h + e] = key > qpos ? -INFINITY : v;
            }
        }
    }
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      float alpha[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float mx = -INFINITY;
#pragma unroll
        for (int j = 0; j < NT; ++j) mx = fmaxf(mx, fmaxf(s[mt][j][2 * h], s[mt][j][2 * h + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(kMask, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(kMask, mx, 2));
        const float m_new = fmaxf(m_run[mt][h], mx * sc);
        const float base = m_new == -INFINITY ? 0.f : m_new;
        alpha[h] = ex2(m_run[mt][h] - base);
        m_run[mt][h] = m_new;
        float sum = 0.f;
#pragma unroll
        for (int j = 0; j < NT; ++j) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float pv = ex2(fmaf(s[mt][j][2 * h + e], sc, -base));
            s[mt][j][2 * h + e] = pv;
            sum += pv;
          }
        }
        l_run[mt][h] = l_run[mt][h] * alpha[h] + sum;
      }
      // the output rescale only where a row's max moved (rarely, once the first tiles are in)
      if (__any_sync(kMask, alpha[0] != 1.f || alpha[1] != 1.f)) {
#pragma unroll
        for (int d = 0; d < DT; ++d) {
          o[mt][d][0] *= alpha[0];
          o[mt][d][1] *= alpha[0];
          o[mt][d][2] *= alpha[1];
          o[mt][d][3] *= alpha[1];
        }
      }
    }

    // O += P V
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
      uint32_t pa[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        pa[mt][0] = Mma<T>::pack(s[mt][2 * kk][0], s[mt][2 * kk][1]);
        pa[mt][1] = Mma<T>::pack(s[mt][2 * kk][2], s[mt][2 * kk][3]);
        pa[mt][2] = Mma<T>::pack(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
        pa[mt][3] = Mma<T>::pack(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
      }
#pragma unroll
      for (int dp = 0; dp < DT / 2; ++dp) {
        uint32_t b0, b1, b2, b3;
        ldsm_x4_t(vt + v_row + kk * 16 * ROW_BYTES + (v_x ^ (dp << 5)), b0, b1, b2, b3);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          Mma<T>::run(o[mt][2 * dp], pa[mt][0], pa[mt][1], pa[mt][2], pa[mt][3], b0, b1);
          Mma<T>::run(o[mt][2 * dp + 1], pa[mt][0], pa[mt][1], pa[mt][2], pa[mt][3], b2, b3);
        }
      }
    }
  }
  cp_async_wait<0>();  // no copy may still target shared memory when the block exits

  if (!warp_live) return;
  T* out = static_cast<T*>(p.out);
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float l = l_run[mt][h];
      l += __shfl_xor_sync(kMask, l, 1);
      l += __shfl_xor_sync(kMask, l, 2);
      const int R = m0 + warp_row0 + mt * 16 + g + 8 * h;
      if (R >= rows) continue;
      const float f = p.v_scale / l;
      T* dst = out + (q_start + R / group) * p.out_token_stride + static_cast<int64_t>(kvh * group + R % group) * HEAD;
#pragma unroll
      for (int d = 0; d < DT; ++d) {
        const int col = d * 8 + 2 * t;
        if (col < HEAD) {
          *reinterpret_cast<uint32_t*>(dst + col) = Mma<T>::pack(o[mt][d][2 * h] * f, o[mt][d][2 * h + 1] * f);
        }
      }
    }
  }
}

template <typename T, typename KV, int HEAD, int CONFIG>
cudaError_t launch_config(const PagedPrefillParams& p, cudaStream_t stream) {
  using S = Shape<HEAD, CONFIG>;
  constexpr int bytes = Smem<KV, HEAD, CONFIG>::BYTES;
  auto* kernel = paged_prefill_kernel<T, KV, HEAD, CONFIG>;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (err != cudaSuccess) return err;
  const int group = p.num_heads / p.num_kv_heads;
  const int64_t m_blocks = (static_cast<int64_t>(p.max_query_len) * group + S::BM - 1) / S::BM;
  if (m_blocks == 0) return cudaSuccess;
  if (m_blocks > 0x7fffffff || p.num_kv_heads > 65535 || p.num_seqs > 65535) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(m_blocks), p.num_kv_heads, p.num_seqs);
  kernel<<<grid, kThreads, bytes, stream>>>(p);
  return cudaGetLastError();
}

template <typename T, typename KV, int HEAD>
cudaError_t launch_head(const PagedPrefillParams& p, cudaStream_t stream) {
  if (p.config == 0 || (p.config == 1 && HEAD > 128)) return launch_config<T, KV, HEAD, 0>(p, stream);
  if constexpr (HEAD <= 128) {
    if (p.config == 1) return launch_config<T, KV, HEAD, 1>(p, stream);
  }
#ifndef BLOCKSIM_FEW_INSTANCES
  if constexpr (HEAD == 128 && std::is_same_v<T, __half> && std::is_same_v<KV, __half>) {
    switch (p.config) {
      case 2: return launch_config<T, KV, HEAD, 2>(p, stream);
      case 3: return launch_config<T, KV, HEAD, 3>(p, stream);
      case 4: return launch_config<T, KV, HEAD, 4>(p, stream);
      case 5: return launch_config<T, KV, HEAD, 5>(p, stream);
      default: break;
    }
  }
#endif
  return cudaErrorInvalidValue;
}

template <typename T, typename KV>
cudaError_t launch_typed(const PagedPrefillParams& p, cudaStream_t stream) {
  switch (p.head_size) {
#ifndef BLOCKSIM_FEW_INSTANCES
    case 64: return launch_head<T, KV, 64>(p, stream);
    case 80: return launch_head<T, KV, 80>(p, stream);
    case 96: return launch_head<T, KV, 96>(p, stream);
    case 112: return launch_head<T, KV, 112>(p, stream);
    case 192: return launch_head<T, KV, 192>(p, stream);
    case 256: return launch_head<T, KV, 256>(p, stream);
#endif
    case 120: return launch_head<T, KV, 120>(p, stream);
    case 128: return launch_head<T, KV, 128>(p, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace prefill

cudaError_t launch_paged_prefill_f16(const PagedPrefillParams& p, cudaStream_t stream);
cudaError_t launch_paged_prefill_bf16(const PagedPrefillParams& p, cudaStream_t stream);
cudaError_t launch_paged_prefill_fp8(const PagedPrefillParams& p, cudaStream_t stream);

}  // namespace blocksim
