// Fast paged decode attention: tensor cores, one read of each KV head per GQA group, the
// context split across thread blocks when the batch alone does not fill the GPU.
//
// Work split. A thread block of kFastWarps warps takes one (sequence, KV head, group of up to 8
// query heads, split of split_tokens context tokens). Its warps take 16-token tiles of the split
// in turn; each warp keeps its own running max, sum and output (flash-decoding), and the warps
// are combined through shared memory at the end. With one split the block writes the output;
// with several, each writes its normalised partial output with its max and sum, and a reduce
// kernel combines the splits. With warp items (the 2-stage ring) each warp instead takes a whole
// item, every tile of it, and writes its output itself; a block then serves kFastWarps
// consecutive KV heads of one sequence, whose parts of each cache block its warps read at about
// the same time (read by different thread blocks, which drift apart, they were 0.6-0.9% slower;
// kernels/DESIGN.md).
//
// Per tile, two mma.sync.m16n8k16 products with float accumulators:
//   S  = Q K^T    M = query heads (8 used of 16), N = 8 tokens (two N-tiles), K = head dims
//   O^T += V^T P^T  M = head dims (16 per tile), N = 8 query heads, K = 16 tokens
// The head dimensions are a reduction index of the first product, so they may be permuted at
// will: lane (g, t) (g = lane / 4, t = lane % 4) reads 16-byte chunks t, t + 4, ... of its token
// g's key, and the query's A fragment uses the same permutation. S's accumulator (rows = heads,
// columns = tokens 2t, 2t + 1) is exactly the B fragment of the second product after the
// softmax, so probabilities never leave registers. For V^T as the A operand each register holds
// one head dimension of two tokens: lane (g, t) reads chunks g, g + 8 (+ 16 ...) of tokens 2t,
// 2t + 1, 2t + 8, 2t + 9 and pairs their halves with one byte permute per register. The
// product's rows (head dims) come out permuted so that each lane ends with whole 16-byte chunks
// of its two heads' output.
//
// Loads. With stages == 0 each lane loads its chunks straight into registers (one tile in flight
// per warp, or two with prefetch). With stages >= 2 (16-bit caches, heads <= 128) each warp
// streams its tiles through its own ring of shared-memory stages with cp.async: the loads of the
// next stages - 1 tiles are in flight while a tile is computed, at no register cost. The warp
// copies whole rows and each lane reads back the chunks its fragments need (see the ring's
// layout below), so a __syncwarp orders the lanes' copies and reads of a stage.
//
// Masking: tokens past the context (or past the split) get a -inf logit and are never loaded; a
// block id outside [0, num_blocks) is never dereferenced and gives NaN logits, so the sequence's
// output becomes NaN (the host API rejects such tables before launch).
#pragma once

#include <cfloat>
#include <cstdint>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include "fast_decode.h"

namespace blocksim {
namespace fast {

constexpr unsigned kMask = 0xffffffffu;
constexpr float kLog2e = 1.4426950408889634f;

// Tensor-core product and float packing for the 16-bit type the products run in.
template <typename T>
struct Mma;

template <>
struct Mma<__half> {
  __device__ __forceinline__ static void run(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                             uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
  __device__ __forceinline__ static uint32_t pack(float lo, float hi) {
    const __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&h);
  }
  __device__ __forceinline__ static void store(__half* dst, float v) { *dst = __float2half_rn(v); }
};

template <>
struct Mma<__nv_bfloat16> {
  __device__ __forceinline__ static void run(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                             uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
  __device__ __forceinline__ static uint32_t pack(float lo, float hi) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&h);
  }
  __device__ __forceinline__ static void store(__nv_bfloat16* dst, float v) { *dst = __float2bfloat16_rn(v); }
};

// Eight consecutive cache elements as eight 16-bit values of the product type T (one uint4).
template <typename T, typename KV>
struct Load8;

template <typename T>
struct Load8<T, T> {  // 16-bit cache: one 16-byte load
  using Raw = uint4;
  __device__ __forceinline__ static Raw load(const T* ptr) { return __ldg(reinterpret_cast<const uint4*>(ptr)); }
  __device__ __forceinline__ static uint4 widen(const Raw& r) { return r; }
};

template <>
struct Load8<__half, __nv_fp8_e4m3> {  // fp8 cache: one 8-byte load, converted to float16 exactly
  using Raw = uint2;
  __device__ __forceinline__ static Raw load(const __nv_fp8_e4m3* ptr) {
    return __ldg(reinterpret_cast<const uint2*>(ptr));
  }
  __device__ __forceinline__ static uint32_t cvt2(uint32_t two) {
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two), __NV_E4M3);
    return static_cast<uint32_t>(h.x) | (static_cast<uint32_t>(h.y) << 16);
  }
  __device__ __forceinline__ static uint4 widen(const Raw& r) {
    return make_uint4(cvt2(r.x & 0xffffu), cvt2(r.x >> 16), cvt2(r.y & 0xffffu), cvt2(r.y >> 16));
  }
};

