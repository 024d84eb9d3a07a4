// Paged prefill attention on Hopper's warpgroup tensor-core products (wgmma, sm_90a), float16 and
// bfloat16 at head size 128: the path kernels/fast/prefill.py dispatches to on compute capability
// 9.0 (paged_prefill.cuh's mma.sync kernel runs every other case).
//
// Rows as the mma.sync kernel's: the queries of one KV head's GQA group are packed rows (packed
// row R is new token R / group of query head kvh * group + R % group). A thread block of two
// warpgroups (256 threads) takes 128 consecutive packed rows of one (sequence, KV head) pair, each
// warpgroup 64 of them. Two kernels (launch's rule): the in-step kernel, on the grid (row blocks,
// KV heads, sequences) with the row blocks with the most keys first; and the ping-pong kernel, on
// a grid of items ordered in bands of row blocks, the band with the most keys first, pair by pair
// within a band (item_at).
//
// Shared memory (225 KB, one block per SM): Q's 128 rows, a ring of 3 key tiles and one of 3
// value tiles of 128 keys each, and a ring of block ids. A tile is stored as two halves of 64
// head dims, each row of a half 128 bytes with its 16-byte chunk c at c ^ (row % 8): the 128-byte
// swizzle the products' shared-memory descriptors name, so a copy of 8 rows and a product's reads
// are conflict-free. Threads copy 16-byte chunks with cp.async, gathering each key row through
// the block table (any block size); chunks past the rows' last key or of a block id outside the
// cache are zero-filled without reading memory, so unused cache slots never reach the arithmetic.
//
// Per key tile n, each warpgroup: S_n = Q K_n^T (8 wgmma m64n128k16, both operands in shared
// memory, K-major), issued together with O += P_{n-1} V_{n-1} (8 wgmma with P, the previous tile's
// probabilities, as register A fragments: S's accumulator layout is the A fragment layout, so the
// probabilities never leave registers; V is read N-major through the descriptor, no transpose).
// While that product runs, the warpgroup waits for S_n only and computes its online softmax (log2
// domain, the causal mask only on tiles that cross a row's position); then it waits for the
// product, rescales O where a row's max moved and packs P_n. One barrier per tile orders the ring
// (the copies of the tiles about to be read have landed, and every warpgroup is done with the
// stages about to be refilled). In step: both warpgroups together, every thread copying key tile
// n + 2 and value tile n + 1 after barrier n. Ping-pong: the second warpgroup half a tile behind
// (its softmax under the first one's products and the first one's under its own), the first
// warpgroup copying value tile n and the second key tile n + 2 after barrier n.
#pragma once

#include <algorithm>
#include <cstdlib>
#include <type_traits>

#include "paged_prefill.cuh"

