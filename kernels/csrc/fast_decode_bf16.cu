// Instantiates the fast decode kernel for bfloat16 queries and caches, and the dtype dispatch.
#include "fast_decode.cuh"

namespace blocksim {

cudaError_t launch_fast_decode_bf16(const FastDecodeParams& p, cudaStream_t stream) {
  return fast::launch_typed<__nv_bfloat16, __nv_bfloat16>(p, stream);
}

cudaError_t launch_fast_decode(const FastDecodeParams& p, int query_dtype, int kv_dtype, cudaStream_t stream) {
  if (p.num_seqs == 0) return cudaSuccess;
  if (p.max_splits < 1 || p.split_tokens % kFastTile || p.block_size_log2 < 3 || p.block_size_log2 > 8 ||
      p.num_kv_heads < 1 || p.num_heads % p.num_kv_heads) {
    return cudaErrorInvalidValue;
  }
  if (query_dtype == kFastF16 && kv_dtype == kFastF16) return launch_fast_decode_f16(p, stream);
  if (query_dtype == kFastF16 && kv_dtype == kFastFp8E4M3) return launch_fast_decode_fp8(p, stream);
  if (query_dtype == kFastBF16 && kv_dtype == kFastBF16) return launch_fast_decode_bf16(p, stream);
  return cudaErrorInvalidValue;
}

}  // namespace blocksim