// Asynchronous 16-byte copy into shared memory, with a 128-byte L2 prefetch hint (faster than none
// or 256 bytes); a dead chunk (live == false) is zero-filled without
// reading global memory.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool live) {
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(live ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

// Shared memory of the cp.async variant (16-bit caches, heads <= 128): per warp and stage one tile's key and
// value rows plus each lane's copy of the tile's two block ids; at least the warps' combine buffer,
// which reuses it.
template <typename KV, int HEAD>
struct Ring {
  static constexpr int STAGE_BYTES = 2 * kFastTile * HEAD * 2 + 32 * 8;
  static constexpr int COMBINE_BYTES = kFastWarps * kFastHeadsPerCta * HEAD * 4;
  static constexpr size_t bytes(int stages) {
    if (sizeof(KV) != 2 || HEAD > 128) return ~size_t{0};  // fp8 caches, heads > 128: register loads
    const size_t ring = static_cast<size_t>(kFastWarps) * stages * STAGE_BYTES;
    return ring > COMBINE_BYTES ? ring : COMBINE_BYTES;
  }
};
constexpr size_t kMaxSmem = 227 * 1024;  // an sm_90 thread block's dynamic shared-memory limit
// 128-byte aligned whatever the static shared memory before it: the ring's swizzle is conflict-free only
// relative to 128-byte lines (an 80-byte offset makes every shape about 19% slower).
extern __shared__ __align__(128) unsigned char fast_smem[];

__device__ __forceinline__ uint32_t word(const uint4& v, int w) {
  return w == 0 ? v.x : w == 1 ? v.y : w == 2 ? v.z : v.w;
}

// Heads <= 128 without prefetch are capped at 168 registers: 3 resident thread blocks per SM.
template <int HEAD, bool PREFETCH>
constexpr int kFastMinBlocks = HEAD <= 128 && !PREFETCH ? 3 : 1;

// WARP_ITEMS: each warp takes its own (sequence, KV head, head group, split) and every tile of it,
// instead of the block's warps sharing one item's tiles; a block then serves kFastWarps consecutive
// KV heads (or head groups) of one sequence (FastDecodeParams::warp_items).
template <typename T, typename KV, int HEAD, bool PREFETCH, int STAGES, bool WARP_ITEMS = false>
__global__ void __launch_bounds__(kFastWarps * 32, kFastMinBlocks<HEAD, PREFETCH>)
    fast_decode_kernel(const FastDecodeParams p) {
  static_assert(STAGES == 0 || (STAGES >= 2 && !PREFETCH), "cp.async ring: 2 or more stages, no prefetch");
  using L = Load8<T, KV>;
  using Raw = typename L::Raw;
  constexpr int NCHUNK = HEAD / 8;            // 8-element chunks per head row
  constexpr int KJ = (NCHUNK + 3) / 4;        // key chunks per lane per token: t, t + 4, ...
  constexpr int KSTEPS = 2 * KJ;              // k-steps of 16 head dims in S = Q K^T
  constexpr int NCP = (NCHUNK + 15) / 16;     // value chunk pairs per lane per token
  constexpr int MT = 8 * NCP;                 // 16-row tiles of head dims in O^T
  static_assert(HEAD % 8 == 0, "head size must be a multiple of 8");

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // With splits, the reduce kernel may be scheduled once every thread block of this grid has
  // started; it waits (griddepcontrol.wait) for this grid to finish before reading the partials.
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
  const int split = blockIdx.x;
  const int group = p.num_heads / p.num_kv_heads;
  const int head_groups = (group + kFastHeadsPerCta - 1) / kFastHeadsPerCta;
  // (KV head, head group) pair: the block's, or with WARP_ITEMS this warp's (of kFastWarps consecutive ones)
  const int pair = WARP_ITEMS ? blockIdx.y * kFastWarps + static_cast<int>(threadIdx.x / 32) : blockIdx.y;
  if (WARP_ITEMS && pair >= p.num_kv_heads * head_groups) return;  // no block-wide barriers below with WARP_ITEMS
  const int kvh = pair / head_groups;
  const int hg = pair % head_groups;
  const int seq = blockIdx.z;
  const int head0 = kvh * group + hg * kFastHeadsPerCta;
  const int nh = min(kFastHeadsPerCta, group - hg * kFastHeadsPerCta);  // real heads here
  const int ctx = p.context_lens[seq];
  const int start = split * p.split_tokens;
  const int tid = threadIdx.x;
  T* out = static_cast<T*>(p.out);

  if (ctx <= 0) {  // nothing to attend to: zeros (the host API rejects empty contexts)
    if (split == 0) {
      for (int i = WARP_ITEMS ? tid % 32 : tid; i < nh * HEAD; i += WARP_ITEMS ? 32 : kFastWarps * 32) {
        Mma<T>::store(out + (static_cast<int64_t>(seq) * p.num_heads + head0 + i / HEAD) * HEAD + i % HEAD, 0.f);
      }
    }
    return;
  }
  if (start >= ctx) return;  // a split past this sequence's context: the reduce skips it
  const int end = min(ctx, start + p.split_tokens);

  const int warp = tid / 32;
  const int lane = tid % 32;
  const int g = lane >> 2;
  const int t = lane & 3;
  const int bs_mask = (1 << p.block_size_log2) - 1;
  const int* table = p.block_tables + static_cast<int64_t>(seq) * p.max_blocks_per_seq;
  const KV* k_cache = static_cast<const KV*>(p.key_cache) + kvh * p.k_head_stride;
  const KV* v_cache = static_cast<const KV*>(p.value_cache) + kvh * p.v_head_stride;
  const float scale2 = p.scale * kLog2e;
  const bool has_alibi = p.alibi_slopes != nullptr;
  const float slope2 = (has_alibi && g < nh) ? p.alibi_slopes[head0 + g] * kLog2e : 0.f;

  // Query of head g as the A fragment of S = Q K^T (rows g + 8 are zero).
  uint32_t qa[KSTEPS][2];
  {
    const T* q = static_cast<const T*>(p.query) + seq * p.q_stride + static_cast<int64_t>(head0 + g) * HEAD;
#pragma unroll
    for (int j = 0; j < KJ; ++j) {
      const int c = t + 4 * j;
      uint4 v = make_uint4(0, 0, 0, 0);
      if (g < nh && c < NCHUNK) v = *reinterpret_cast<const uint4*>(q + c * 8);
      qa[2 * j][0] = v.x;
      qa[2 * j][1] = v.y;
      qa[2 * j + 1][0] = v.z;
      qa[2 * j + 1][1] = v.w;
    }
  }

  float o[MT][4];
#pragma unroll
  for (int i = 0; i < MT; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
  float m_run = -INFINITY;  // running max of head g's logits, log2 domain
  float l_run = 0.f;        // this lane's share of head g's exp-sum

  const int n_tiles = (end - start + kFastTile - 1) / kFastTile;
  constexpr int kStride = WARP_ITEMS ? 1 : kFastWarps;  // tiles between this warp's consecutive tiles
  const int first = WARP_ITEMS ? 0 : warp;              // this warp's first tile
  // Block ids of the two halves (tokens 0-7 and 8-15) of a tile; equal when blocks hold >= 16.
  auto block_ids = [&](int tile, int& lo, int& hi) {
    const int tok0 = start + tile * kFastTile;
    lo = table[tok0 >> p.block_size_log2];
    hi = tok0 + 8 < end ? table[(tok0 + 8) >> p.block_size_log2] : lo;
  };
  struct Tile {
    int b_lo, b_hi;     // block ids of the two halves (possibly invalid)
    Raw k[2][KJ];       // keys of tokens g, g + 8: chunks t, t + 4, ...
    Raw v[4][2 * NCP];  // values of tokens 2t, 2t + 1, 2t + 8, 2t + 9: chunks g + 8 r
  };
  auto ok = [&](int b) { return static_cast<unsigned>(b) < static_cast<unsigned>(p.num_blocks); };
  auto load_keys = [&](int tile, Tile& x) {
    const int tok0 = start + tile * kFastTile;
#pragma unroll
    for (int n = 0; n < 2; ++n) {
      const int tok = tok0 + 8 * n + g;
      const int b = n ? x.b_hi : x.b_lo;
      const bool live = tok < end && ok(b);
      const KV* row = k_cache + static_cast<int64_t>(live ? b : 0) * p.k_block_stride + (tok & bs_mask) * p.k_token_stride;
#pragma unroll
      for (int j = 0; j < KJ; ++j) {
        const int c = t + 4 * j;
        x.k[n][j] = Raw{};
        if (live && c < NCHUNK) x.k[n][j] = L::load(row + c * 8);
      }
    }
  };
  auto load_values = [&](int tile, Tile& x) {
    const int tok0 = start + tile * kFastTile;
#pragma unroll
    for (int vt = 0; vt < 4; ++vt) {
      const int tok = tok0 + 2 * t + (vt & 1) + 8 * (vt >> 1);
      const int b = (vt >> 1) ? x.b_hi : x.b_lo;
      const bool live = tok < end && ok(b);
      const KV* row = v_cache + static_cast<int64_t>(live ? b : 0) * p.v_block_stride + (tok & bs_mask) * p.v_token_stride;
#pragma unroll
      for (int r = 0; r < 2 * NCP; ++r) {
        const int c = g + 8 * r;
        x.v[vt][r] = Raw{};
        if (live && c < NCHUNK) x.v[vt][r] = L::load(row + c * 8);
      }
    }
  };

  // One tile: S = Q K^T, online softmax, O^T += V^T P^T. Heads > 128 load the values only after
  // S (register pressure), unless they were prefetched.
  // The cp.async ring (16-bit caches). A stage holds one tile: 16 key rows, then 16 value rows,
  // of NCHUNK 16-byte chunks each, then the lanes' copies of the tile's two block ids. The warp
  // copies a tile with whole rows per instruction (32 consecutive chunks: full 128-byte lines),
  // and each lane then reads the chunks its fragments need. Chunk c of row r is stored at
  // position c ^ f(r) of its row (for rows of a multiple of 8 chunks), which makes both fragment
  // read patterns and the copies conflict-free: each group of 8 lanes touches 8 distinct 16-byte
  // bank groups.
  using R = Ring<KV, HEAD>;
  auto stage_base = [&](int stage) {
    return fast_smem + (warp * (STAGES > 0 ? STAGES : 1) + stage) * R::STAGE_BYTES;
  };
  auto swz = [](int row, int c) {
    return (NCHUNK % 8 == 0) ? c ^ (((row & 1) << 2) ^ (((row >> 1) & 3) << 1)) : c;
  };
  auto ring_ids = [&](int stage) {
    return reinterpret_cast<int2*>(stage_base(stage) + 2 * kFastTile * NCHUNK * 16) + lane;
  };
  // Issues the copies of one tile into a stage (and keeps its block ids there).
  auto issue = [&](int tile, int b_lo, int b_hi, int stage) {
    uint4* dst = reinterpret_cast<uint4*>(stage_base(stage));
    *ring_ids(stage) = make_int2(b_lo, b_hi);
    const int tok0 = start + tile * kFastTile;  // a multiple of 16: each half lies in one block
    const KV* kh[2];
    const KV* vh[2];
    bool okh[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int b = h ? b_hi : b_lo;
      okh[h] = ok(b);
      const int64_t blk = okh[h] ? b : 0;
      const int off = (tok0 + 8 * h) & bs_mask;
      kh[h] = k_cache + blk * p.k_block_stride + off * p.k_token_stride;
      vh[h] = v_cache + blk * p.v_block_stride + off * p.v_token_stride;
    }
    if constexpr (32 % NCHUNK == 0) {
      // RPI whole rows per instruction: this lane copies chunk c of rows lr, lr + RPI, ...; the
      // addresses are one per-lane offset plus multiples of RPI rows.
      constexpr int RPI = 32 / NCHUNK;
      const int lr = lane / NCHUNK;
      const int c = lane % NCHUNK;
      const int64_t ko = lr * p.k_token_stride + c * 8;
      const int64_t vo = lr * p.v_token_stride + c * 8;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int ii = 0; ii < 8 / RPI; ++ii) {
          const int row = 8 * h + ii * RPI + lr;
          const bool live = tok0 + row < end && okh[h];
          const int slot = row * NCHUNK + swz(row, c);
          cp_async16(dst + slot, kh[h] + ko + ii * RPI * p.k_token_stride, live);
          cp_async16(dst + kFastTile * NCHUNK + slot, vh[h] + vo + ii * RPI * p.v_token_stride, live);
        }
      }
    } else {
#pragma unroll
      for (int i = 0; i < (kFastTile * NCHUNK + 31) / 32; ++i) {
        const int q = i * 32 + lane;
        if (kFastTile * NCHUNK % 32 == 0 || q < kFastTile * NCHUNK) {
          const int row = q / NCHUNK;
          const int c = q % NCHUNK;
          const int h = row >> 3;
          const bool live = tok0 + row < end && okh[h];
          const int slot = row * NCHUNK + swz(row, c);
          cp_async16(dst + slot, kh[h] + (row & 7) * p.k_token_stride + c * 8, live);
          cp_async16(dst + kFastTile * NCHUNK + slot, vh[h] + (row & 7) * p.v_token_stride + c * 8, live);
        }
      }
    }
  };
  // Fragment reads. Keys: rows g, g + 8, chunks t + 4j, so f(row) = f(g) and chunk c ^ f splits
  // into (t ^ f % 4) + 4 (j ^ f / 4): two lane bases (even / odd j) plus immediates. Values: rows
  // 2t + (vt & 1) + 8 (vt / 2), chunks g + 8r, so f = 4 (vt & 1) ^ 2t: one base per (vt & 1).
  constexpr bool kSwz = NCHUNK % 8 == 0;
  const int fk = kSwz ? (((g & 1) << 2) ^ (((g >> 1) & 3) << 1)) : 0;
  const int kbase = g * NCHUNK + (t ^ (fk & 3));
  const int kb_even = kbase + 4 * (fk >> 2);
  const int kb_odd = kbase - 4 * (fk >> 2);
  const int fv = kSwz ? (t << 1) : 0;
  const int vb0 = 2 * t * NCHUNK + (g ^ fv);
  const int vb1 = (2 * t + 1) * NCHUNK + (g ^ fv ^ (kSwz ? 4 : 0));
  auto read_keys = [&](int stage, Tile& x) {
    const uint4* src = reinterpret_cast<const uint4*>(stage_base(stage));
    const int2 ids = *ring_ids(stage);
    x.b_lo = ids.x;
    x.b_hi = ids.y;
#pragma unroll
    for (int n = 0; n < 2; ++n) {
#pragma unroll
      for (int j = 0; j < KJ; ++j) {
        if constexpr (sizeof(KV) == 2) {
          x.k[n][j] = t + 4 * j < NCHUNK ? src[((j & 1) ? kb_odd : kb_even) + 8 * n * NCHUNK + 4 * j]
                                         : make_uint4(0, 0, 0, 0);
        }
      }
    }
  };
  auto read_values = [&](int stage, Tile& x) {
    const uint4* src = reinterpret_cast<const uint4*>(stage_base(stage)) + kFastTile * NCHUNK;
#pragma unroll
    for (int vt = 0; vt < 4; ++vt) {
#pragma unroll
      for (int r = 0; r < 2 * NCP; ++r) {
        if constexpr (sizeof(KV) == 2) {
          x.v[vt][r] = g + 8 * r < NCHUNK ? src[((vt & 1) ? vb1 : vb0) + 8 * (vt >> 1) * NCHUNK + 8 * r]
                                          : make_uint4(0, 0, 0, 0);
        }
      }
    }
  };

  auto compute = [&](int tile, Tile& x, bool values_loaded, int stage) {
    const int tok0 = start + tile * kFastTile;
    // s[n][0..1] = logits of head g, tokens 8 n + 2t, 8 n + 2t + 1
    // Two independent accumulator chains per N-tile (even and odd k-steps), added at the end: the
    // dependent tensor-core chain before the softmax is half as long.
    float s[2][4];
#pragma unroll
    for (int n = 0; n < 2; ++n) {
      float s2[4] = {0.f, 0.f, 0.f, 0.f};
      s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll
      for (int j = 0; j < KJ; ++j) {
        const uint4 k = L::widen(x.k[n][j]);
        Mma<T>::run(s[n], qa[2 * j][0], 0u, qa[2 * j][1], 0u, k.x, k.y);
        Mma<T>::run(s2, qa[2 * j + 1][0], 0u, qa[2 * j + 1][1], 0u, k.z, k.w);
      }
#pragma unroll
      for (int i = 0; i < 4; ++i) s[n][i] += s2[i];
    }
    if (!values_loaded) {
      if constexpr (STAGES > 0) {
        read_values(stage, x);
      } else {
        load_values(tile, x);
      }
    }

    // ---- online softmax (log2 domain) ----
    const bool ok_lo = ok(x.b_lo), ok_hi = ok(x.b_hi);
    float xs[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int n = i >> 1;
      const int tok = tok0 + 8 * n + 2 * t + (i & 1);
      float v = s[n][i & 1] * scale2;
      if (has_alibi) v += slope2 * static_cast<float>(tok - ctx + 1);
      xs[i] = tok < end ? ((n ? ok_hi : ok_lo) ? v : __int_as_float(0x7fc00000)) : -INFINITY;
    }
    float mx = fmaxf(fmaxf(xs[0], xs[1]), fmaxf(xs[2], xs[3]));
    mx = fmaxf(mx, __shfl_xor_sync(kMask, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(kMask, mx, 2));
    const float m_new = fmaxf(m_run, mx);
    const float alpha = exp2f(m_run - m_new);
    // Rescaling the output is needed only when some head's max grew (otherwise every factor is
    // exactly 1): after the first tiles it rarely does.
    const bool rescale = __any_sync(kMask, m_new > m_run);
    m_run = m_new;
    float pr[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) pr[i] = exp2f(xs[i] - m_new);
    l_run = l_run * alpha + ((pr[0] + pr[1]) + (pr[2] + pr[3]));
    const uint32_t b0 = Mma<T>::pack(pr[0], pr[1]);
    const uint32_t b1 = Mma<T>::pack(pr[2], pr[3]);
    if (rescale) {
      // O^T's columns are heads 2t and 2t + 1, whose factors live in lanes 8t and 8t + 4.
      const float a_even = __shfl_sync(kMask, alpha, 8 * t);
      const float a_odd = __shfl_sync(kMask, alpha, 8 * t + 4);
#pragma unroll
      for (int i = 0; i < MT; ++i) {
        o[i][0] *= a_even;
        o[i][1] *= a_odd;
        o[i][2] *= a_even;
        o[i][3] *= a_odd;
      }
    }

    // ---- O^T += V^T P^T ----
#pragma unroll
    for (int cp = 0; cp < NCP; ++cp) {
      uint4 v[4][2];
#pragma unroll
      for (int vt = 0; vt < 4; ++vt) {
        v[vt][0] = L::widen(x.v[vt][2 * cp]);
        v[vt][1] = L::widen(x.v[vt][2 * cp + 1]);
      }
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const unsigned sel = (e & 1) ? 0x7632u : 0x5410u;
        const int w = e >> 1;
        float (&acc)[4] = o[cp * 8 + e];
        Mma<T>::run(acc, __byte_perm(word(v[0][0], w), word(v[1][0], w), sel),
                    __byte_perm(word(v[0][1], w), word(v[1][1], w), sel),
                    __byte_perm(word(v[2][0], w), word(v[3][0], w), sel),
                    __byte_perm(word(v[2][1], w), word(v[3][1], w), sel), b0, b1);
      }
    }
  };

  if constexpr (STAGES > 0) {
    // This warp's tiles are warp, warp + kFastWarps, ...: k-th one in stage k % STAGES.
    const int my_n = first < n_tiles ? (n_tiles - first + kStride - 1) / kStride : 0;
    int id_lo = 0, id_hi = 0;  // block ids of the next tile to issue
    if (my_n > 0) block_ids(first, id_lo, id_hi);
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
      if (s < my_n) {
        issue(first + s * kStride, id_lo, id_hi, s);
        if (s + 1 < my_n) block_ids(first + (s + 1) * kStride, id_lo, id_hi);
      }
      cp_async_commit();
    }
    int stage = 0;        // stage of tile k
    int next = STAGES - 1;  // stage of tile k + STAGES - 1
    for (int k = 0; k < my_n; ++k) {
      __syncwarp();  // every lane has read the stage about to be refilled (tile k - 1's)
      const int ahead = k + STAGES - 1;
      if (ahead < my_n) {
        issue(first + ahead * kStride, id_lo, id_hi, next);
        if (ahead + 1 < my_n) block_ids(first + (ahead + 1) * kStride, id_lo, id_hi);
      }
      cp_async_commit();
      cp_async_wait<STAGES - 1>();  // this lane's copies of tile k have landed ...
      __syncwarp();                 // ... and so have the other lanes'
      Tile cur;
      read_keys(stage, cur);
      if constexpr (HEAD <= 128) read_values(stage, cur);
      compute(first + k * kStride, cur, HEAD <= 128, stage);
      stage = stage + 1 == STAGES ? 0 : stage + 1;
      next = next + 1 == STAGES ? 0 : next + 1;
    }
    cp_async_wait<0>();
    if constexpr (!WARP_ITEMS) __syncthreads();  // the combine below reuses the ring's shared memory
  } else if constexpr (PREFETCH) {
    // Two tiles in flight per warp: the next tile's loads are issued before this one's products.
    Tile cur;
    int id_lo = 0, id_hi = 0;  // block ids of the tile after the one being loaded
    if (first < n_tiles) {
      block_ids(first, cur.b_lo, cur.b_hi);
      load_keys(first, cur);
      load_values(first, cur);
      if (first + kStride < n_tiles) block_ids(first + kStride, id_lo, id_hi);
    }
    for (int it = first; it < n_tiles; it += kStride) {
      Tile nxt;
      nxt.b_lo = id_lo;
      nxt.b_hi = id_hi;
      const bool more = it + kStride < n_tiles;
      if (more) {
        load_keys(it + kStride, nxt);
        load_values(it + kStride, nxt);
        if (it + 2 * kStride < n_tiles) block_ids(it + 2 * kStride, id_lo, id_hi);
      }
      compute(it, cur, true, 0);
      if (more) cur = nxt;
    }
  } else {
    int id_lo = 0, id_hi = 0;
    if (first < n_tiles) block_ids(first, id_lo, id_hi);
    for (int it = first; it < n_tiles; it += kStride) {
      Tile cur;
      cur.b_lo = id_lo;
      cur.b_hi = id_hi;
      load_keys(it, cur);
      if constexpr (HEAD <= 128) load_values(it, cur);
      // The next tile's block ids, while this tile's loads are in flight.
      if (it + kStride < n_tiles) block_ids(it + kStride, id_lo, id_hi);
      compute(it, cur, HEAD <= 128, 0);
    }
  }

  // ---- combine the warps ----
  l_run += __shfl_xor_sync(kMask, l_run, 1);
  l_run += __shfl_xor_sync(kMask, l_run, 2);
  // Splits holding context tokens; a sequence with one writes its output directly.
  const bool single = min(p.max_splits, (ctx + p.split_tokens - 1) / p.split_tokens) == 1;
  // Dimension d of head h: the output (acc / l), or this split's partial with its max and sum.
  auto write_result = [&](int h, int d, float acc, float m, float l) {
    const int64_t row = static_cast<int64_t>(seq) * p.num_heads + head0 + h;
    if (single) {
      Mma<T>::store(out + row * HEAD + d, acc / l * p.v_scale);
    } else {
      const int64_t idx = row * p.max_splits + split;
      p.part_out[idx * HEAD + d] = acc / l;
      if (d == 0) {
        p.part_max[idx] = m;
        p.part_sum[idx] = l;
      }
    }
  };
  if constexpr (WARP_ITEMS) {
    // The warp is the whole item: its output columns are heads 2t, 2t + 1, whose max and sum live
    // in lanes 8t and 8t + 4.
    const float l_pair[2] = {__shfl_sync(kMask, l_run, 8 * t), __shfl_sync(kMask, l_run, 8 * t + 4)};
    const float m_pair[2] = {__shfl_sync(kMask, m_run, 8 * t), __shfl_sync(kMask, m_run, 8 * t + 4)};
#pragma unroll
    for (int cp = 0; cp < NCP; ++cp) {
#pragma unroll
      for (int e = 0; e < 8; ++e) {
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const int h = 2 * t + (r & 1);
          const int d = 8 * (g + 8 * (r >> 1) + 16 * cp) + e;
          if (h < nh && d < HEAD) write_result(h, d, o[cp * 8 + e][r], m_pair[r & 1], l_pair[r & 1]);
        }
      }
    }
    return;
  }
  __shared__ float sm_m[kFastWarps][kFastHeadsPerCta];
  __shared__ float sm_l[kFastWarps][kFastHeadsPerCta];
  using Combine = float[kFastWarps][kFastHeadsPerCta][HEAD];
  Combine* sm_o_ptr;
  if constexpr (STAGES > 0) {
    sm_o_ptr = reinterpret_cast<Combine*>(fast_smem);
  } else {
    __shared__ Combine sm_o_static;
    sm_o_ptr = &sm_o_static;
  }
  Combine& sm_o = *sm_o_ptr;
  if (t == 0) {
    sm_m[warp][g] = m_run;
    sm_l[warp][g] = l_run;
  }
