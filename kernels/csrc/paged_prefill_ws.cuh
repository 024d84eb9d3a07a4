// Paged prefill attention on Hopper, warp-specialized and persistent (config kPrefillWs, sm_90a):
// float16 and bfloat16 at head size 128, the tile math of paged_prefill_wgmma.cuh (wgmma products,
// the online softmax, the 128-byte-swizzled tiles) under FlashAttention-3's schedule.
//
// A persistent grid of thread blocks of three warpgroups (384 threads, one block per SM) takes
// work items in turn: the items of paged_prefill_wgmma.cuh's item_at order (128 packed rows of one
// (sequence, KV head) pair, the band with the most keys first) dealt out in rounds that alternate
// direction (Schedule).
//
// - The producer warpgroup (setmaxnreg down to kProducerRegs) only copies: for each item key
//   tile 0, then key tile n + 1 and value tile n in turn, then the next item's Q rows (Q has two
//   buffers, so they land under this item's products). The Q rows go by TMA: one thread loads
//   each 64-row block of the item as two boxes of 64 head dims through a tensor map of the query
//   (the same geometry as the output's below), its bytes counted on the Q buffer's full mbarrier.
//   Key and value tiles whose keys are all new tokens of the sequence come by TMA from the new
//   tokens' own keys and values where the call gives them (two boxes of 64 head dims by 128
//   tokens a tile); with them, the next item's Q rows are copied after the first tile pair.
//   The other key and value tiles go into ring stages of
//   shared memory with cp.async, gathering every 16-byte chunk of a key or value row through the
//   block table (the tile's block ids are read one per lane and shuffled to the rows). Chunks past
//   the item's keys or of a block id outside the cache are zero-filled without reading memory, so
//   unused cache slots never reach the products. A stage is handed over by an mbarrier ("full"):
//   each producer thread's cp.async.mbarrier.arrive fires once its copies have landed. It waits on
//   the stage's "empty" mbarrier before refilling it.
// - Two consumer warpgroups (setmaxnreg up to kConsumerRegs), 64 of the item's rows each, run the
//   products and the softmax: per key tile n, S_n = Q K_n^T issued together with
//   O += P_{n-1} V_{n-1}; the softmax of S_n under that product; then the rescale of O and the
//   packing of P_n. Each warp arrives on a stage's empty mbarrier as soon as the products reading
//   it have completed, and on its Q buffer's once the item's last S product has (or, for rows
//   stored by TMA, after the store below).
//   The two consumers take turns at the tensor cores (two named barriers, FlashAttention-3's
//   warp-scheduler barriers): each issues its products of a tile only after the other has issued
//   its own, so that one's softmax runs under the other's products. A consumer whose rows see
//   fewer key tiles than the item's (a GQA item's first rows, or rows past the sequence's end)
//   takes its turns on the remaining tiles without products, so that the turns stay paired.
//   At an item's end a consumer whose 64 rows all lie within the sequence normalises them into
//   its half of the item's Q buffer (the products that read it have completed; the same 128-byte
//   swizzle as the tiles) and one thread stores them with two TMA stores (64 head dims each)
//   through a tensor map of the output; that thread releases the Q buffer once the stores have
//   read it (cp.async.bulk.wait_group.read), so the producer's next copy of Q never waits on
//   global stores. Rows of an item's last, partial 64 go through each warp's own staging area as
//   whole 256-byte rows (wg::store_rows_staged; the wrapper hands the kernel a 16-byte aligned
//   output). Where a tensor map cannot describe the query or the output (a GQA group that does not
//   divide 64, a token stride off 16 bytes), Q is copied with cp.async, 16 bytes a thread, and
//   every output row is staged.
//
// The tiles the cp.async copies fill are written by the generic proxy; each consumer thread
// orders them before its products' reads (the async proxy) with fence.proxy.async after its wait.
#pragma once

#include <cuda.h>          // CUtensorMap
#include <cudaTypedefs.h>  // the tensor-map encoder's signature

#include <type_traits>  // std::integral_constant: the copy loop's rows per block id

#include "paged_prefill_wgmma.cuh"