namespace blocksim {
namespace prefill {
namespace wg {

constexpr int kHead = 128;
constexpr int kRows = 128;          // packed query rows per thread block
constexpr int kKeys = 128;          // keys per tile
constexpr int kStages = 3;          // ring stages of key tiles, and of value tiles
constexpr int kThreads = 256;       // two warpgroups
constexpr int kHalfRow = 128;       // bytes of a swizzled row of 64 head dims
constexpr int kQBytes = kRows * kHead * 2;
constexpr int kTileBytes = kKeys * kHead * 2;
constexpr int kIdsPerTile = kKeys / 8;  // block ids of a tile's keys at the smallest block size
constexpr int kIdSlots = 8;             // tiles of block ids in their ring
constexpr int kSmemBytes = kQBytes + 2 * kStages * kTileBytes + kIdSlots * kIdsPerTile * 4 + 1024;  // + alignment slack

// Shared-memory matrix descriptor of a 128-byte-swizzled operand: start address, leading and
// stride byte offsets (each in 16-byte units), layout type 1 (128-byte swizzle).
__device__ __forceinline__ uint64_t smem_desc(uint32_t addr, uint32_t lead_bytes, uint32_t stride_bytes) {
  return static_cast<uint64_t>((addr & 0x3ffff) >> 4) | (static_cast<uint64_t>(lead_bytes >> 4) << 16) |
         (static_cast<uint64_t>(stride_bytes >> 4) << 32) | (uint64_t{1} << 62);
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
// Keeps the compiler from moving reads or writes of these registers across the asynchronous
// products' issue and wait.
template <int N>
__device__ __forceinline__ void fence_regs(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
template <int N>
__device__ __forceinline__ void fence_regs(uint32_t (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+r"(r[i])::"memory");
}

// The 64 accumulator operands of an m64n128 wgmma: their names in the PTX string and their bindings.
#define BLOCKSIM_WGMMA_D_REGS \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define BLOCKSIM_WGMMA_D_OUTS \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
  "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
  "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
  "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), \
  "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
  "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
  "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
  "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])

#define BLOCKSIM_WGMMA_SS(TY)                                                                         \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"                                          \
               "wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY " {" BLOCKSIM_WGMMA_D_REGS       \
               "}, %64, %65, p, 1, 1, 0, 0;\n}\n"                                                     \
               : BLOCKSIM_WGMMA_D_OUTS                                                                  \
               : "l"(desc_a), "l"(desc_b), "r"(scale_d))

#define BLOCKSIM_WGMMA_RS(TY)                                                                         \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"                                          \
               "wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY " {" BLOCKSIM_WGMMA_D_REGS       \
               "}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"                                       \
               : BLOCKSIM_WGMMA_D_OUTS                                                                  \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d))

// D (64 x 128, float) (+)= A B: A from shared memory (desc_a, K-major) or registers (a, the A
// fragments of 16 columns), B from shared memory (desc_b); scale_d 0 overwrites D.
template <typename T>
struct Wgmma;

template <>
struct Wgmma<__half> {
  __device__ __forceinline__ static void ss(float (&d)[64], uint64_t desc_a, uint64_t desc_b, int scale_d) {
    BLOCKSIM_WGMMA_SS("f16");
  }
  __device__ __forceinline__ static void rs(float (&d)[64], const uint32_t (&a)[4], uint64_t desc_b, int scale_d) {
    BLOCKSIM_WGMMA_RS("f16");
  }
};

template <>
struct Wgmma<__nv_bfloat16> {
  __device__ __forceinline__ static void ss(float (&d)[64], uint64_t desc_a, uint64_t desc_b, int scale_d) {
    BLOCKSIM_WGMMA_SS("bf16");
  }
  __device__ __forceinline__ static void rs(float (&d)[64], const uint32_t (&a)[4], uint64_t desc_b, int scale_d) {
    BLOCKSIM_WGMMA_RS("bf16");
  }
};

// Byte offset of 16-byte chunk c (0-15) of row r in a swizzled tile of `rows` rows.
template <int ROWS>
__device__ __forceinline__ uint32_t tile_offset(int r, int c) {
  return static_cast<uint32_t>((c >> 3) * ROWS * kHalfRow + r * kHalfRow + (((c & 7) ^ (r & 7)) << 4));
}

// One work item: 128 packed rows (row block mb) of one (sequence, KV head) pair.
struct Item {
  int seq, kvh, m0, rows, q_start, cached, kv_end, n_tiles;
};

// The work items in the order the blocks take them: bands of `band` row blocks, the band of the
// last row blocks (the most keys) first; in a band, pair by pair (a pair's row blocks read the same
// keys, so the blocks running a band's items together share them in L2), each pair's row blocks
// from the last. Item idx of m_blocks row blocks per pair, `pairs` (sequence, KV head) pairs.
__device__ __forceinline__ Item item_at(const PagedPrefillParams& p, int idx, int pairs, int m_blocks, int band,
                                        int group) {
  const int per_band = band * pairs;
  const int bi = idx / per_band;
  const int r = idx - bi * per_band;
  const int width = min(band, m_blocks - bi * band);
  const int pair = r / width;
  Item it;
  it.seq = pair / p.num_kv_heads;
  it.kvh = pair - it.seq * p.num_kv_heads;
  it.m0 = (m_blocks - 1 - bi * band - (r - pair * width)) * kRows;
  it.q_start = __ldg(p.query_start_loc + it.seq);
  const int new_tokens = __ldg(p.query_start_loc + it.seq + 1) - it.q_start;
  it.rows = new_tokens * group;
  it.cached = __ldg(p.context_lens + it.seq) - new_tokens;
  it.kv_end = it.cached + (min(it.m0 + kRows, it.rows) - 1) / group + 1;  // keys any row of the item sees
  it.n_tiles = (it.kv_end + kKeys - 1) / kKeys;
  return it;
}

// The ping-pong kernel: block b runs item b of item_at's order (items past a sequence's rows
// exit). The first warpgroup copies the value tiles, the second the key tiles, and the second
// runs half a tile behind the first, so that each one's softmax runs under the other's products.
// Eight rows r0 + STEP i (i = 0..7) of a key or value tile, row `row0` of the thread's copy role
// added, gathered through the tile's block ids into the tile at `dst`: every id is read before the
// first copy (the copies are ordered asm statements, and a read after one would wait for it,
// chaining the rows' latencies). Rows at or past `left` and ids past the cache are zero-filled.
// Byte offsets within a block fit 32 bits (launch checks the strides), so each row's address is one
// wide multiply-add from its id.
template <int STEP>
__device__ __forceinline__ void copy_rows(unsigned char* dst, const int* tile_ids, int row0, int r0, int key0, int left,
                                          const char* base, int block_bytes, int token_bytes,
                                          const PagedPrefillParams& p, int bs_mask) {
  int bid[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) bid[i] = tile_ids[(row0 + r0 + STEP * i) >> p.block_size_log2];
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int r = r0 + STEP * i;
    const bool live = r < left && static_cast<unsigned>(bid[i]) < static_cast<unsigned>(p.num_blocks);
    int64_t off;
    asm("mul.wide.s32 %0, %1, %2;\n" : "=l"(off) : "r"(live ? bid[i] : 0), "r"(block_bytes));
    const char* src = base + off + ((key0 + r) & bs_mask) * token_bytes;
    cp_async16(dst + r * kHalfRow, src, live);
  }
}

// The tile math both warpgroup kernels share, per warpgroup and key tile of kKeys keys: S = Q K^T
// (kd: the tile's stage of the K ring), O += P V (vd: its stage of the V ring), the online softmax
// of S in place (log2 domain; masked tiles get their scaled and masked scores first; alpha receives
// the rows' rescale factors), and the rescale of O with the packing of P as the next product's A.
template <typename T>
__device__ __forceinline__ void tile_issue_s(float (&s)[64], uint64_t q_desc, uint64_t kd) {
#pragma unroll
  for (int ks = 0; ks < kHead / 16; ++ks) {
    const uint32_t off = (ks >> 2) * kRows * kHalfRow + (ks & 3) * 32;
    const uint32_t koff = (ks >> 2) * kKeys * kHalfRow + (ks & 3) * 32;
    Wgmma<T>::ss(s, q_desc + (off >> 4), kd + (koff >> 4), ks);
  }
  wgmma_commit();
}

template <typename T>
__device__ __forceinline__ void tile_issue_pv(float (&o)[64], const uint32_t (&pa)[32], uint64_t vd) {
#pragma unroll
  for (int kk = 0; kk < kKeys / 16; ++kk) {
    const uint32_t a[4] = {pa[4 * kk], pa[4 * kk + 1], pa[4 * kk + 2], pa[4 * kk + 3]};
    Wgmma<T>::rs(o, a, vd + ((kk * 16 * kHalfRow) >> 4), 1);
  }
  wgmma_commit();
}

// n: the key tile; first_pos: the position of the warpgroup's first row; t: the thread's quad
// lane; qpos: the positions of its rows g and g + 8.
__device__ __forceinline__ void tile_softmax(float (&s)[64], float (&m_run)[2], float (&l_run)[2],
                                             float (&alpha)[2], int n, float scale2, int first_pos, int t,
                                             const int (&qpos)[2]) {
  const int key0 = n * kKeys;
  float sc = scale2;
  if (key0 + kKeys - 1 > first_pos) {
    sc = 1.f;
#pragma unroll
    for (int j = 0; j < kKeys / 8; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int key = key0 + j * 8 + 2 * t + e;
          const float v = s[4 * j + 2 * h + e] * scale2;
          s[4 * j + 2 * h + e] = key > qpos[h] ? -INFINITY : v;
        }
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float part[4];  // four independent chains (a single chain's latency shows: two warps per scheduler)
#pragma unroll
    for (int k = 0; k < 4; ++k) part[k] = fmaxf(s[4 * k + 2 * h], s[4 * k + 2 * h + 1]);
#pragma unroll
    for (int j = 4; j < kKeys / 8; ++j) part[j % 4] = fmaxf(part[j % 4], fmaxf(s[4 * j + 2 * h], s[4 * j + 2 * h + 1]));
    float mx = fmaxf(fmaxf(part[0], part[1]), fmaxf(part[2], part[3]));
    mx = fmaxf(mx, __shfl_xor_sync(kMask, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(kMask, mx, 2));
    const float m_new = fmaxf(m_run[h], mx * sc);
    const float base = m_new == -INFINITY ? 0.f : m_new;
    alpha[h] = ex2(m_run[h] - base);
    m_run[h] = m_new;
#pragma unroll
    for (int k = 0; k < 4; ++k) part[k] = 0.f;
#pragma unroll
    for (int j = 0; j < kKeys / 8; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float pv = ex2(fmaf(s[4 * j + 2 * h + e], sc, -base));
        s[4 * j + 2 * h + e] = pv;
        part[(2 * j + e) % 4] += pv;
      }
    l_run[h] = l_run[h] * alpha[h] + ((part[0] + part[1]) + (part[2] + part[3]));
  }
}

template <typename T>
__device__ __forceinline__ void tile_rescale_and_pack(float (&o)[64], uint32_t (&pa)[32], const float (&s)[64],
                                                      const float (&alpha)[2]) {
  if (alpha[0] != 1.f || alpha[1] != 1.f) {  // only where a row's max moved
#pragma unroll
    for (int d = 0; d < kHead / 8; ++d) {
      o[4 * d] *= alpha[0];
      o[4 * d + 1] *= alpha[0];
      o[4 * d + 2] *= alpha[1];
      o[4 * d + 3] *= alpha[1];
    }
  }
#pragma unroll
  for (int j = 0; j < kKeys / 8; ++j) {
    pa[2 * j] = Mma<T>::pack(s[4 * j], s[4 * j + 1]);
    pa[2 * j + 1] = Mma<T>::pack(s[4 * j + 2], s[4 * j + 3]);
  }
}

// A warpgroup's rows before their first tile: the output and the packed probabilities zero, each
// row's running max -inf and sum 0, and the positions of the thread's packed rows `row` and
// `row + 8` (dead rows take the last row's).
__device__ __forceinline__ void start_rows(float (&o)[64], uint32_t (&pa)[32], float (&m_run)[2], float (&l_run)[2],
                                           int (&qpos)[2], int cached, int row, int rows, int group) {
#pragma unroll
  for (int i = 0; i < 64; ++i) o[i] = 0.f;
#pragma unroll
  for (int i = 0; i < 32; ++i) pa[i] = 0u;
  m_run[0] = m_run[1] = -INFINITY;
  l_run[0] = l_run[1] = 0.f;
#pragma unroll
  for (int h = 0; h < 2; ++h) qpos[h] = cached + min(row + 8 * h, rows - 1) / group;
}

// 1 / the sum of a packed row's probabilities, from the thread's part `l` (the quad's four parts).
__device__ __forceinline__ float inv_row_sum(float l) {
  l += __shfl_xor_sync(kMask, l, 1);
  l += __shfl_xor_sync(kMask, l, 2);
  return 1.f / l;
}

// The thread's output fragments normalised by their rows' sums and packed two columns a word into
// shared memory: row half h (the thread's packed row g + 8 h), columns 8 d + 2 t and 8 d + 2 t + 1
// at `addr(h, d)`.
template <typename T, typename Addr>
__device__ __forceinline__ void write_rows_shared(const float (&o)[64], const float (&l_run)[2], Addr addr) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float f = inv_row_sum(l_run[h]);
#pragma unroll
    for (int d = 0; d < kHead / 8; ++d) {
      const uint32_t v = Mma<T>::pack(o[4 * d + 2 * h] * f, o[4 * d + 2 * h + 1] * f);
      asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(addr(h, d)), "r"(v) : "memory");
    }
  }
}

// The output of the thread's packed rows `row` and `row + 8` (of `rows`), normalised by their sums;
// t: the thread's quad lane.
template <typename T>
__device__ __forceinline__ void store_rows(const float (&o)[64], const float (&l_run)[2], T* out, int row, int rows,
                                           int q_start, int group, int kvh, int64_t token_stride, int t) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float f = inv_row_sum(l_run[h]);
    const int R = row + 8 * h;
    if (R >= rows) continue;
    T* dst = out + (q_start + R / group) * token_stride + static_cast<int64_t>(kvh * group + R % group) * kHead + 2 * t;
#pragma unroll
    for (int d = 0; d < kHead / 8; ++d) {
      *reinterpret_cast<uint32_t*>(dst + d * 8) = Mma<T>::pack(o[4 * d + 2 * h] * f, o[4 * d + 2 * h + 1] * f);
    }
  }
}