#pragma unroll
  for (int cp = 0; cp < NCP; ++cp) {
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const int d_lo = 8 * (g + 16 * cp) + e;
      const int d_hi = 8 * (g + 8 + 16 * cp) + e;
      if (d_lo < HEAD) {
        sm_o[warp][2 * t][d_lo] = o[cp * 8 + e][0];
        sm_o[warp][2 * t + 1][d_lo] = o[cp * 8 + e][1];
      }
      if (d_hi < HEAD) {
        sm_o[warp][2 * t][d_hi] = o[cp * 8 + e][2];
        sm_o[warp][2 * t + 1][d_hi] = o[cp * 8 + e][3];
      }
    }
  }
  __syncthreads();
  for (int i = tid; i < nh * HEAD; i += kFastWarps * 32) {
    const int h = i / HEAD;
    const int d = i % HEAD;
    float m = -INFINITY;
#pragma unroll
    for (int w = 0; w < kFastWarps; ++w) m = fmaxf(m, sm_m[w][h]);
    float l = 0.f, acc = 0.f;
#pragma unroll
    for (int w = 0; w < kFastWarps; ++w) {
      const float f = exp2f(sm_m[w][h] - m);  // 0 for a warp that had no tile
      l += sm_l[w][h] * f;
      acc += sm_o[w][h][d] * f;
    }
    write_result(h, d, acc, m, l);
  }
}

