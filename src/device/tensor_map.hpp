// Tensor maps for the bulk tensor copies (cp.async.bulk.tensor) of the wgmma family, encoded on the
// host through the driver's cuTensorMapEncodeTiled (reached by the runtime's entry-point query, so
// that the library links no libcuda of its own).
#pragma once

#include <string>

#include "device/tensor_map_param.hpp"

namespace mxmoe {

// The map of a bf16 row-major matrix [rows, columns] at `base` whose copies bring boxes of
// `box_rows` rows x 64 columns (128 bytes a row) into shared memory in the 128-byte swizzle that
// wgmma's descriptors read (kernels/wgmma.cuh); reads past either edge fill zeros. `base` 16-byte
// aligned, `columns` a multiple of 8, `box_rows` at most 256. Throws Error naming `what` otherwise or
// when the driver refuses.
kernels::TensorMap bf16_rows_map(const void* base, int columns, long long rows, int box_rows, const std::string& what);

// The map of `experts` matrices of MXFP4 records (format/record_layout.hpp), each stored row-tile
// major, [experts][row_tiles][k_tiles] records of 544 bytes at `base`, whose copies bring
// `box_records` consecutive row tiles' records of one K tile of one expert into shared memory as they
// are (544 bytes apart, no swizzle), at coordinates (0, K tile, first row tile, expert). Row tiles
// past the expert's last fill zeros and are not read, so an expert's last, partial row block reads
// only its own rows. One such copy takes the place of `box_records` bulk copies, which the copy
// engine issues one at a time. `base` 16-byte aligned, `box_records` 1-256. Throws Error naming
// `what` otherwise or when the driver refuses.
kernels::TensorMap records_map(const void* base, int experts, int row_tiles, int k_tiles, int box_records,
                               const std::string& what);

}  // namespace mxmoe