namespace blocksim {
namespace prefill {
namespace ws {

using wg::kHalfRow;
using wg::kHead;
using wg::kKeys;
using wg::kQBytes;
using wg::kRows;
using wg::kTileBytes;

constexpr int kKStages = 2;         // ring stages of key tiles
constexpr int kVStages = 2;         // ring stages of value tiles
constexpr int kQStages = 2;         // Q buffers: the next item's rows copied under this item's tiles
constexpr int kThreads = 384;       // the producer warpgroup and two consumer warpgroups
constexpr int kProducerRegs = 40;
constexpr int kConsumerRegs = 232;
// The consumers' raise comes out of what the producer gives back of the block's launch registers
// (65536 / 384 rounded down to a multiple of 8: 168 a thread), not out of the SM's spare ones: a
// raise beyond that waits for ever in setmaxnreg. Here 128 * (168 - 40) = 256 * (232 - 168).
static_assert(128 * kProducerRegs + 256 * kConsumerRegs <= 384 * 168, "setmaxnreg beyond the block's registers");
constexpr int kConsumerWarps = 8;
// mbarriers: full and empty per stage of each ring and per Q buffer
constexpr int kBarriers = 2 * (kKStages + kVStages + kQStages);
// each consumer warp's output rows, staged before they are stored as whole rows
constexpr int kOutWarpBytes = 16 * kHead * 2;
// after the mbarriers, one slot per Q buffer: the item the producer copied that buffer's rows for
// (wg::Item, 32 bytes), which the consumers read instead of running the Schedule themselves
constexpr int kBarBytes = 128;
constexpr int kItemBytes = 32;
static_assert(kBarriers * 8 <= kBarBytes && sizeof(wg::Item) == kItemBytes, "mbarriers and item slots");
// the item slots are read and written as 16-byte vectors: their offset from the 1024-aligned base
static_assert((kQStages * kQBytes + (kKStages + kVStages) * kTileBytes + kConsumerWarps * kOutWarpBytes + kBarBytes) %
                      16 == 0 && kItemBytes % 16 == 0,
              "16-byte aligned item slots");
constexpr int kSmemBytes = kQStages * kQBytes + (kKStages + kVStages) * kTileBytes + kConsumerWarps * kOutWarpBytes +
                           kBarBytes + kQStages * kItemBytes + 1024;  // + alignment slack
static_assert(kSmemBytes <= 227 * 1024, "shared memory of one block");
// named barriers (0 is __syncthreads): the consumers' turns at the tensor cores
constexpr int kTurnBarrier0 = 1;
constexpr int kStoreBarrier0 = 3;  // each consumer's 128 threads before its TMA store

// The block's items: item_at's order dealt out in rounds of one item per block, the rounds
// alternating direction (block b takes item b of round 0, grid - 1 - b of round 1, ...), so that
// each block's items add up to about the same work where the row blocks of a band have decreasing
// keys; items past a sequence's rows, or with no keys (a context shorter than its new tokens, which only
// validate=False lets through), are skipped. Only the producer walks it: it hands each item to the
// consumers with the item's Q rows (the Q buffer's item slot), so that item_at's divisions and reads
// run once an item, under the copies, and not at each consumer's item start.
struct Schedule {
  int round = -1;
  // The next item's index and, in `it`, the item (-1 and n_tiles 0 past the block's last)
  __device__ __forceinline__ int next(const PagedPrefillParams& p, int num_items, int pairs, int m_blocks, int band,
                                      int group, wg::Item& it) {
    for (;;) {
      ++round;
      if (round * static_cast<int>(gridDim.x) >= num_items) {
        it.n_tiles = 0;
        return -1;
      }
      const int b = (round & 1) ? gridDim.x - 1 - blockIdx.x : blockIdx.x;
      const int idx = round * gridDim.x + b;
      if (idx >= num_items) continue;
      it = wg::item_at(p, idx, pairs, m_blocks, band, group);
      if (it.m0 < it.rows && it.n_tiles > 0) return idx;  // no tiles: lengths that contradict each other
    }
  }
};

__device__ __forceinline__ void mbar_init(uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  uint32_t done;
  do {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!done);
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(bar) : "memory");
}
// Arrives on the mbarrier once every cp.async this thread issued before has landed (counted as one
// of the barrier's expected arrivals).
__device__ __forceinline__ void cp_async_arrive(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void named_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void cp_async16s(uint32_t dst, const void* src, bool live) {
  asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(live ? 16 : 0)
               : "memory");
}

// Arrives `count` times on the mbarrier.
__device__ __forceinline__ void mbar_arrive_count(uint32_t bar, uint32_t count) {
  asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0], %1;\n}\n" ::"r"(bar), "r"(count) : "memory");
}
// The box of the output's tensor map at (c0, c1, c2) stored from shared memory at src (TMA).
__device__ __forceinline__ void tma_store_3d(const CUtensorMap* map, uint32_t src, int c0, int c1, int c2) {
  asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%1, %2, %3}], [%4];\n" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(c0), "r"(c1), "r"(c2), "r"(src)
               : "memory");
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}

