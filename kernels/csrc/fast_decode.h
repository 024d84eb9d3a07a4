// Host-side interface of the fast paged decode kernel (plain C++, no ATen).
//
// Cache layout (one layer; logical shape, any strides over the first three dimensions, the head
// dimension contiguous and every token's head row on a 16-byte boundary):
//
//   key cache, value cache   [num_blocks, block_size, num_kv_heads, head_size]
//
// so both the "NHD" storage (token-major inside a block, vLLM's flash layout) and the "HND"
// storage (a transposed view of [num_blocks, num_kv_heads, block_size, head_size]) are read by
// the same kernel through strides.
#pragma once

#include <cstdint>
#include <cuda_runtime_api.h>

namespace blocksim {

// Tokens per tile of the fast kernel: one tensor-core step over the context.
constexpr int kFastTile = 16;
// Query heads of one KV head handled by one thread block (a GQA group of more heads takes
// several thread blocks, each reading the KV head once).
constexpr int kFastHeadsPerCta = 8;
// Warps per thread block.
constexpr int kFastWarps = 4;

enum FastDtype : int { kFastF16 = 0, kFastBF16 = 1, kFastFp8E4M3 = 2 };

struct FastDecodeParams {
  void* out;                  // [num_seqs, num_heads, head_size], contiguous, query's dtype
  float* part_out;            // splits > 1: [num_seqs, num_heads, max_splits, head_size]
  float* part_max;            // splits > 1: [num_seqs, num_heads, max_splits], log2 domain
  float* part_sum;            // splits > 1: [num_seqs, num_heads, max_splits]
  const void* query;          // [num_seqs, num_heads, head_size], rows contiguous
  const void* key_cache;      // see above
  const void* value_cache;
  const int* block_tables;    // [num_seqs, max_blocks_per_seq]
  const int* context_lens;    // [num_seqs]
  const float* alibi_slopes;  // [num_heads] or nullptr
  float scale;                // softmax scale times the key scale (fp8)
  float v_scale;              // value scale (fp8), 1 otherwise
  int num_seqs;
  int num_heads;
  int num_kv_heads;
  int head_size;
  int block_size_log2;        // block size = 1 << block_size_log2, 8 to 256
  int max_blocks_per_seq;
  int num_blocks;             // larger block ids are never read: they poison the output with NaN
  int split_tokens;           // context tokens per thread block, a multiple of kFastTile
  int max_splits;             // ceil(max_context_len / split_tokens)
  int prefetch;               // register loads (stages == 0): 1 = two tiles in flight per warp
                              // (head sizes <= 128), 0 = one
  int stages;                 // 0: K/V loaded into registers; 2 to 4: each warp streams its tiles
                              // through a ring of this many shared-memory stages (cp.async)
  int* ctas_per_sm;           // non-null: launch nothing; write how many thread blocks of the kernel
                              // this launch would run fit on one SM (occupancy)
  int max_ctas_per_sm;        // > 0: pad the dynamic shared memory so that at most this many thread blocks
                              // are resident per SM (fewer warps streaming at once); 0: as many as fit
  int warp_items;             // 1 (the 2-stage ring only): each warp takes a whole work item, every tile of one
                              // (sequence, KV head, head group, split), so a thread block serves kFastWarps
                              // KV heads of a sequence at once; 0: the block's warps share one item's tiles
  int pdl;                    // 1: the reduce kernel is a programmatic dependent launch (sm_90+):
                              // it is scheduled while the attention kernel's last wave runs
  int64_t q_stride;           // elements between sequences of query
  int64_t k_block_stride, k_token_stride, k_head_stride;  // elements
  int64_t v_block_stride, v_token_stride, v_head_stride;
};

// Dynamic shared memory of the cp.async variant (stages >= 2), in bytes; 0 when the variant does
// not exist for this head size / cache type / stage count (it must fit an SM's 227 KB).
size_t fast_decode_smem_bytes(int head_size, int kv_dtype, int stages);

// query_dtype: kFastF16 or kFastBF16; kv_dtype: the same, or kFastFp8E4M3 (with a float16
// query). One kernel launch, plus a reduce launch when max_splits > 1.
cudaError_t launch_fast_decode(const FastDecodeParams& p, int query_dtype, int kv_dtype, cudaStream_t stream);

}  // namespace blocksim
