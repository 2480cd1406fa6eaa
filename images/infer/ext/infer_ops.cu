// BF16 bias + GELU epilogue used by the inference server (needs BF16: Ampere and newer).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

__global__ void bias_gelu(__nv_bfloat16* x, const __nv_bfloat16* bias, int cols, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float v = __bfloat162float(x[i]) + __bfloat162float(bias[i % cols]);
  float g = 0.5f * v * (1.0f + tanhf(0.7978845608f * (v + 0.044715f * v * v * v)));
  x[i] = __float2bfloat16(g);
}

extern "C" int infer_bias_gelu(void* x, const void* bias, int cols, int n) {
  bias_gelu<<<(n + 255) / 256, 256>>>(static_cast<__nv_bfloat16*>(x),
                                      static_cast<const __nv_bfloat16*>(bias), cols, n);
  return static_cast<int>(cudaGetLastError());
}
