// Repacking checkpoint MXFP4 matrices ([experts, rows, K/32, 16] values, [experts, rows, K/32]
// scales) into the record layout of format/record_layout.hpp, and back (for round-trip tests).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace mxmoe {

enum class RowOrder {
  kIdentity,                 // packed row r = checkpoint row r (FC2)
  kGluLinSplit,              // FC1: record rows 0-7 glu, 8-15 linear of the same 8 outputs, from
                             // checkpoint rows that interleave them (glu 2 j, linear 2 j + 1)
  kGluLinSplitConcatenated,  // the same records from checkpoint rows [glu; linear] (glu j, linear I + j)
};

inline constexpr RowOrder kRowOrders[] = {RowOrder::kIdentity, RowOrder::kGluLinSplit,
                                          RowOrder::kGluLinSplitConcatenated};
// "identity", "glu/lin interleaved", "glu/lin concatenated".
const char* row_order_name(RowOrder order);

// FC1's row order for the layer's gate/up layout.
inline RowOrder fc1_row_order(bool gate_up_concatenated) {
  return gate_up_concatenated ? RowOrder::kGluLinSplitConcatenated : RowOrder::kGluLinSplit;
}

struct RecordGeometry {
  int experts = 0;
  int rows = 0;  // multiple of 16
  int k = 0;     // multiple of 32

  int row_tiles() const { return rows / 16; }
  int k_tiles() const { return (k + 63) / 64; }
  size_t records_per_expert() const { return static_cast<size_t>(row_tiles()) * k_tiles(); }
  size_t bytes() const;
  int checkpoint_row(int packed_row, RowOrder order) const;
};

// Throws Error if the sizes disagree with the geometry. Parallel over experts and row tiles.
std::vector<uint8_t> pack_records(const RecordGeometry& g, RowOrder order, std::span<const uint8_t> blocks,
                                  std::span<const uint8_t> scales);
void unpack_records(const RecordGeometry& g, RowOrder order, std::span<const uint8_t> records,
                    std::span<uint8_t> blocks, std::span<uint8_t> scales);

// Whether every E8M0 code of `scales` lies in [1, 128], the range in which the kernels dequantise
// with one multiply (kernels::scale_codes_take_one_multiply); the records' K padding holds code 127.
bool scales_take_one_multiply(std::span<const uint8_t> scales);

// Per-row vectors (biases) in packed row order, as float.
std::vector<float> pack_row_vector(const RecordGeometry& g, RowOrder order, std::span<const uint16_t> bf16_bits);

}  // namespace mxmoe
