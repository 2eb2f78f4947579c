#include "device/tensor_map.hpp"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <string>

#include "device/cuda_check.hpp"
#include "format/record_layout.hpp"

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

kernels::TensorMap encoded(CUtensorMapDataType type, cuuint32_t rank, const void* base, const cuuint64_t* dims,
                           const cuuint64_t* strides_bytes, const cuuint32_t* box, CUtensorMapSwizzle swizzle,
                           const std::string& what) {
  CUtensorMap map;
  const cuuint32_t element_strides[4] = {1, 1, 1, 1};
  const CUresult status =
      encode_tiled()(&map, type, rank, const_cast<void*>(base), dims, strides_bytes, box, element_strides,
                     CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                     CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (status != CUDA_SUCCESS) throw Error(what + ": cuTensorMapEncodeTiled failed (CUresult " + std::to_string(status) + ")");
  kernels::TensorMap result;
  std::memcpy(&result, &map, sizeof(map));
  return result;
}

}  // namespace

kernels::TensorMap bf16_rows_map(const void* base, int columns, long long rows, int box_rows, const std::string& what) {
  if (reinterpret_cast<std::uintptr_t>(base) % 16 != 0 || columns <= 0 || columns % 8 != 0 || rows <= 0 ||
      box_rows < 1 || box_rows > 256) {
    throw Error(what + ": a tensor map needs a 16-byte aligned base, columns a multiple of 8 and 1-256 box rows (got " +
                std::to_string(columns) + " columns, " + std::to_string(rows) + " rows, box " +
                std::to_string(box_rows) + ")");
  }
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(columns), static_cast<cuuint64_t>(rows)};
  const cuuint64_t row_stride_bytes[1] = {static_cast<cuuint64_t>(columns) * 2};
  const cuuint32_t box[2] = {64, static_cast<cuuint32_t>(box_rows)};
  return encoded(CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, base, dims, row_stride_bytes, box, CU_TENSOR_MAP_SWIZZLE_128B,
                 what);
}

kernels::TensorMap records_map(const void* base, int experts, int row_tiles, int k_tiles, int box_records,
                               const std::string& what) {
  if (reinterpret_cast<std::uintptr_t>(base) % 16 != 0 || experts <= 0 || row_tiles <= 0 || k_tiles <= 0 ||
      box_records < 1 || box_records > 256) {
    throw Error(what + ": a records map needs a 16-byte aligned base, experts, row and K tiles, and 1-256 records a box (got " +
                std::to_string(experts) + " experts, " + std::to_string(row_tiles) + " row tiles, " +
                std::to_string(k_tiles) + " K tiles, box " + std::to_string(box_records) + ")");
  }
  // A record as 136 four-byte words; K tiles 544 bytes apart, row tiles k_tiles records apart,
  // experts row_tiles x k_tiles records apart.
  constexpr int kRecordWords = kernels::kRecordBytes / 4;
  const cuuint64_t dims[4] = {kRecordWords, static_cast<cuuint64_t>(k_tiles), static_cast<cuuint64_t>(row_tiles),
                              static_cast<cuuint64_t>(experts)};
  const cuuint64_t row_tile_bytes = static_cast<cuuint64_t>(k_tiles) * kernels::kRecordBytes;
  const cuuint64_t strides_bytes[3] = {kernels::kRecordBytes, row_tile_bytes, row_tile_bytes * row_tiles};
  const cuuint32_t box[4] = {kRecordWords, 1, static_cast<cuuint32_t>(box_records), 1};
  return encoded(CU_TENSOR_MAP_DATA_TYPE_UINT32, 4, base, dims, strides_bytes, box, CU_TENSOR_MAP_SWIZZLE_NONE, what);
}

}  // namespace mxmoe
