// Device helpers shared by the attention and cache kernels: 16-byte chunk loads converted to
// float, float-to-element stores, and warp / thread-block reductions.
#pragma once

#include <cfloat>
#include <cstdint>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

namespace blocksim {

constexpr int kWarpSize = 32;
constexpr unsigned kFullMask = 0xffffffffu;

// A 16-byte chunk of elements of type T (4 floats, or 8 halves / bfloat16s), read with one
// 128-bit load and widened to float for arithmetic.
template <typename T>
struct Chunk16;

template <>
struct Chunk16<float> {
  static constexpr int kElems = 4;
  __device__ __forceinline__ static void widen(const uint4& raw, float (&f)[kElems]) {
    f[0] = __uint_as_float(raw.x);
    f[1] = __uint_as_float(raw.y);
    f[2] = __uint_as_float(raw.z);
    f[3] = __uint_as_float(raw.w);
  }
};

template <>
struct Chunk16<__half> {
  static constexpr int kElems = 8;
  __device__ __forceinline__ static void widen(const uint4& raw, float (&f)[kElems]) {
    const __half2* pairs = reinterpret_cast<const __half2*>(&raw);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 v = __half22float2(pairs[i]);
      f[2 * i] = v.x;
      f[2 * i + 1] = v.y;
    }
  }
};

template <>
struct Chunk16<__nv_bfloat16> {
  static constexpr int kElems = 8;
  __device__ __forceinline__ static void widen(const uint4& raw, float (&f)[kElems]) {
    const __nv_bfloat162* pairs = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 v = __bfloat1622float2(pairs[i]);
      f[2 * i] = v.x;
      f[2 * i + 1] = v.y;
    }
  }
};

__device__ __forceinline__ uint4 load_chunk16(const void* ptr) {
  return *reinterpret_cast<const uint4*>(ptr);
}

template <typename T>
__device__ __forceinline__ T narrow(float v);
template <>
__device__ __forceinline__ float narrow<float>(float v) { return v; }
template <>
__device__ __forceinline__ __half narrow<__half>(float v) { return __float2half_rn(v); }
template <>
__device__ __forceinline__ __nv_bfloat16 narrow<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// Butterfly reduction over the lanes whose index differs only in bits [log2(LO), log2(HI)].
template <int HI, int LO>
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int mask = HI; mask >= LO; mask /= 2) v += __shfl_xor_sync(kFullMask, v, mask);
  return v;
}

template <int HI, int LO>
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int mask = HI; mask >= LO; mask /= 2) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, mask));
  return v;
}

// Thread-block reductions. `scratch` holds NWARPS floats owned by this call site: two calls that
// may overlap in time must use different scratch areas. Every thread gets the result.
template <int NWARPS>
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  v = warp_sum<kWarpSize / 2, 1>(v);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < NWARPS ? scratch[lane] : 0.f;
  if constexpr (NWARPS > 1) v = warp_sum<NWARPS / 2, 1>(v);
  return __shfl_sync(kFullMask, v, 0);
}

template <int NWARPS>
__device__ __forceinline__ float block_max(float v, float* scratch) {
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  v = warp_max<kWarpSize / 2, 1>(v);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < NWARPS ? scratch[lane] : -FLT_MAX;
  if constexpr (NWARPS > 1) v = warp_max<NWARPS / 2, 1>(v);
  return __shfl_sync(kFullMask, v, 0);
}

}  // namespace blocksim