// One thread block (kFastWarps warps) per (head, sequence): combines the splits that hold context
// tokens, kBatch splits at a time. The batch's partial outputs (contiguous: [split][HEAD]) are
// copied into shared memory with cp.async and their maxima and sums loaded by the lanes (lane j:
// splits j, j + 32, ...) before anything waits, so each batch costs one memory round trip after
// the attention grid; the weights reach the other lanes by shuffles, and a running max rescales
// the sums between batches. Each thread owns output dimensions.
template <int HEAD>
constexpr int kReduceBatch = 32768 / (HEAD * 4) < 64 ? 32768 / (HEAD * 4) : 64;  // 32 KB of partials

template <typename T, int HEAD>
__global__ void __launch_bounds__(kFastWarps * 32) fast_decode_reduce_kernel(const FastDecodeParams p) {
  constexpr int kThreads = kFastWarps * 32;
  constexpr int kDims = (HEAD + kThreads - 1) / kThreads;  // output dimensions per thread
  constexpr int kBatch = kReduceBatch<HEAD>;
  constexpr int kPerLane = (kBatch + 31) / 32;
  static_assert(HEAD % 4 == 0 && kBatch >= 32, "16-byte copies; a lane per split of the first 32");
  __shared__ __align__(16) float sm_o[kBatch * HEAD];
  const int head = blockIdx.x;
  const int seq = blockIdx.y;
  const int tid = threadIdx.x;
  const int lane = tid % 32;
  // The context length is no output of the attention kernel: read before the wait.
  const int ctx = p.context_lens[seq];
  const int n = min(p.max_splits, (ctx + p.split_tokens - 1) / p.split_tokens);
  const int64_t row = static_cast<int64_t>(seq) * p.num_heads + head;
  const float* pm = p.part_max + row * p.max_splits;
  const float* ps = p.part_sum + row * p.max_splits;
  const float* po = p.part_out + row * p.max_splits * HEAD;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // A programmatic dependent launch: wait until the attention grid has finished and its partials
  // are visible (returns at once for an ordinary launch). Every block waits, even one with nothing
  // to combine, so that the reduce grid never completes before the attention grid.
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
  if (n <= 1) return;  // written by the attention kernel (an empty context, or one split)
  float m = -INFINITY;  // running max (log2 domain), the same in every lane
  float l = 0.f;        // running total weight, relative to m
  float acc[kDims];
#pragma unroll
  for (int k = 0; k < kDims; ++k) acc[k] = 0.f;
  for (int i0 = 0; i0 < n; i0 += kBatch) {
    const int cnt = min(kBatch, n - i0);
    if (i0 > 0) __syncthreads();  // the last batch's partials are used
    for (int q = tid; q < cnt * HEAD / 4; q += kThreads) {
      cp_async16(sm_o + 4 * q, po + static_cast<int64_t>(i0) * HEAD + 4 * q, true);
    }
    cp_async_commit();
    float bm[kPerLane], bs[kPerLane];
#pragma unroll
    for (int r = 0; r < kPerLane; ++r) {
      const int i = lane + 32 * r;
      bm[r] = i < cnt ? pm[i0 + i] : -INFINITY;
      bs[r] = i < cnt ? ps[i0 + i] : 0.f;
    }
    float cm = m;
#pragma unroll
    for (int r = 0; r < kPerLane; ++r) cm = fmaxf(cm, bm[r]);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) cm = fmaxf(cm, __shfl_xor_sync(kMask, cm, o));
    const float rescale = exp2f(m - cm);  // 0 for the first batch
    float w[kPerLane], wsum = 0.f;
#pragma unroll
    for (int r = 0; r < kPerLane; ++r) {
      w[r] = bs[r] * exp2f(bm[r] - cm);  // 0 past the live splits; a NaN max poisons it
      wsum += w[r];
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) wsum += __shfl_xor_sync(kMask, wsum, o);
    l = l * rescale + wsum;
#pragma unroll
    for (int k = 0; k < kDims; ++k) acc[k] *= rescale;
    cp_async_wait<0>();
    __syncthreads();  // every thread's copies have landed
#pragma unroll
    for (int r = 0; r < kPerLane; ++r) {
      const int live = min(32, cnt - 32 * r);  // the same in every thread
      for (int jj = 0; jj < live; ++jj) {
        const float wj = __shfl_sync(kMask, w[r], jj);
        const float* o = sm_o + (32 * r + jj) * HEAD;
#pragma unroll
        for (int k = 0; k < kDims; ++k) {
          const int d = tid + k * kThreads;
          if (d < HEAD) acc[k] += wj * o[d];
        }
      }
    }
    m = cm;
  }