// The bytes the mbarrier's current phase waits for besides its arrivals (the tensor copies below).
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
// The box of a tensor map at (c0, c1, c2) into shared memory at dst (TMA), its bytes counted on
// the mbarrier; a box's part past the tensor's bounds lands as zeros.
__device__ __forceinline__ void tma_load_3d(uint32_t dst, const CUtensorMap* map, int c0, int c1, int c2, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
      : "memory");
}

// A ring position: stage and the parity of its use (uses counted over the block's whole run, so the
// producer and the consumers, which take the same items and tiles, agree).
template <int STAGES>
struct RingPos {
  int stage = 0;
  uint32_t phase = 0;
  __device__ __forceinline__ void advance() {
    if (++stage == STAGES) {
      stage = 0;
      phase ^= 1u;
    }
  }
};

template <typename T>
__global__ void __launch_bounds__(kThreads, 1) paged_prefill_ws_kernel(const PagedPrefillParams p, const int m_blocks,
                                                                       const int band, const int num_items,
                                                                       const __grid_constant__ CUtensorMap out_map,
                                                                       const __grid_constant__ CUtensorMap q_map,
                                                                       const __grid_constant__ CUtensorMap kn_map,
                                                                       const __grid_constant__ CUtensorMap vn_map,
                                                                       const bool tma_rows, const bool tma_new) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ __align__(1024) unsigned char ws_smem[];
  const int group = p.num_heads / p.num_kv_heads;
  const int pairs = p.num_seqs * p.num_kv_heads;
  const int tid = threadIdx.x;
  const int wgi = tid / 128;
  const uint32_t smem_raw = static_cast<uint32_t>(__cvta_generic_to_shared(ws_smem));
  const uint32_t smem = (smem_raw + 1023) & ~1023u;
  const uint32_t q_smem = smem;
  const uint32_t k_ring = smem + kQStages * kQBytes;
  const uint32_t v_ring = k_ring + kKStages * kTileBytes;
  const uint32_t o_stage = v_ring + kVStages * kTileBytes;
  const uint32_t bars = o_stage + kConsumerWarps * kOutWarpBytes;
  auto k_full = [&](int s) { return bars + 8 * s; };
  auto k_empty = [&](int s) { return bars + 8 * (kKStages + s); };
  auto v_full = [&](int s) { return bars + 8 * (2 * kKStages + s); };
  auto v_empty = [&](int s) { return bars + 8 * (2 * kKStages + kVStages + s); };
  auto q_full = [&](int s) { return bars + 8 * (2 * (kKStages + kVStages) + s); };
  auto q_empty = [&](int s) { return bars + 8 * (2 * (kKStages + kVStages) + kQStages + s); };
  auto item_slot = [&](int s) { return bars + kBarBytes + kItemBytes * s; };
  if (tid == 0) {
    for (int s = 0; s < kKStages; ++s) {
      mbar_init(k_full(s), 128);
      mbar_init(k_empty(s), kConsumerWarps);
    }
    for (int s = 0; s < kVStages; ++s) {
      mbar_init(v_full(s), 128);
      mbar_init(v_empty(s), kConsumerWarps);
    }
    for (int s = 0; s < kQStages; ++s) {
      mbar_init(q_full(s), 129);  // the producer's 128 threads, and its thread 0 once more for the item slot
      mbar_init(q_empty(s), kConsumerWarps);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();

  if (wgi == 0) {
    // ---- producer ----
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kProducerRegs));
    const int lane = tid & 31;
    const int chunk = tid & 15;     // the 16-byte chunk of a row this thread copies
    const int row0 = tid >> 4;      // rows row0 + 8 i, i = 0..15, of a 128-row tile
    // swizzled offset of the thread's chunk in row row0 (the same in rows row0 + 8 i, plus i rows)
    const uint32_t c_off = static_cast<uint32_t>((chunk >> 3) * kKeys * kHalfRow + row0 * kHalfRow +
                                                 (((chunk & 7) ^ row0) << 4));
    const uint32_t q_off = static_cast<uint32_t>((chunk >> 3) * kRows * kHalfRow + row0 * kHalfRow +
                                                 (((chunk & 7) ^ row0) << 4));
    const int bs_log2 = p.block_size_log2;
    const int bs_mask = (1 << bs_log2) - 1;
    const int k_block_bytes = static_cast<int>(p.k_block_stride * 2), k_token_bytes = static_cast<int>(p.k_token_stride * 2);
    const int v_block_bytes = static_cast<int>(p.v_block_stride * 2), v_token_bytes = static_cast<int>(p.v_token_stride * 2);
    RingPos<kKStages> kpos;
    RingPos<kVStages> vpos;
    RingPos<kQStages> qring;
    // The item `it` into the next Q buffer's item slot (thread 0, released to the consumers by an
    // arrival of its own on the buffer's full barrier), and, unless it is the end (n_tiles 0), its Q
    // rows into the buffer: packed row R = m0 + row0 + 8 i is new token R / group of query head
    // kvh * group + R % group.
    auto copy_q = [&](const wg::Item& it) {
      mbar_wait(q_empty(qring.stage), qring.phase ^ 1u);
      if (tid == 0) {
        asm volatile("st.shared.v4.s32 [%0], {%1, %2, %3, %4};\n" ::"r"(item_slot(qring.stage)), "r"(it.seq),
                     "r"(it.kvh), "r"(it.m0), "r"(it.rows)
                     : "memory");
        asm volatile("st.shared.v4.s32 [%0], {%1, %2, %3, %4};\n" ::"r"(item_slot(qring.stage) + 16), "r"(it.q_start),
                     "r"(it.cached), "r"(it.kv_end), "r"(it.n_tiles)
                     : "memory");
        mbar_arrive(q_full(qring.stage));
      }
      if (it.n_tiles <= 0) {  // the end of the block's items: no rows to copy
        mbar_arrive(q_full(qring.stage));
        qring.advance();
        return;
      }
      if (tma_rows) {
        // the item's 64-row blocks that hold rows of the sequence, each as two boxes of 64 head
        // dims by TMA (rows of a block past the sequence's end load other tokens or zeros: their
        // outputs are never stored)
        const uint32_t dst = q_smem + qring.stage * kQBytes;
        if (tid == 0) {
          const int blocks = min(2, (it.rows - it.m0 + 63) / 64);
          mbar_expect_tx(q_full(qring.stage), static_cast<uint32_t>(blocks * 64 * kHead * 2));
          for (int h = 0; h < blocks; ++h) {
            const int tok = it.q_start + (it.m0 + 64 * h) / group;
            tma_load_3d(dst + h * 64 * kHalfRow, &q_map, 0, it.kvh * group, tok, q_full(qring.stage));
            tma_load_3d(dst + kRows * kHalfRow + h * 64 * kHalfRow, &q_map, 64, it.kvh * group, tok, q_full(qring.stage));
          }
        }
        mbar_arrive(q_full(qring.stage));
        qring.advance();
        return;
      }
      const T* const q_base = static_cast<const T*>(p.query) + chunk * 8;
#pragma unroll 4
      for (int i = 0; i < kRows / 8; ++i) {
        const int R = it.m0 + row0 + 8 * i;
        const bool live = R < it.rows;
        const T* src = q_base;
        if (live) src = q_base + (it.q_start + R / group) * p.q_token_stride + static_cast<int64_t>(it.kvh * group + R % group) * kHead;
        cp_async16s(q_smem + qring.stage * kQBytes + q_off + 8 * i * kHalfRow, src, live);
      }
      cp_async_arrive(q_full(qring.stage));
      qring.advance();
    };
    Schedule sched;
    // the item being copied, and the next one, computed and its Q rows copied during the item's
    // tiles (q_after)
    wg::Item it{}, nxt{};
    int idx = sched.next(p, num_items, pairs, m_blocks, band, group, it);
    copy_q(it);  // or the end
    while (idx >= 0) {
      const int* const table = p.block_tables + static_cast<int64_t>(it.seq) * p.max_blocks_per_seq;
      // Tiles [tma_first, tma_end) by TMA from the new tokens' keys and values: those whose keys are
      // all new and all the sequence's own (a tile past the sequence's last key would read the next
      // sequence's rows, whose values may be anything; it goes through the table, zero-filled)
      const int tma_first = tma_new ? (it.cached + kKeys - 1) / kKeys : 0;
      const int tma_end = tma_new ? (it.cached + it.rows / group) / kKeys : 0;
      auto by_tma = [&](int n) { return n >= tma_first && n < tma_end; };
      // the block id of tile n's e-th block (lane e holds it; -1 past the item's keys)
      auto tile_ids = [&](int n) {
        const int first = (n * kKeys) >> bs_log2;
        const int key = (first + lane) << bs_log2;
        const bool live = n < it.n_tiles && key < it.kv_end && key < (n + 1) * kKeys &&
                          !by_tma(n);  // a tile by TMA reads no ids
        return live ? __ldg(table + first + lane) : -1;
      };
      const char* const k_base = reinterpret_cast<const char*>(static_cast<const T*>(p.key_cache) +
                                                               it.kvh * p.k_head_stride + chunk * 8);
      const char* const v_base = reinterpret_cast<const char*>(static_cast<const T*>(p.value_cache) +
                                                               it.kvh * p.v_head_stride + chunk * 8);
      // key (which 0) or value (1) tile n into the tile at dst_tile; ids: tile_ids(n)
      auto copy_tile = [&](int n, int ids, uint32_t dst_tile, int which) {
        const char* const base = which ? v_base : k_base;
        const int block_bytes = which ? v_block_bytes : k_block_bytes;
        const int token_bytes = which ? v_token_bytes : k_token_bytes;
        const int key0 = n * kKeys;
        const int first = key0 >> bs_log2;
        // rows row0 + 8 i (row0 < 8), R at a time with one block id and one address for the R copies:
        // R = 2 when blocks hold 16 keys or more (they start at multiples of 16, so rows row0 + 16 j
        // and row0 + 16 j + 8 lie in one block), else 1
        auto copy_rows = [&](auto rows_per_id) {
          constexpr int R = decltype(rows_per_id)::value;
#pragma unroll 4
          for (int j = 0; j < kKeys / (8 * R); ++j) {
            const int key = key0 + row0 + 8 * R * j;
            const int bid = __shfl_sync(0xffffffffu, ids, ((key >> bs_log2) - first) & 31);
            const bool ok = static_cast<unsigned>(bid) < static_cast<unsigned>(p.num_blocks);
            int64_t off;
            asm("mul.wide.s32 %0, %1, %2;\n" : "=l"(off) : "r"(ok ? bid : 0), "r"(block_bytes));
            const char* const src = base + off + (key & bs_mask) * token_bytes;
#pragma unroll
            for (int r = 0; r < R; ++r)
              cp_async16s(dst_tile + c_off + 8 * (R * j + r) * kHalfRow, src + 8 * r * token_bytes,
                          ok && key + 8 * r < it.kv_end);
          }
        };
        if (bs_log2 >= 4)
          copy_rows(std::integral_constant<int, 2>{});
        else
          copy_rows(std::integral_constant<int, 1>{});
      };
      // Tile n from the new tokens' own keys or values (`map`) by TMA (`by_tma`): two boxes of 64
      // head dims by 128 tokens, in the tiles' 128-byte swizzle. Keys of the tile past the item's
      // rows' positions are the sequence's own later tokens, which the causal mask gives no weight.
      // The stage may last have been filled by cp.async (the generic proxy): the proxy fence orders
      // those writes before the tensor copy's.
      auto tma_tile = [&](int n, uint32_t dst_tile, const CUtensorMap* map, uint32_t bar) {
        if (tid == 0) {
          asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
          mbar_expect_tx(bar, static_cast<uint32_t>(kTileBytes));
          const int tok = it.q_start + n * kKeys - it.cached;
          tma_load_3d(dst_tile, map, 0, it.kvh, tok, bar);
          tma_load_3d(dst_tile + kKeys * kHalfRow, map, 64, it.kvh, tok, bar);
        }
        mbar_arrive(bar);
      };
      auto copy_k = [&](int n, int ids) {
        mbar_wait(k_empty(kpos.stage), kpos.phase ^ 1u);
        if (by_tma(n)) {
          tma_tile(n, k_ring + kpos.stage * kTileBytes, &kn_map, k_full(kpos.stage));
        } else {
          copy_tile(n, ids, k_ring + kpos.stage * kTileBytes, 0);
          cp_async_arrive(k_full(kpos.stage));
        }
        kpos.advance();
      };
      auto copy_v = [&](int n, int ids) {
        mbar_wait(v_empty(vpos.stage), vpos.phase ^ 1u);
        if (by_tma(n)) {
          tma_tile(n, v_ring + vpos.stage * kTileBytes, &vn_map, v_full(vpos.stage));
        } else {
          copy_tile(n, ids, v_ring + vpos.stage * kTileBytes, 1);
          cp_async_arrive(v_full(vpos.stage));
        }
        vpos.advance();
      };
      // key tile 0, then key tile n + 1 and value tile n in turn (the order the consumers read
      // them in)
      int ids_cur = tile_ids(0);
      copy_k(0, ids_cur);
      // the next item and its Q rows after the first tile pair where the new keys come by TMA, else
      // after the last (measured faster each way: kernels/DESIGN.md, "Producer")
      const int q_after = tma_new ? 0 : it.n_tiles - 1;
      int nidx = -1;
      for (int n = 0; n < it.n_tiles; ++n) {
        const int ids_next = tile_ids(n + 1);
        if (n + 1 < it.n_tiles) copy_k(n + 1, ids_next);
        copy_v(n, ids_cur);
        ids_cur = ids_next;
        if (n == q_after) {
          nidx = sched.next(p, num_items, pairs, m_blocks, band, group, nxt);
          copy_q(nxt);  // or the end
        }
      }
      idx = nidx;
      it = nxt;
    }
    asm volatile("cp.async.wait_all;\n" ::: "memory");  // no copy may still target shared memory when the block exits
  } else {
    // ---- consumers ----
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kConsumerRegs));
    const int cw = wgi - 1;            // consumer 0 or 1: rows 64 cw .. of each item
    const int ctid = tid - 128;
    const int warp = (ctid / 32) % 4;  // warp in the warpgroup
    const int lane = tid & 31;
    const int g = lane >> 2, t = lane & 3;
    const float scale2 = p.scale * kLog2e;
    const uint64_t q_desc0 = wg::smem_desc(q_smem + cw * 64 * kHalfRow, 16, 1024);
    const uint64_t k_desc = wg::smem_desc(k_ring, 16, 1024);
    const uint64_t v_desc = wg::smem_desc(v_ring, kKeys * kHalfRow, 1024);
    const int own_turn = kTurnBarrier0 + cw, other_turn = kTurnBarrier0 + 1 - cw;
    if (cw == 1) named_arrive(kTurnBarrier0, 256);  // the first consumer goes first
    RingPos<kKStages> kpos;
    RingPos<kVStages> vpos;
    RingPos<kQStages> qring;
    auto release = [&](uint32_t bar) {
      if (lane == 0) mbar_arrive(bar);
    };
    for (;;) {
      const int q_stage = qring.stage;
      mbar_wait(q_full(q_stage), qring.phase);
      qring.advance();
      // the item the producer copied this buffer's rows for (n_tiles 0: the block's items are done)
      wg::Item it;
      asm volatile("ld.shared.v4.s32 {%0, %1, %2, %3}, [%4];\n"
                   : "=r"(it.seq), "=r"(it.kvh), "=r"(it.m0), "=r"(it.rows)
                   : "r"(item_slot(q_stage))
                   : "memory");
      asm volatile("ld.shared.v4.s32 {%0, %1, %2, %3}, [%4];\n"
                   : "=r"(it.q_start), "=r"(it.cached), "=r"(it.kv_end), "=r"(it.n_tiles)
                   : "r"(item_slot(q_stage) + 16)
                   : "memory");
      if (it.n_tiles <= 0) break;
      const int n_tiles = it.n_tiles;
      const int wg_row0 = it.m0 + cw * 64;
      const int wg_first_pos = it.cached + wg_row0 / group;
      const int wg_kv_end = wg_row0 < it.rows ? it.cached + (min(wg_row0 + 64, it.rows) - 1) / group + 1 : 0;
      const bool wg_live = wg_kv_end > 0;  // rows, and keys they see (lengths that contradict each other see none)
      const int wg_tiles = (wg_kv_end + kKeys - 1) / kKeys;  // <= n_tiles
      // all 64 rows within the sequence: stored by TMA from this item's Q buffer, which is released
      // once the store has read it (not at the last S)
      const bool tma_item = tma_rows && wg_row0 + 64 <= it.rows;
      const uint64_t q_desc = q_desc0 + ((q_stage * kQBytes) >> 4);
      int n = 0;
      if (wg_live) {
        float o[64];
        float s[64];
        uint32_t pa[32];
        float m_run[2], l_run[2], alpha[2];
        int qpos[2];
        wg::start_rows(o, pa, m_run, l_run, qpos, it.cached, wg_row0 + warp * 16 + g, it.rows, group);
        // tile 0: S_0 alone
        mbar_wait(k_full(kpos.stage), kpos.phase);
        wg::fence_proxy_async();
        named_sync(own_turn, 256);
        wg::wgmma_fence();
        wg::tile_issue_s<T>(s, q_desc, k_desc + ((kpos.stage * kTileBytes) >> 4));
        named_arrive(other_turn, 256);
        wg::wgmma_wait<0>();
        wg::fence_regs(s);
        release(k_empty(kpos.stage));
        kpos.advance();
        if (wg_tiles == 1 && !tma_item) release(q_empty(q_stage));
        wg::tile_softmax(s, m_run, l_run, alpha, 0, scale2, wg_first_pos, t, qpos);
        wg::tile_rescale_and_pack<T>(o, pa, s, alpha);
        for (n = 1; n < wg_tiles; ++n) {
          mbar_wait(k_full(kpos.stage), kpos.phase);
          mbar_wait(v_full(vpos.stage), vpos.phase);
          wg::fence_proxy_async();
          wg::fence_regs(o);
          wg::fence_regs(pa);
          named_sync(own_turn, 256);
          wg::wgmma_fence();
          wg::tile_issue_s<T>(s, q_desc, k_desc + ((kpos.stage * kTileBytes) >> 4));
          wg::tile_issue_pv<T>(o, pa, v_desc + ((vpos.stage * kTileBytes) >> 4));
          named_arrive(other_turn, 256);
          wg::wgmma_wait<1>();
          wg::fence_regs(s);
          release(k_empty(kpos.stage));
          kpos.advance();
          if (n == wg_tiles - 1 && !tma_item) release(q_empty(q_stage));
          wg::tile_softmax(s, m_run, l_run, alpha, n, scale2, wg_first_pos, t, qpos);
          wg::fence_regs(s);
          wg::fence_regs(alpha);
          wg::fence_regs(l_run);
          wg::fence_regs(m_run);
          wg::wgmma_wait<0>();
          wg::fence_regs(o);
          wg::fence_regs(pa);
          release(v_empty(vpos.stage));
          vpos.advance();
          wg::tile_rescale_and_pack<T>(o, pa, s, alpha);
        }
        // the last P V
        mbar_wait(v_full(vpos.stage), vpos.phase);
        wg::fence_proxy_async();
        wg::fence_regs(o);
        wg::fence_regs(pa);
        named_sync(own_turn, 256);
        wg::wgmma_fence();
        wg::tile_issue_pv<T>(o, pa, v_desc + ((vpos.stage * kTileBytes) >> 4));
        named_arrive(other_turn, 256);
        wg::wgmma_wait<0>();
        wg::fence_regs(o);
        release(v_empty(vpos.stage));
        vpos.advance();
        if (tma_item) {
          // the rows into this consumer's rows of the Q buffer (the 128-byte swizzle of the tiles),
          // then one thread stores the two halves of 64 head dims by TMA
          const uint32_t qb = q_smem + q_stage * kQBytes + cw * 64 * kHalfRow;
          wg::write_rows_shared<T>(o, l_run, [&](int h, int d) {
            return qb + (d >> 3) * kRows * kHalfRow + (warp * 16 + g + 8 * h) * kHalfRow + (((d & 7) ^ g) << 4) + t * 4;
          });
          wg::fence_proxy_async();
          named_sync(kStoreBarrier0 + cw, 128);
          if ((ctid & 127) == 0) {
            const int tok = it.q_start + wg_row0 / group;
            tma_store_3d(&out_map, qb, 0, it.kvh * group, tok);
            tma_store_3d(&out_map, qb + kRows * kHalfRow, 64, it.kvh * group, tok);
            asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
            mbar_arrive_count(q_empty(q_stage), 4);
          }
        } else {
          wg::store_rows_staged(o, l_run, static_cast<T*>(p.out), o_stage + (cw * 4 + warp) * kOutWarpBytes,
                                wg_row0 + warp * 16, it.rows, it.q_start, group, it.kvh, p.out_token_stride, g, t,
                                lane);
        }
        n = wg_tiles;
      } else {
        release(q_empty(q_stage));
      }
      // The item's tiles past this consumer's rows: turns without products (n_tiles + 1 turns per
      // item for both consumers), each stage released once its copies have landed (so that the
      // release counts towards this use of the stage).
      for (; n < n_tiles; ++n) {
        mbar_wait(k_full(kpos.stage), kpos.phase);
        release(k_empty(kpos.stage));
        kpos.advance();
        named_sync(own_turn, 256);
        named_arrive(other_turn, 256);
        mbar_wait(v_full(vpos.stage), vpos.phase);
        release(v_empty(vpos.stage));
        vpos.advance();
      }
      if (!wg_live) {  // the extra turn of the item's last P V
        named_sync(own_turn, 256);
        named_arrive(other_turn, 256);
      }
    }
    if (cw == 0) named_sync(kTurnBarrier0, 256);  // the second consumer's last arrival
    if ((ctid & 127) == 0) asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");  // the TMA stores done
  }
