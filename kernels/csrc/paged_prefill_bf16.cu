// Instantiates the paged prefill kernel for bfloat16 queries and caches, and the dtype dispatch.
#include "paged_prefill.cuh"
#include "paged_prefill_wgmma.cuh"  // its tile shape (paged_prefill_block_rows)

namespace blocksim {

cudaError_t launch_paged_prefill_bf16(const PagedPrefillParams& p, cudaStream_t stream) {
  return prefill::launch_typed<__nv_bfloat16, __nv_bfloat16>(p, stream);
}

int paged_prefill_block_rows(int head_size, int config) {
  if (config == kPrefillWgmma || config == kPrefillWs) return head_size == prefill::wg::kHead ? prefill::wg::kRows : 0;
  if (config < 0 || config >= prefill::kNumConfigs) return 0;
  if (config > 1) return prefill::kWarps * 16 * prefill::kConfigs[config].mt;
  if (head_size > 128) return prefill::Shape<256, 0>::BM;
  return config == 0 ? prefill::Shape<128, 0>::BM : prefill::Shape<128, 1>::BM;
}

cudaError_t launch_paged_prefill(const PagedPrefillParams& p, int query_dtype, int kv_dtype, cudaStream_t stream) {
  if (p.num_seqs == 0 || p.max_query_len == 0) return cudaSuccess;
  if (p.block_size_log2 < 3 || p.block_size_log2 > 8 || p.num_kv_heads < 1 || p.num_heads % p.num_kv_heads) {
    return cudaErrorInvalidValue;
  }
  if (p.config == kPrefillWgmma || p.config == kPrefillWs) {
    return query_dtype == kv_dtype ? launch_paged_prefill_wgmma(p, query_dtype, stream) : cudaErrorInvalidValue;
  }
  if (query_dtype == kFastF16 && kv_dtype == kFastF16) return launch_paged_prefill_f16(p, stream);
  if (query_dtype == kFastF16 && kv_dtype == kFastFp8E4M3) return launch_paged_prefill_fp8(p, stream);
  if (query_dtype == kFastBF16 && kv_dtype == kFastBF16) return launch_paged_prefill_bf16(p, stream);
  return cudaErrorInvalidValue;
}

}  // namespace blocksim
