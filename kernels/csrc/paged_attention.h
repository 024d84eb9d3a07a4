// Host-side interface of the paged-attention kernels. Plain C++ (no ATen), so that the heavily
// templated translation units compile without the torch headers.
#pragma once

#include <cstdint>
#include <cuda_runtime_api.h>

namespace blocksim {

// Tokens per partition of the split-context (v2) kernel.
constexpr int kPartitionSize = 512;
// Threads per thread block of the attention kernels (4 warps).
constexpr int kAttentionThreads = 128;

struct AttentionParams {
  void* out;                  // [num_seqs, num_heads, head_size], contiguous
  float* tmp_out;             // v2: [num_seqs, num_heads, max_partitions, head_size]
  float* exp_sums;            // v2: [num_seqs, num_heads, max_partitions]
  float* max_logits;          // v2: [num_seqs, num_heads, max_partitions]
  const void* query;          // [num_seqs, num_heads, head_size], q_stride elements per sequence
  const void* key_cache;      // [num_blocks, num_kv_heads, head_size / x, block_size, x]
  const void* value_cache;    // [num_blocks, num_kv_heads, head_size, block_size]
  const int* block_tables;    // [num_seqs, max_blocks_per_seq]
  const int* context_lens;    // [num_seqs]
  const float* alibi_slopes;  // [num_heads] or nullptr
  float scale;
  int num_seqs;
  int num_heads;
  int num_kv_heads;
  int head_size;
  int block_size;
  int max_blocks_per_seq;
  int num_blocks;             // physical blocks in the caches; larger ids are never read
  int max_context_len;
  int max_partitions;         // v2 only: ceil(max_context_len / kPartitionSize)
  int64_t q_stride;           // elements, query.stride(0)
  int64_t k_block_stride;     // elements, key_cache.stride(0)
  int64_t k_head_stride;      // elements, key_cache.stride(1)
  int64_t v_block_stride;
  int64_t v_head_stride;
};

// version 1: one thread block per (head, sequence). version 2: one per (head, sequence,
// partition), then a reduce kernel. Returns the launch error, if any. The dynamic shared memory
// of v1 grows with max_context_len; the launcher raises the kernel's limit when it needs to.
cudaError_t launch_paged_attention_f32(const AttentionParams& p, int version, cudaStream_t stream);
cudaError_t launch_paged_attention_f16(const AttentionParams& p, int version, cudaStream_t stream);
cudaError_t launch_paged_attention_bf16(const AttentionParams& p, int version, cudaStream_t stream);

// Dynamic shared memory, in bytes, that v1 needs: one float per token of the longest context
// (rounded up to whole blocks), or the warps' partial outputs if that is larger.
inline size_t paged_attention_v1_smem_bytes(int head_size, int block_size, int max_context_len) {
  const int padded = (max_context_len + block_size - 1) / block_size * block_size;
  const int partial = (kAttentionThreads / 32) * head_size;
  return static_cast<size_t>(padded > partial ? padded : partial) * sizeof(float);
}

}  // namespace blocksim