#endif
}

// The driver's tensor-map encoder, reached through the runtime (no link to the driver library);
// null where the driver lacks it.
inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found) !=
            cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      return static_cast<PFN_cuTensorMapEncodeTiled_v12000>(nullptr);
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  return encode;
}

// A [tokens, heads, 128] tensor at `base` (tokens `token_stride` elements apart, heads contiguous)
// as a tensor map of boxes of 64 head dims x `box_heads` heads x `box_tokens` tokens, 128-byte
// swizzled as the tiles are; false where it cannot be.
template <typename T>
bool heads_map_of(CUtensorMap* map, const void* base, int64_t token_stride, int64_t tokens, int heads, int box_heads,
                  int box_tokens, CUtensorMapL2promotion promotion) {
  const auto encode = tensor_map_encoder();
  if (encode == nullptr || base == nullptr || reinterpret_cast<uintptr_t>(base) % 16 != 0 ||
      (token_stride * 2) % 16 != 0 || tokens <= 0) {
    return false;
  }
  const cuuint64_t dims[3] = {kHead, static_cast<cuuint64_t>(heads), static_cast<cuuint64_t>(tokens)};
  const cuuint64_t strides[2] = {kHead * 2, static_cast<cuuint64_t>(token_stride) * 2};
  const cuuint32_t box[3] = {64, static_cast<cuuint32_t>(box_heads), static_cast<cuuint32_t>(box_tokens)};
  const cuuint32_t elem[3] = {1, 1, 1};
  const CUtensorMapDataType type =
      std::is_same<T, __half>::value ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  return encode(map, type, 3, const_cast<void*>(base), dims, strides, box, elem, CU_TENSOR_MAP_INTERLEAVE_NONE,
                CU_TENSOR_MAP_SWIZZLE_128B, promotion, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// The output or the query as boxes of `group` heads x 64 / group tokens (a consumer's 64 packed rows).
template <typename T>
bool rows_map_of(CUtensorMap* map, const void* base, int64_t token_stride, const PagedPrefillParams& p, int group) {
  return 64 % group == 0 && heads_map_of<T>(map, base, token_stride, p.num_tokens, p.num_heads, group, 64 / group,
                                            CU_TENSOR_MAP_L2_PROMOTION_NONE);
}

// The new tokens' keys or values as boxes of 1 KV head x 128 tokens (a key tile's half).
template <typename T>
bool new_kv_map_of(CUtensorMap* map, const void* base, int64_t token_stride, const PagedPrefillParams& p) {
  return heads_map_of<T>(map, base, token_stride, p.num_tokens, p.num_kv_heads, 1, kKeys,
                         CU_TENSOR_MAP_L2_PROMOTION_L2_256B);
}

// The persistent grid: one block per SM, at most one per item.
template <typename T>
cudaError_t launch(const PagedPrefillParams& p, cudaStream_t stream) {
  int64_t m_blocks = 0;
  if (wg::row_blocks(p, m_blocks) != cudaSuccess) return cudaErrorInvalidValue;
  if (m_blocks == 0) return cudaSuccess;
  const int group = p.num_heads / p.num_kv_heads;
  const int64_t items = m_blocks * p.num_seqs * p.num_kv_heads;
  int device = 0, sms = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (err != cudaSuccess) return err;
  if (items > 0x7fffffff - sms) return cudaErrorInvalidValue;  // Schedule's item indices, a round past the last
  auto* kernel = paged_prefill_ws_kernel<T>;
  err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
  if (err != cudaSuccess) return err;
  const int grid = static_cast<int>(std::min<int64_t>(items, sms));
  CUtensorMap out_map{}, q_map{};
  // Q loaded and the output stored by TMA where both tensor maps can be encoded
  const bool tma_rows = rows_map_of<T>(&out_map, p.out, p.out_token_stride, p, group) &&
                       rows_map_of<T>(&q_map, p.query, p.q_token_stride, p, group);
  // key tiles of new tokens by TMA from the new tokens' own keys and values where both are given
  // and both tensor maps can be encoded
  CUtensorMap kn_map{}, vn_map{};
  const bool tma_new = p.key_new != nullptr && p.value_new != nullptr &&
                       new_kv_map_of<T>(&kn_map, p.key_new, p.kn_token_stride, p) &&
                       new_kv_map_of<T>(&vn_map, p.value_new, p.vn_token_stride, p);
  kernel<<<grid, kThreads, kSmemBytes, stream>>>(p, static_cast<int>(m_blocks),
                                                 wg::band_for(group, static_cast<int>(m_blocks)),
                                                 static_cast<int>(items), out_map, q_map, kn_map, vn_map, tma_rows,
                                                 tma_new);
  return cudaGetLastError();
}

}  // namespace ws
}  // namespace prefill
}  // namespace blocksim
