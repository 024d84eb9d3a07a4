// Instantiates the paged prefill kernel for float16 queries over float16 and fp8 (e4m3) caches.
#include "paged_prefill.cuh"

namespace blocksim {

cudaError_t launch_paged_prefill_f16(const PagedPrefillParams& p, cudaStream_t stream) {
  return prefill::launch_typed<__half, __half>(p, stream);
}

cudaError_t launch_paged_prefill_fp8(const PagedPrefillParams& p, cudaStream_t stream) {
  return prefill::launch_typed<__half, __nv_fp8_e4m3>(p, stream);
}

}  // namespace blocksim
