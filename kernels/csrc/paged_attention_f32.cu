// Instantiates the paged-attention kernels for one element type (one translation unit per type
// so that the JIT build compiles them in parallel).
#include "paged_attention_kernels.cuh"

namespace blocksim {

cudaError_t launch_paged_attention_f32(const AttentionParams& p, int version, cudaStream_t stream) {
  return launch_paged_attention<float>(p, version, stream);
}

}  // namespace blocksim