#pragma unroll
  for (int k = 0; k < kDims; ++k) {
    const int d = tid + k * kThreads;
    if (d < HEAD) Mma<T>::store(static_cast<T*>(p.out) + row * HEAD + d, acc[k] / l * p.v_scale);
  }
}

// The current device's shared memory per SM and per block (opt-in), read once per launch: they
// differ between GPU generations (228 / 227 KiB on sm_90, 164 / 163 KiB on sm_80).
struct DeviceSmem {
  size_t per_sm = 0, per_block = 0;
};
inline cudaError_t device_smem(DeviceSmem& d) {
  int dev = 0, sm = 0, block = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&block, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
  d.per_sm = static_cast<size_t>(sm);
  d.per_block = static_cast<size_t>(block);
  return err;
}

// Launches the attention kernel with `smem` bytes of dynamic shared memory (more with
// p.max_ctas_per_sm: enough that no more blocks fit an SM), or with p.ctas_per_sm only reports
// its occupancy. The kernel's dynamic shared-memory attribute is always set to all that the device
// allows beside the kernel's static shared memory, one value whatever the launch asks for, so that
// threads launching with different caps do not race on it.
template <typename Kernel>
cudaError_t launch_or_query(Kernel* kernel, const FastDecodeParams& p, dim3 grid, size_t smem, cudaStream_t stream) {
  if (p.max_ctas_per_sm > 0 || smem > 0) {
    DeviceSmem d;
    cudaError_t err = device_smem(d);
    cudaFuncAttributes fa;  // the kernel's static shared memory counts against the block's limit
    if (err == cudaSuccess) err = cudaFuncGetAttributes(&fa, kernel);
    if (err != cudaSuccess) return err;
    const size_t static_smem = fa.sharedSizeBytes;
    if (p.max_ctas_per_sm > 0) {
      const size_t cap = d.per_sm / (p.max_ctas_per_sm + 1);
      smem = smem > cap ? smem : cap;
    }
    const size_t limit = d.per_block > static_smem ? d.per_block - static_smem : 0;
    if (smem > limit) return cudaErrorInvalidValue;
    err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(limit));
    // all of the SM's unified L1 / shared memory as shared memory, so that as many thread blocks
    // as the shared memory allows are resident (the driver may otherwise pick a smaller carveout)
    if (err == cudaSuccess) {
      err = cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared);
    }
    if (err != cudaSuccess) return err;
  }
  if (p.ctas_per_sm != nullptr) {
    return cudaOccupancyMaxActiveBlocksPerMultiprocessor(p.ctas_per_sm, kernel, kFastWarps * 32, smem);
  }
  kernel<<<grid, kFastWarps * 32, smem, stream>>>(p);
  return cudaSuccess;
}

