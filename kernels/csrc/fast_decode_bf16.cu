// Instantiates the fast decode kernel for bfloat16 queries and caches, the dtype dispatch, and the
// cp.async variant's shared-memory size.
#include "fast_decode.cuh"

namespace blocksim {

cudaError_t launch_fast_decode_bf16(const FastDecodeParams& p, cudaStream_t stream) {
  return fast::launch_typed<__nv_bfloat16, __nv_bfloat16>(p, stream);
}

namespace {
template <typename KV>
size_t ring_bytes(int head_size, int stages) {
  switch (head_size) {
    case 32: return fast::Ring<KV, 32>::bytes(stages);
    case 64: return fast::Ring<KV, 64>::bytes(stages);
    case 80: return fast::Ring<KV, 80>::bytes(stages);
    case 96: return fast::Ring<KV, 96>::bytes(stages);
    case 112: return fast::Ring<KV, 112>::bytes(stages);
    case 120: return fast::Ring<KV, 120>::bytes(stages);
    case 128: return fast::Ring<KV, 128>::bytes(stages);
    case 192: return fast::Ring<KV, 192>::bytes(stages);
    case 256: return fast::Ring<KV, 256>::bytes(stages);
    default: return 0;
  }
}
}  // namespace

size_t fast_decode_smem_bytes(int head_size, int kv_dtype, int stages) {
  if (stages < 2 || stages > 4) return 0;
  const size_t bytes = kv_dtype == kFastFp8E4M3 ? ring_bytes<__nv_fp8_e4m3>(head_size, stages)
                                                : ring_bytes<__half>(head_size, stages);
  return bytes <= fast::kMaxSmem ? bytes : 0;
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
