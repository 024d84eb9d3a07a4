// Cache kernels: writing new tokens' keys and values into their slots, and whole-block copies
// (copy-on-write between blocks of every layer, and swaps between GPU and pinned CPU memory).
#include "cache_ops.h"
#include "common.cuh"

namespace blocksim {

// One thread block per token. Elements are moved as raw bits of their width (E = uint32 or uint16).
template <typename E>
__global__ void reshape_and_cache_kernel(const ReshapeAndCacheParams p) {
  const int token = blockIdx.x;
  const int64_t slot = p.slot_mapping[token];
  if (slot < 0 || slot >= p.num_slots) return;  // padding (the host API rejects slots past the cache)
  const int64_t blk = slot / p.block_size;
  const int off = static_cast<int>(slot % p.block_size);
  constexpr int X = 16 / sizeof(E);
  const E* key = static_cast<const E*>(p.key) + token * p.key_token_stride;
  const E* value = static_cast<const E*>(p.value) + token * p.value_token_stride;
  E* kc = static_cast<E*>(p.key_cache) + blk * p.k_block_stride;
  E* vc = static_cast<E*>(p.value_cache) + blk * p.v_block_stride;
  const int per_head = p.head_size * p.block_size;  // elements of one head in one block
  const int n = p.num_kv_heads * p.head_size;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const int h = i / p.head_size;
    const int d = i % p.head_size;
    kc[h * per_head + (d / X) * (p.block_size * X) + off * X + d % X] = key[h * p.key_head_stride + d];
    vc[h * per_head + d * p.block_size + off] = value[h * p.value_head_stride + d];
  }
}

cudaError_t launch_reshape_and_cache(const ReshapeAndCacheParams& p, int elem_bytes, cudaStream_t stream) {
  if (p.num_tokens == 0) return cudaSuccess;
  const int n = p.num_kv_heads * p.head_size;
  const int threads = n < 512 ? ((n + 31) / 32) * 32 : 512;
  if (elem_bytes == 4) {
    reshape_and_cache_kernel<uint32_t><<<p.num_tokens, threads, 0, stream>>>(p);
  } else if (elem_bytes == 2) {
    reshape_and_cache_kernel<uint16_t><<<p.num_tokens, threads, 0, stream>>>(p);
  } else {
    return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

// One thread block per token; thread i moves word i % row_words of head row i / row_words, for the
// key and the value (strided sources such as the key and value slices of a fused QKV output).
__global__ void fast_cache_write_kernel(const FastCacheWriteParams p) {
  const int token = blockIdx.x;
  const int64_t slot = p.slot_mapping[token];
  if (slot < 0 || slot >= p.num_slots) return;
  const int64_t blk = slot / p.block_size;
  const int64_t off = slot % p.block_size;
  const uint4* key = static_cast<const uint4*>(p.key) + token * p.key_token_stride;
  const uint4* value = static_cast<const uint4*>(p.value) + token * p.value_token_stride;
  uint4* kc = static_cast<uint4*>(p.key_cache) + blk * p.kc_block_stride + off * p.kc_slot_stride;
  uint4* vc = static_cast<uint4*>(p.value_cache) + blk * p.vc_block_stride + off * p.vc_slot_stride;
  const int n = p.num_kv_heads * p.row_words;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const int h = i / p.row_words;
    const int w = i % p.row_words;
    kc[h * p.kc_head_stride + w] = key[h * p.key_head_stride + w];
    vc[h * p.vc_head_stride + w] = value[h * p.value_head_stride + w];
  }
}

cudaError_t launch_fast_cache_write(const FastCacheWriteParams& p, cudaStream_t stream) {
  if (p.num_tokens == 0) return cudaSuccess;
  const int n = p.num_kv_heads * p.row_words;
  const int threads = n < 256 ? ((n + 31) / 32) * 32 : 256;
  fast_cache_write_kernel<<<p.num_tokens, threads, 0, stream>>>(p);
  return cudaGetLastError();
}

// grid (pairs, tensors, chunks): each thread block copies a strided share of one block of one
// tensor in 16-byte words.
__global__ void copy_block_pairs_kernel(const int64_t* src_ptrs, const int64_t* dst_ptrs, const int64_t* pairs,
                                        int64_t words, int64_t stride_words) {
  const int pair = blockIdx.x;
  const int t = blockIdx.y;
  const uint4* src = reinterpret_cast<const uint4*>(src_ptrs[t]) + pairs[2 * pair] * stride_words;
  uint4* dst = reinterpret_cast<uint4*>(dst_ptrs[t]) + pairs[2 * pair + 1] * stride_words;
  const int64_t step = static_cast<int64_t>(gridDim.z) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.z) * blockDim.x + threadIdx.x; i < words; i += step) {
    dst[i] = src[i];
  }
}

cudaError_t launch_copy_block_pairs(const int64_t* src_ptrs, const int64_t* dst_ptrs, int num_tensors,
                                    const int64_t* pairs, int num_pairs, int64_t block_bytes,
                                    int64_t block_stride_bytes, cudaStream_t stream) {
  if (num_pairs == 0 || num_tensors == 0) return cudaSuccess;
  if (block_bytes % 16 != 0 || block_stride_bytes % 16 != 0 || num_tensors > 65535) return cudaErrorInvalidValue;
  constexpr int kThreads = 256;
  const int64_t words = block_bytes / 16;
  // Enough thread blocks per block copy to keep each one to a few words per thread.
  int64_t chunks = (words + kThreads * 4 - 1) / (kThreads * 4);
  if (chunks > 64) chunks = 64;
  if (chunks < 1) chunks = 1;
  copy_block_pairs_kernel<<<dim3(num_pairs, num_tensors, static_cast<unsigned>(chunks)), kThreads, 0, stream>>>(
      src_ptrs, dst_ptrs, pairs, words, block_stride_bytes / 16);
  return cudaGetLastError();
}

}  // namespace blocksim
