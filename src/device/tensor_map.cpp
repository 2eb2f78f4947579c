#include "device/tensor_map.hpp"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <string>

#include "device/cuda_check.hpp"

namespace mxmoe {
namespace {

// The encoded bytes are copied over; the kernel parameter keeps the 64-byte alignment PTX asks of
// a tensor map (the toolkit's type may declare more).
static_assert(sizeof(CUtensorMap) == sizeof(kernels::TensorMap), "kernels::TensorMap holds a CUtensorMap");

PFN_cuTensorMapEncodeTiled_v12000 encode_tiled() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* entry = nullptr;
    cudaDriverEntryPointQueryResult found{};
    cuda_check(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &entry, 12000, cudaEnableDefault, &found),
               "looking up cuTensorMapEncodeTiled");
    if (found != cudaDriverEntryPointSuccess || !entry) {
      throw Error("looking up cuTensorMapEncodeTiled: the driver has no tensor maps (it needs CUDA 12)");
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(entry);
  }();
  return fn;
}

}  // namespace

kernels::TensorMap bf16_rows_map(const void* base, int columns, long long rows, int box_rows, const std::string& what) {
  if (reinterpret_cast<std::uintptr_t>(base) % 16 != 0 || columns <= 0 || columns % 8 != 0 || rows <= 0 ||
      box_rows < 1 || box_rows > 256) {
    throw Error(what + ": a tensor map needs a 16-byte aligned base, columns a multiple of 8 and 1-256 box rows (got " +
                std::to_string(columns) + " columns, " + std::to_string(rows) + " rows, box " +
                std::to_string(box_rows) + ")");
  }
  CUtensorMap map;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(columns), static_cast<cuuint64_t>(rows)};
  const cuuint64_t row_stride_bytes[1] = {static_cast<cuuint64_t>(columns) * 2};
  const cuuint32_t box[2] = {64, static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t element_strides[2] = {1, 1};
  const CUresult status = encode_tiled()(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(base), dims,
                                         row_stride_bytes, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                         CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                         CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (status != CUDA_SUCCESS) throw Error(what + ": cuTensorMapEncodeTiled failed (CUresult " + std::to_string(status) + ")");
  kernels::TensorMap result;
  std::memcpy(&result, &map, sizeof(map));
  return result;
}

}  // namespace mxmoe
