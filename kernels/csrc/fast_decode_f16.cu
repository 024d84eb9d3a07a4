// Instantiates the fast decode kernel for float16 queries over float16 and fp8 (e4m3) caches.
#include "fast_decode.cuh"

namespace blocksim {

cudaError_t launch_fast_decode_f16(const FastDecodeParams& p, cudaStream_t stream) {
  return fast::launch_typed<__half, __half>(p, stream);
}

cudaError_t launch_fast_decode_fp8(const FastDecodeParams& p, cudaStream_t stream) {
  return fast::launch_typed<__half, __nv_fp8_e4m3>(p, stream);
}

}  // namespace blocksim