// store_rows through the warp's 4 KB staging area at shared address `stage`, for stores of whole
// 16-byte chunks (the output 16-byte aligned): the warp writes its 16 rows row0 .. row0 + 15 there
// (chunk d of staged row r at d ^ (r % 8), so that neither the fragment writes nor the row reads
// conflict in the banks), then each half-warp stores a row's 256 contiguous bytes: 8 store
// instructions a warp of 4 whole 128-byte lines each, where store_rows issues 32 of 8 half-filled
// 32-byte sectors each.
template <typename T>
__device__ __forceinline__ void store_rows_staged(const float (&o)[64], const float (&l_run)[2], T* out, uint32_t stage,
                                                  int row0, int rows, int q_start, int group, int kvh,
                                                  int64_t token_stride, int g, int t, int lane) {
  __syncwarp();  // the warp's previous rows have been read out of the area
  write_rows_shared<T>(o, l_run, [&](int h, int d) { return stage + (g + 8 * h) * (kHead * 2) + t * 4 + ((d ^ g) << 4); });
  __syncwarp();
  const int c = lane & 15;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int r = (lane >> 4) + 2 * i;
    uint4 v;
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "r"(stage + r * (kHead * 2) + ((c ^ (r & 7)) << 4))
                 : "memory");
    const int R = row0 + r;
    if (R < rows) {
      T* dst = out + (q_start + R / group) * token_stride + static_cast<int64_t>(kvh * group + R % group) * kHead + c * 8;
      *reinterpret_cast<uint4*>(dst) = v;
    }
  }
}