template <typename T, typename KV, int HEAD, int STAGES>
cudaError_t launch_ring(const FastDecodeParams& p, dim3 grid, cudaStream_t stream) {
  constexpr size_t bytes = Ring<KV, HEAD>::bytes(STAGES);
  if constexpr (bytes > kMaxSmem) {
    return cudaErrorInvalidValue;  // does not fit: fast_decode_smem_bytes says 0
  } else {
    if (!p.warp_items) return launch_or_query(fast_decode_kernel<T, KV, HEAD, false, STAGES>, p, grid, bytes, stream);
    if constexpr (STAGES == 2) {  // the only depth launch rules pick with warp items
      return launch_or_query(fast_decode_kernel<T, KV, HEAD, false, STAGES, true>, p, grid, bytes, stream);
    } else {
      return cudaErrorInvalidValue;
    }
  }
}

template <typename T, typename KV, int HEAD>
cudaError_t launch_head(const FastDecodeParams& p, cudaStream_t stream) {
  const int group = p.num_heads / p.num_kv_heads;
  const int head_groups = (group + kFastHeadsPerCta - 1) / kFastHeadsPerCta;
  const int pairs = p.num_kv_heads * head_groups;  // (KV head, head group) pairs of a sequence
  const dim3 grid(p.max_splits, p.warp_items ? (pairs + kFastWarps - 1) / kFastWarps : pairs, p.num_seqs);
  if (p.warp_items && p.stages != 2) return cudaErrorInvalidValue;
  cudaError_t err = cudaSuccess;
  switch (p.stages) {
    case 0:
      if (HEAD <= 128 && p.prefetch) {
        err = launch_or_query(fast_decode_kernel<T, KV, HEAD, HEAD <= 128, 0>, p, grid, 0, stream);
      } else {
        err = launch_or_query(fast_decode_kernel<T, KV, HEAD, false, 0>, p, grid, 0, stream);
      }
      break;
    case 2: err = launch_ring<T, KV, HEAD, 2>(p, grid, stream); break;
    case 3: err = launch_ring<T, KV, HEAD, 3>(p, grid, stream); break;
    case 4: err = launch_ring<T, KV, HEAD, 4>(p, grid, stream); break;
    default: return cudaErrorInvalidValue;
  }
  if (err != cudaSuccess || p.ctas_per_sm != nullptr) return err;
  err = cudaGetLastError();
  if (err != cudaSuccess || p.max_splits == 1) return err;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(p.num_heads, p.num_seqs);
  cfg.blockDim = dim3(kFastWarps * 32);
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  if (p.pdl) {
    cfg.attrs = attr;
    cfg.numAttrs = 1;
  }
  return cudaLaunchKernelEx(&cfg, fast_decode_reduce_kernel<T, HEAD>, p);
}

template <typename T, typename KV>
cudaError_t launch_typed(const FastDecodeParams& p, cudaStream_t stream) {
  switch (p.head_size) {
#ifndef BLOCKSIM_FEW_INSTANCES
    case 32: return launch_head<T, KV, 32>(p, stream);
    case 64: return launch_head<T, KV, 64>(p, stream);
    case 80: return launch_head<T, KV, 80>(p, stream);
    case 96: return launch_head<T, KV, 96>(p, stream);
    case 112: return launch_head<T, KV, 112>(p, stream);
    case 120: return launch_head<T, KV, 120>(p, stream);
    case 192: return launch_head<T, KV, 192>(p, stream);
#endif
    case 128: return launch_head<T, KV, 128>(p, stream);
    case 256: return launch_head<T, KV, 256>(p, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace fast

cudaError_t launch_fast_decode_f16(const FastDecodeParams& p, cudaStream_t stream);
cudaError_t launch_fast_decode_bf16(const FastDecodeParams& p, cudaStream_t stream);
cudaError_t launch_fast_decode_fp8(const FastDecodeParams& p, cudaStream_t stream);

}  // namespace blocksim
