// Instantiates the warpgroup (wgmma) paged prefill kernel for float16 and bfloat16 (sm_90a; on other
// targets the kernel is empty and the dispatch never picks it).
#include "paged_prefill_ws.cuh"

namespace blocksim {

cudaError_t launch_paged_prefill_wgmma(const PagedPrefillParams& p, int dtype, cudaStream_t stream) {
  if (p.config == kPrefillWs) {
    if (dtype == kFastF16) return prefill::ws::launch<__half>(p, stream);
    if (dtype == kFastBF16) return prefill::ws::launch<__nv_bfloat16>(p, stream);
    return cudaErrorInvalidValue;
  }
  if (dtype == kFastF16) return prefill::wg::launch<__half>(p, stream);
  if (dtype == kFastBF16) return prefill::wg::launch<__nv_bfloat16>(p, stream);
  return cudaErrorInvalidValue;
}

}  // namespace blocksim