// What both warpgroup kernels set up first: each thread's roles and the block's shared memory.
struct BlockSetup {
  int tid, wgi, warp, lane, g, t;  // thread; its warpgroup, warp in the warpgroup and lane; fragment row / column
  // Copy roles: thread tid copies chunk tid % 16 of rows tid / 16 + 16 i (i = 0..7) of a 128-row
  // tile; the swizzled offset within a row is the same for all of them.
  int c_chunk, c_row0;
  uint32_t c_off;
  // Shared memory (1024-byte aligned): Q's rows, the key ring, the value ring and the block-id ring.
  uint32_t smem, q_smem, k_ring, v_ring, id_ring;
  unsigned char* smem_ptr;  // the generic address of `smem`

  __device__ __forceinline__ explicit BlockSetup(unsigned char* raw) {
    tid = threadIdx.x;
    wgi = tid / 128;
    warp = (tid / 32) % 4;
    lane = tid % 32;
    g = lane >> 2;
    t = lane & 3;
    const uint32_t smem_raw = static_cast<uint32_t>(__cvta_generic_to_shared(raw));
    smem = (smem_raw + 1023) & ~1023u;
    smem_ptr = raw + (smem - smem_raw);
    q_smem = smem;
    k_ring = smem + kQBytes;
    v_ring = k_ring + kStages * kTileBytes;
    id_ring = v_ring + kStages * kTileBytes;
    c_chunk = tid & 15;
    c_row0 = tid >> 4;
    c_off = tile_offset<kKeys>(c_row0, c_chunk);
  }
};

