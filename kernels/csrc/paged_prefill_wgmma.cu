// Instantiates the warpgroup (wgmma) paged prefill kernels, config 6 (paged_prefill_wgmma.cuh) and 7
// (paged_prefill_ws.cuh), for float16 and bfloat16 (sm_90a; on other targets the kernels are empty
// and the dispatch never picks them).
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
