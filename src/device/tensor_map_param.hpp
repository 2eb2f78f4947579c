// A CUDA tensor map (CUtensorMap: 128 opaque bytes, 64-byte aligned) as a kernel parameter, for the
// bulk tensor copies of the wgmma family: device/tensor_map.hpp encodes it on the host and the
// kernels take it by value (kernels/expert_gemm_args.hpp, kernels/wgmma.cuh). No headers, so that
// NVRTC compiles it as it is.
#pragma once

namespace mxmoe::kernels {

struct alignas(64) TensorMap {
  unsigned long long words[16];
};

}  // namespace mxmoe::kernels