template <typename T>
__global__ void __launch_bounds__(kThreads, 1) paged_prefill_wgmma_pingpong_kernel(const PagedPrefillParams p,
                                                                                   const int m_blocks, const int band) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  const int group = p.num_heads / p.num_kv_heads;
  const Item it = item_at(p, blockIdx.x, p.num_seqs * p.num_kv_heads, m_blocks, band, group);
  if (it.m0 >= it.rows) return;

  extern __shared__ __align__(1024) unsigned char wgmma_smem[];
  const BlockSetup b(wgmma_smem);
  const T* const q_base = static_cast<const T*>(p.query) + b.c_chunk * 8;
  auto load_q = [&](const Item& it) {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int R = it.m0 + b.c_row0 + 16 * i;
      const bool live = R < it.rows;
      const T* src = q_base;
      if (live) src = q_base + (it.q_start + R / group) * p.q_token_stride + static_cast<int64_t>(it.kvh * group + R % group) * kHead;
      cp_async16(b.smem_ptr + (b.q_smem - b.smem) + tile_offset<kRows>(b.c_row0 + 16 * i, b.c_chunk), src, live);
    }
  };
  const int bs_mask = (1 << p.block_size_log2) - 1;
  // The block ids of the item's tile m (entry e: keys e * block_size .. of the tile; -1 past the
  // item's keys) sit in slot m % kIdSlots of a ring of ids in shared memory, copied four tiles
  // ahead of the key tile's copies, so that no copy waits on a read of the table.
  auto copy_ids = [&](const Item& it, int* ids, int tile, int e, bool async) {
    const int first = (tile * kKeys) >> p.block_size_log2;
    const int key = (first + e) << p.block_size_log2;
    int* const dst = ids + (tile % kIdSlots) * kIdsPerTile + e;
    const bool live = tile < it.n_tiles && key < it.kv_end && key < (tile + 1) * kKeys;
    const int* const table = p.block_tables + static_cast<int64_t>(it.seq) * p.max_blocks_per_seq;
    if (!live) {
      *dst = -1;
    } else if (async) {
      asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(static_cast<uint32_t>(__cvta_generic_to_shared(dst))),
                   "l"(table + first + e)
                   : "memory");
    } else {
      *dst = __ldg(table + first + e);
    }
  };
  // One tile of keys (which = 0) or values (1) of an item into ring stage `stage` (copy_rows).
  const char* const k_bytes = reinterpret_cast<const char*>(static_cast<const T*>(p.key_cache) + b.c_chunk * 8);
  const char* const v_bytes = reinterpret_cast<const char*>(static_cast<const T*>(p.value_cache) + b.c_chunk * 8);
  const int k_block_bytes = static_cast<int>(p.k_block_stride * 2), k_token_bytes = static_cast<int>(p.k_token_stride * 2);
  const int v_block_bytes = static_cast<int>(p.v_block_stride * 2), v_token_bytes = static_cast<int>(p.v_token_stride * 2);
  auto load_tile = [&](const Item& it, const int* ids, int tile, int stage, int which) {
    const char* const base = which ? v_bytes + it.kvh * p.v_head_stride * 2 : k_bytes + it.kvh * p.k_head_stride * 2;
    const int block_bytes = which ? v_block_bytes : k_block_bytes;
    const int token_bytes = which ? v_token_bytes : k_token_bytes;
    const uint32_t dst = (which ? b.v_ring : b.k_ring) + stage * kTileBytes + b.c_off - b.smem;
    const int* const tile_ids = ids + (tile % kIdSlots) * kIdsPerTile;
    const int key0 = tile * kKeys + b.c_row0;
    const int left = it.kv_end - key0;  // rows i with 16 i < left hold keys of the item
    copy_rows<16>(b.smem_ptr + dst, tile_ids, b.c_row0, 0, key0, left, base, block_bytes, token_bytes, p, bs_mask);
  };
  // The same by one warpgroup's 128 threads alone (the ping-pong split: the first warpgroup copies
  // value tiles, the second key tiles): thread l copies chunk l % 16 of rows l / 16 + 8 i.
  const int h_chunk = b.tid & 15;
  const int h_row0 = (b.tid & 127) >> 4;
  const uint32_t h_off = tile_offset<kKeys>(h_row0, h_chunk);
  auto load_tile_wg = [&](const Item& it, const int* ids, int tile, int stage, int which) {
    const char* const base = which ? v_bytes + it.kvh * p.v_head_stride * 2 : k_bytes + it.kvh * p.k_head_stride * 2;
    const int block_bytes = which ? v_block_bytes : k_block_bytes;
    const int token_bytes = which ? v_token_bytes : k_token_bytes;
    const uint32_t dst = (which ? b.v_ring : b.k_ring) + stage * kTileBytes + h_off - b.smem;
    const int* const tile_ids = ids + (tile % kIdSlots) * kIdsPerTile;
    const int key0 = tile * kKeys + h_row0;
    const int left = it.kv_end - key0;
#pragma unroll
    for (int half = 0; half < 2; ++half)  // 8 ids read before 8 copies, twice
      copy_rows<8>(b.smem_ptr + dst, tile_ids, h_row0, 64 * half, key0, left, base, block_bytes, token_bytes, p, bs_mask);
  };
  // The first copies, in two groups: the Q rows and key tile 0, then key tile 1 and value tile 0
  // (tile j in ring stage j % kStages).
  auto first_copies = [&](const Item& it, const int* ids) {
    load_q(it);
    load_tile(it, ids, 0, 0, 0);
    cp_async_commit();
    if (it.n_tiles > 1) load_tile(it, ids, 1, 1, 0);
    load_tile(it, ids, 0, 0, 1);
    cp_async_commit();
  };

  int* const ids = reinterpret_cast<int*>(b.smem_ptr + (b.id_ring - b.smem));
  if (b.tid < 4 * kIdsPerTile) copy_ids(it, ids, b.tid / kIdsPerTile, b.tid % kIdsPerTile, false);
  __syncthreads();
  first_copies(it, ids);

  const float scale2 = p.scale * kLog2e;
  const uint64_t q_desc = smem_desc(b.q_smem + b.wgi * 64 * kHalfRow, 16, 1024);
  const uint64_t k_desc = smem_desc(b.k_ring, 16, 1024);
  // V is N-major: its leading byte offset steps between the two halves of 64 head dims, its stride
  // byte offset between groups of 8 keys (Q's and K's leading offsets are unused: K-major, swizzled)
  const uint64_t v_desc = smem_desc(b.v_ring, kKeys * kHalfRow, 1024);

  {
    const int n_tiles = it.n_tiles;
    const int wg_row0 = it.m0 + b.wgi * 64;  // the warpgroup's first packed row
    const bool wg_live = wg_row0 < it.rows;
    const int wg_first_pos = it.cached + wg_row0 / group;
    const int wg_kv_end = wg_live ? it.cached + (min(wg_row0 + 64, it.rows) - 1) / group + 1 : 0;
    const int wg_tiles = (wg_kv_end + kKeys - 1) / kKeys;
    auto stage = [&](int n) { return n % kStages; };

    // The ring's barrier before tile n's products: key tile n and value tile n - 1 landed and are
    // visible to the tensor cores' reads; the stages that the copies issued after it refill are
    // free. The first warpgroup waits for its own copies of value tile n - 1 (at n = 0 for its
    // share of the Q rows and key tile 0), the second for those of key tile n.
    auto ring_barrier = [&](int n) {
      if (b.wgi == 0 ? n > 0 : n == n_tiles) {
        cp_async_wait<0>();
      } else {
        cp_async_wait<1>();
      }
      fence_proxy_async();
      __syncthreads();
    };
    // After barrier n: the first warpgroup copies value tile n (from n = 1; value tile 0 comes with
    // the first copies) and the ids of tile n + 4, the second key tile n + 2. Value tile n's stage
    // held value tile n - 3, which both warpgroups are done with at barrier n (the second
    // warpgroup's product of value tile n - 2 may still run); key tile n + 2's held key tile
    // n - 1, whose products both waited for before barrier n. role: the calling warpgroup where
    // the caller knows it at compile time (std::integral_constant 0 or 1), else -1.
    auto copies = [&](int n, auto role) {
      constexpr int kRole = decltype(role)::value;
      if (kRole == 0 || (kRole < 0 && b.wgi == 0)) {
        if (n > 0 && n < n_tiles) load_tile_wg(it, ids, n, stage(n), 1);
      } else if (n + 2 < n_tiles) {
        load_tile_wg(it, ids, n + 2, stage(n + 2), 0);
      }
      if (b.tid < kIdsPerTile) copy_ids(it, ids, n + 4, b.tid, true);
      cp_async_commit();
    };
    constexpr std::integral_constant<int, -1> kAny{};
    constexpr std::integral_constant<int, 0> kFirst{};
    constexpr std::integral_constant<int, 1> kSecond{};

    float o[64];
    float s[64];
    uint32_t pa[32];
    float m_run[2], l_run[2];
    int qpos[2];
    start_rows(o, pa, m_run, l_run, qpos, it.cached, wg_row0 + b.warp * 16 + b.g, it.rows, group);

    auto issue_s = [&](int n) { tile_issue_s<T>(s, q_desc, k_desc + ((stage(n) * kTileBytes) >> 4)); };
    auto issue_pv = [&](int n) { tile_issue_pv<T>(o, pa, v_desc + ((stage(n) * kTileBytes) >> 4)); };
    auto softmax = [&](int n, float (&alpha)[2]) {
      tile_softmax(s, m_run, l_run, alpha, n, scale2, wg_first_pos, b.t, qpos);
    };
    // Pins the softmax's results before the wait for the P V product that follows it: without it the
    // compiler is free to sink the exponentials and sums past that wait, so the softmax would run
    // after the product instead of under it.
    auto fence_softmax = [&](float (&alpha)[2]) {
      fence_regs(s);
      fence_regs(alpha);
      fence_regs(l_run);
      fence_regs(m_run);
    };
    auto rescale_and_pack = [&](const float (&alpha)[2]) { tile_rescale_and_pack<T>(o, pa, s, alpha); };

    int n = 0;
    if (b.wgi == 1 && wg_live) {
      // The second warpgroup runs half a tile behind: after barrier n it computes the softmax of
      // S_{n-1} while the first warpgroup's products of tile n run, then issues its own S_n and
      // P_{n-1} V_{n-1}, which the tensor cores run while the first warpgroup computes its
      // softmax of S_n; it waits for S_n before barrier n + 1 (key tile n's stage is refilled
      // there) and for P_{n-1} V_{n-1} only before its next rescale.
      float alpha[2];
      ring_barrier(0);
      wgmma_fence();
      issue_s(0);
      copies(0, kSecond);
      wgmma_wait<0>();
      fence_regs(s);
      for (n = 1; n < wg_tiles; ++n) {
        ring_barrier(n);
        softmax(n - 1, alpha);
        fence_softmax(alpha);
        wgmma_wait<0>();
        fence_regs(o);
        fence_regs(pa);
        rescale_and_pack(alpha);
        fence_regs(o);
        fence_regs(pa);
        fence_regs(s);
        wgmma_fence();
        issue_s(n);
        issue_pv(n - 1);
        copies(n, kSecond);
        wgmma_wait<1>();
        fence_regs(s);
      }
      ring_barrier(n);
      softmax(n - 1, alpha);
      fence_softmax(alpha);
      wgmma_wait<0>();
      fence_regs(o);
      fence_regs(pa);
      rescale_and_pack(alpha);
      fence_regs(o);
      fence_regs(pa);
      wgmma_fence();
      issue_pv(n - 1);
      copies(n, kSecond);
      wgmma_wait<0>();
      fence_regs(o);
      ++n;
    } else if (wg_live) {  // wg_tiles >= 1
      float alpha[2];
      ring_barrier(0);
      wgmma_fence();
      issue_s(0);
      copies(0, kFirst);
      wgmma_wait<0>();
      fence_regs(s);
      softmax(0, alpha);
      rescale_and_pack(alpha);
      for (n = 1; n < wg_tiles; ++n) {
        ring_barrier(n);
        fence_regs(o);
        fence_regs(pa);
        wgmma_fence();
        issue_s(n);
        issue_pv(n - 1);
        copies(n, kFirst);
        wgmma_wait<1>();
        fence_regs(s);
        softmax(n, alpha);
        fence_softmax(alpha);
        wgmma_wait<0>();
        fence_regs(o);
        fence_regs(pa);
        rescale_and_pack(alpha);
      }
      ring_barrier(n);
      fence_regs(o);
      fence_regs(pa);
      wgmma_fence();
      issue_pv(n - 1);
      copies(n, kFirst);
      wgmma_wait<0>();
      fence_regs(o);
      ++n;
    }
    for (; n <= n_tiles; ++n) {  // the block's other warpgroup still reads tiles: keep the ring going
      ring_barrier(n);
      copies(n, kAny);
    }

    if (wg_live) {
      store_rows(o, l_run, static_cast<T*>(p.out), wg_row0 + b.warp * 16 + b.g, it.rows, it.q_start, group, it.kvh,
                 p.out_token_stride, b.t);
    }
  }
  cp_async_wait<0>();  // no copy may still target shared memory when the block exits
