// Fused FP8 (E4M3) quantise / dequantise kernels: the kind of code that dies at start-up
// on GPUs without FP8 support when an image is built for the wrong architecture.
#include <cuda_fp8.h>
#include <cuda_runtime.h>

__global__ void quantize_e4m3(const float* in, __nv_fp8_e4m3* out, float scale, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = __nv_fp8_e4m3(in[i] * scale);
}

__global__ void dequantize_e4m3(const __nv_fp8_e4m3* in, float* out, float inv_scale, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = static_cast<float>(in[i]) * inv_scale;
}

extern "C" int fp8_quantize(const float* in, void* out, float scale, int n) {
  quantize_e4m3<<<(n + 255) / 256, 256>>>(in, static_cast<__nv_fp8_e4m3*>(out), scale, n);
  return static_cast<int>(cudaGetLastError());
}

extern "C" int fp8_dequantize(const void* in, float* out, float inv_scale, int n) {
  dequantize_e4m3<<<(n + 255) / 256, 256>>>(static_cast<const __nv_fp8_e4m3*>(in), out,
                                            inv_scale, n);
  return static_cast<int>(cudaGetLastError());
}
