// Host-side interface of the cache kernels (plain C++, no ATen).
#pragma once

#include <cstdint>
#include <cuda_runtime_api.h>

namespace blocksim {

struct ReshapeAndCacheParams {
  const void* key;             // [num_tokens, num_kv_heads, head_size], last dim contiguous
  const void* value;
  void* key_cache;             // [num_blocks, num_kv_heads, head_size / x, block_size, x]
  void* value_cache;           // [num_blocks, num_kv_heads, head_size, block_size]
  const int64_t* slot_mapping; // [num_tokens]; slot = block * block_size + offset, < 0: padding
  int num_tokens;
  int num_kv_heads;
  int head_size;
  int block_size;
  int64_t num_slots;           // num_blocks * block_size; larger slots are never written
  int64_t key_token_stride, key_head_stride;
  int64_t value_token_stride, value_head_stride;
  int64_t k_block_stride, v_block_stride;  // elements between blocks in each cache
};

// elem_bytes: 4 (float32) or 2 (float16 / bfloat16: copied bit for bit).
cudaError_t launch_reshape_and_cache(const ReshapeAndCacheParams& p, int elem_bytes, cudaStream_t stream);

struct FastCacheWriteParams {
  const void* key;             // [num_tokens, num_kv_heads, head_size]: rows contiguous, 16-byte aligned
  const void* value;
  void* key_cache;             // fast layout [num_blocks, block_size, num_kv_heads, head_size], any strides
  void* value_cache;           //   whose head rows are contiguous and 16-byte aligned
  const int64_t* slot_mapping; // [num_tokens]; slot = block * block_size + offset, < 0: padding
  int num_tokens;
  int num_kv_heads;
  int row_words;               // 16-byte words in one head row (head_size * elem_bytes / 16)
  int block_size;
  int64_t num_slots;
  int64_t key_token_stride, key_head_stride, value_token_stride, value_head_stride;  // in words
  int64_t kc_block_stride, kc_slot_stride, kc_head_stride;                             // in words
  int64_t vc_block_stride, vc_slot_stride, vc_head_stride;
};

// Fast-layout cache write: one thread block per token, each head row moved as 16-byte words.
cudaError_t launch_fast_cache_write(const FastCacheWriteParams& p, cudaStream_t stream);

// Copies whole blocks: for each tensor t and pair i, block pairs[2i+1] of dsts[t] becomes block
// pairs[2i] of srcs[t]. src_ptrs / dst_ptrs / pairs are device arrays (pointers as int64); the
// pointers may be device memory or mapped pinned host memory. Blocks are block_bytes long,
// block_stride_bytes apart, both multiples of 16. One launch for all tensors and pairs.
cudaError_t launch_copy_block_pairs(const int64_t* src_ptrs, const int64_t* dst_ptrs, int num_tensors,
                                    const int64_t* pairs, int num_pairs, int64_t block_bytes,
                                    int64_t block_stride_bytes, cudaStream_t stream);

}  // namespace blocksim