#endif
}

// Row blocks per band of the items' order (item_at): at least 4, the GQA group's rows per position
// where larger (a band then covers 128 positions of a pair), at most all of them.
inline int band_for(int group, int m_blocks) { return std::max(1, std::min(m_blocks, std::max(4, group))); }

// The in-step kernel: both warpgroups in step, every thread copying key tile n + 2 and value tile
// n + 1 after barrier n; grid (row blocks of the longest sequence, KV heads, sequences), the row
// blocks with the most keys launched first.
template <typename T>
__global__ void __launch_bounds__(kThreads, 1) paged_prefill_wgmma_kernel(const PagedPrefillParams p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  const int seq = blockIdx.z;
  const int kvh = blockIdx.y;
  const int group = p.num_heads / p.num_kv_heads;
  const int q_start = p.query_start_loc[seq];
  const int new_tokens = p.query_start_loc[seq + 1] - q_start;
  const int rows = new_tokens * group;
  const int m0 = (gridDim.x - 1 - blockIdx.x) * kRows;
  if (m0 >= rows) return;
  const int ctx = p.context_lens[seq];
  const int cached = ctx - new_tokens;
  const int kv_end = cached + (min(m0 + kRows, rows) - 1) / group + 1;  // keys any row of the block sees
  const int n_tiles = (kv_end + kKeys - 1) / kKeys;

  extern __shared__ __align__(1024) unsigned char wgmma_smem[];
  const BlockSetup b(wgmma_smem);
  const int wg_row0 = m0 + b.wgi * 64;  // the warpgroup's first packed row
  const bool wg_live = wg_row0 < rows;
  const int wg_first_pos = cached + wg_row0 / group;
  const int wg_kv_end = wg_live ? cached + (min(wg_row0 + 64, rows) - 1) / group + 1 : 0;
  const int wg_tiles = (wg_kv_end + kKeys - 1) / kKeys;
  {
    const T* q = static_cast<const T*>(p.query);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int R = m0 + b.c_row0 + 16 * i;
      const bool live = R < rows;
      const T* src = q;
      if (live) src = q + (q_start + R / group) * p.q_token_stride + static_cast<int64_t>(kvh * group + R % group) * kHead + b.c_chunk * 8;
      cp_async16(b.smem_ptr + (b.q_smem - b.smem) + tile_offset<kRows>(b.c_row0 + 16 * i, b.c_chunk), src, live);
    }
  }
  const int* table = p.block_tables + static_cast<int64_t>(seq) * p.max_blocks_per_seq;
  const T* kc = static_cast<const T*>(p.key_cache) + kvh * p.k_head_stride + b.c_chunk * 8;
  const T* vc = static_cast<const T*>(p.value_cache) + kvh * p.v_head_stride + b.c_chunk * 8;
  const int bs_mask = (1 << p.block_size_log2) - 1;
  // The block ids of tile m's keys (entry e: keys e * block_size .. of the tile; -1 past the
  // block's keys) sit in slot m % kIdSlots of a shared-memory ring, copied four iterations ahead
  // of the key tile's copies, so that no copy waits on a read of the table.
  int* const ids = reinterpret_cast<int*>(b.smem_ptr + (b.id_ring - b.smem));
  auto copy_ids = [&](int tile, bool async) {
    if (b.tid < kIdsPerTile) {
      const int first = (tile * kKeys) >> p.block_size_log2;
      const int key = (first + b.tid) << p.block_size_log2;
      int* const dst = ids + (tile % kIdSlots) * kIdsPerTile + b.tid;
      const bool live = tile < n_tiles && key < kv_end && key < (tile + 1) * kKeys;
      if (!live) {
        *dst = -1;
      } else if (async) {
        asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(static_cast<uint32_t>(__cvta_generic_to_shared(dst))),
                     "l"(table + first + b.tid)
                     : "memory");
      } else {
        *dst = __ldg(table + first + b.tid);
      }
    }
  };
  // One tile of keys (which = 0) or values (1) into its ring stage (copy_rows).
  const char* const k_bytes = reinterpret_cast<const char*>(kc);
  const char* const v_bytes = reinterpret_cast<const char*>(vc);
  const int k_block_bytes = static_cast<int>(p.k_block_stride * 2), k_token_bytes = static_cast<int>(p.k_token_stride * 2);
  const int v_block_bytes = static_cast<int>(p.v_block_stride * 2), v_token_bytes = static_cast<int>(p.v_token_stride * 2);
  auto load_tile = [&](int tile, int which) {
    const char* const base = which ? v_bytes : k_bytes;
    const int block_bytes = which ? v_block_bytes : k_block_bytes;
    const int token_bytes = which ? v_token_bytes : k_token_bytes;
    const uint32_t dst = (which ? b.v_ring : b.k_ring) + (tile % kStages) * kTileBytes + b.c_off - b.smem;
    const int* const tile_ids = ids + (tile % kIdSlots) * kIdsPerTile;
    const int key0 = tile * kKeys + b.c_row0;
    const int left = kv_end - key0;  // rows i with 16 i < left hold keys of the block
    copy_rows<16>(b.smem_ptr + dst, tile_ids, b.c_row0, 0, key0, left, base, block_bytes, token_bytes, p, bs_mask);
  };
