// Host-side interface of the paged prefill kernel (plain C++, no ATen).
//
// A varlen batch: sequence i has c_i tokens already in the paged cache and p_i new tokens (query
// rows query_start_loc[i] .. query_start_loc[i + 1]); context_lens[i] = c_i + p_i. The new
// queries attend causally over all c_i + p_i keys and values, read through the block table.
// Caches as the fast decode kernel's (fast_decode.h): [num_blocks, block_size, num_kv_heads,
// head_size], any strides over the first three dimensions, head rows contiguous.
#pragma once

#include <cstdint>
#include <cuda_runtime_api.h>

namespace blocksim {

// The config value of the warpgroup (wgmma, sm_90a) kernel: float16 or bfloat16 query and caches,
// head size 128, no ALiBi, a Hopper GPU.
constexpr int kPrefillWgmma = 6;
// The warp-specialized persistent warpgroup kernel (paged_prefill_ws.cuh): the same arguments.
constexpr int kPrefillWs = 7;

struct PagedPrefillParams {
  void* out;                    // [total_new_tokens, num_heads, head_size], query's dtype
  const void* query;            // [total_new_tokens, num_heads, head_size], head rows contiguous
  const void* key_cache;
  const void* value_cache;
  const int* block_tables;      // [num_seqs, max_blocks_per_seq]
  const int* query_start_loc;   // [num_seqs + 1]
  const int* context_lens;      // [num_seqs], cached + new tokens
  const float* alibi_slopes;    // [num_heads] or nullptr
  float scale;                  // softmax scale times the key scale (fp8)
  float v_scale;                // value scale (fp8), 1 otherwise
  int num_seqs;
  int num_heads;
  int num_kv_heads;
  int head_size;
  int block_size_log2;          // block size = 1 << block_size_log2, 8 to 256
  int max_blocks_per_seq;
  int num_blocks;               // block ids outside [0, num_blocks) are never read
  int max_query_len;            // the most new tokens of a sequence (sizes the grid)
  int max_context_len;          // the longest context, cached plus new (the warpgroup kernel's launch rule)
  int config;                   // tile configuration (paged_prefill.cuh, kConfigs): 0 = the default;
                                // 2-5 exist for float16 at head 128 only; kPrefillWgmma the
                                // warpgroup kernel (paged_prefill_wgmma.cuh)
  int64_t q_token_stride;       // elements between query tokens
  int64_t out_token_stride;     // elements between output tokens
  int64_t num_tokens;           // rows of out and query (the output's tensor map)
  int64_t k_block_stride, k_token_stride, k_head_stride;  // elements
  int64_t v_block_stride, v_token_stride, v_head_stride;
  // Optional: the new tokens' keys and values as written into the cache, [num_tokens, num_kv_heads,
  // head_size] with contiguous head rows and KV heads (rows as query's). The warp-specialized kernel
  // reads the key tiles that hold new tokens only from them (TMA) instead of through the block
  // table; null: every key through the block table.
  const void* key_new;
  const void* value_new;
  int64_t kn_token_stride, vn_token_stride;  // elements between tokens
};

// query_dtype: kFastF16 or kFastBF16; kv_dtype: the same, or kFastFp8E4M3 with a float16 query
// (fast_decode.h's FastDtype). One kernel launch.
cudaError_t launch_paged_prefill(const PagedPrefillParams& p, int query_dtype, int kv_dtype, cudaStream_t stream);

// The warpgroup kernels (config kPrefillWgmma or kPrefillWs); dtype kFastF16 or kFastBF16 (query and caches).
cudaError_t launch_paged_prefill_wgmma(const PagedPrefillParams& p, int dtype, cudaStream_t stream);

// Query rows (packed (token, head of the GQA group) rows) per thread block for this head size and
// tile configuration; 0 for an unknown configuration.
int paged_prefill_block_rows(int head_size, int config);

}  // namespace blocksim