#pragma unroll
  for (int m = 0; m < 4; ++m) copy_ids(m, false);
  __syncthreads();
  load_tile(0, 0);
  cp_async_commit();  // the Q rows and key tile 0
  if (n_tiles > 1) load_tile(1, 0);
  load_tile(0, 1);
  cp_async_commit();  // key tile 1, value tile 0

  const float scale2 = p.scale * kLog2e;
  float o[64];
  float s[64];
  uint32_t pa[32];
  float m_run[2], l_run[2];
  int qpos[2];
  start_rows(o, pa, m_run, l_run, qpos, cached, wg_row0 + b.warp * 16 + b.g, rows, group);

  const uint64_t q_desc = smem_desc(b.q_smem + b.wgi * 64 * kHalfRow, 16, 1024);
  const uint64_t k_desc = smem_desc(b.k_ring, 16, 1024);
  // V is N-major: its leading byte offset steps between the two halves of 64 head dims, its stride
  // byte offset between groups of 8 keys (Q's and K's leading offsets are unused: K-major, swizzled)
  const uint64_t v_desc = smem_desc(b.v_ring, kKeys * kHalfRow, 1024);

  // The ring's barrier: this thread's copies of key tile n and value tile n - 1 landed and are
  // visible to the tensor cores' reads, for every thread; every warpgroup is done with key tile
  // n - 1 and value tile n - 2, whose stages the copies issued next refill.
  auto ring_barrier = [&]() {
    cp_async_wait<1>();
    fence_proxy_async();
    __syncthreads();
  };
  // copies of key tile n + 2 and value tile n + 1, issued while the products of tile n run
  auto copies = [&](int n) {
    if (n + 2 < n_tiles) load_tile(n + 2, 0);
    if (n + 1 < n_tiles) load_tile(n + 1, 1);
    copy_ids(n + 4, true);
    cp_async_commit();
  };
  auto issue_s = [&](int n) { tile_issue_s<T>(s, q_desc, k_desc + (((n % kStages) * kTileBytes) >> 4)); };
  auto issue_pv = [&](int n) { tile_issue_pv<T>(o, pa, v_desc + (((n % kStages) * kTileBytes) >> 4)); };
  auto softmax = [&](int n, float (&alpha)[2]) {
    tile_softmax(s, m_run, l_run, alpha, n, scale2, wg_first_pos, b.t, qpos);
  };
  auto rescale_and_pack = [&](const float (&alpha)[2]) { tile_rescale_and_pack<T>(o, pa, s, alpha); };

  int n = 0;
  if (wg_live) {  // wg_tiles >= 1
    float alpha[2];
    ring_barrier();
    wgmma_fence();
    issue_s(0);
    copies(0);
    wgmma_wait<0>();
    fence_regs(s);
    softmax(0, alpha);
    rescale_and_pack(alpha);
    for (n = 1; n < wg_tiles; ++n) {
      ring_barrier();
      fence_regs(o);
      fence_regs(pa);
      wgmma_fence();
      issue_s(n);
      issue_pv(n - 1);
      copies(n);
      wgmma_wait<1>();
      fence_regs(s);
      softmax(n, alpha);
      wgmma_wait<0>();
      fence_regs(o);
      fence_regs(pa);
      rescale_and_pack(alpha);
    }
    ring_barrier();
    fence_regs(o);
    fence_regs(pa);
    wgmma_fence();
    issue_pv(n - 1);
    copies(n);
    wgmma_wait<0>();
    fence_regs(o);
    ++n;
  }
  for (; n <= n_tiles; ++n) {  // the block's other warpgroup still reads tiles: keep the ring going
    ring_barrier();
    copies(n);
  }
  cp_async_wait<0>();  // no copy may still target shared memory when the block exits

  if (!wg_live) return;
  store_rows(o, l_run, static_cast<T*>(p.out), wg_row0 + b.warp * 16 + b.g, rows, q_start, group, kvh,
             p.out_token_stride, b.t);
#endif
}

// The launch rule: the ping-pong kernel where a new token sees, on average over a sequence of
// max_query_len new tokens, kPingPongKeys[0] to kPingPongKeys[1] keys and a sequence fills a block's
// rows; the in-step kernel otherwise (long contexts, short sequences, few rows).
constexpr int kPingPongKeys[2] = {512, 4096};
inline bool pingpong_applies(const PagedPrefillParams& p) {
  const int64_t keys = static_cast<int64_t>(p.max_context_len) - p.max_query_len / 2;
  const int64_t rows = static_cast<int64_t>(p.max_query_len) * (p.num_heads / p.num_kv_heads);
  return keys >= kPingPongKeys[0] && keys < kPingPongKeys[1] && rows >= kRows;
}

// What the warpgroup kernels run (head size 128, no ALiBi, cache strides whose byte offsets within a
// block fit the kernels' 32 bits), cudaErrorInvalidValue otherwise; m_blocks: the row blocks of the longest
// sequence.
inline cudaError_t row_blocks(const PagedPrefillParams& p, int64_t& m_blocks) {
  if (p.head_size != kHead || p.alibi_slopes != nullptr) return cudaErrorInvalidValue;
  for (const int64_t stride : {p.k_block_stride, p.k_token_stride, p.v_block_stride, p.v_token_stride}) {
    if (stride < 0 || stride > 0x3fffffff) return cudaErrorInvalidValue;
  }
  // a key's byte offset within its block, (key % block_size) * token bytes, is a 32-bit product
  if ((int64_t{1} << p.block_size_log2) * 2 * std::max(p.k_token_stride, p.v_token_stride) > 0x7fffffff) {
    return cudaErrorInvalidValue;
  }
  m_blocks = (static_cast<int64_t>(p.max_query_len) * (p.num_heads / p.num_kv_heads) + kRows - 1) / kRows;
  return cudaSuccess;
}

template <typename T>
cudaError_t launch(const PagedPrefillParams& p, cudaStream_t stream) {
  int64_t m_blocks = 0;
  if (row_blocks(p, m_blocks) != cudaSuccess) return cudaErrorInvalidValue;
  if (m_blocks == 0) return cudaSuccess;
  const int group = p.num_heads / p.num_kv_heads;
  if (m_blocks > 0x7fffffff || p.num_kv_heads > 65535 || p.num_seqs > 65535) return cudaErrorInvalidValue;
  if (pingpong_applies(p)) {
    const int64_t items = m_blocks * p.num_seqs * p.num_kv_heads;
    if (items > 0x7fffffff) return cudaErrorInvalidValue;
    auto* kernel = paged_prefill_wgmma_pingpong_kernel<T>;
    cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
    if (err != cudaSuccess) return err;
    kernel<<<static_cast<unsigned>(items), kThreads, kSmemBytes, stream>>>(p, static_cast<int>(m_blocks),
                                                                          band_for(group, static_cast<int>(m_blocks)));
    return cudaGetLastError();
  }
  auto* kernel = paged_prefill_wgmma_kernel<T>;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
  if (err != cudaSuccess) return err;
  const dim3 grid(static_cast<unsigned>(m_blocks), p.num_kv_heads, p.num_seqs);
  kernel<<<grid, kThreads, kSmemBytes, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace wg
}  // namespace prefill
}  // namespace blocksim
