#include "format/mxfp8_rows.hpp"

#include <string>

#include "format/record_layout.hpp"
#include "mxmoe/error.hpp"
#include "mxmoe/mx_format.hpp"

namespace mxmoe {
namespace {

void check(const char* what, size_t packed, size_t codes, size_t scales, int rows, int k) {
  if (rows < 0 || k < kMxBlock || k % kMxBlock != 0) {
    throw Error(std::string(what) + ": K must be a positive multiple of 32 (rows " + std::to_string(rows) + ", K " +
                std::to_string(k) + ")");
  }
  const size_t values = static_cast<size_t>(rows) * k;
  const auto expected_packed = static_cast<size_t>(kernels::mxfp8_rows_bytes(rows, k));
  if (packed != expected_packed || codes != values || scales != values / kMxBlock) {
    throw Error(std::string(what) + ": expected " + std::to_string(expected_packed) + " packed bytes, " +
                std::to_string(values) + " codes and " + std::to_string(values / kMxBlock) + " scales; got " +
                std::to_string(packed) + ", " + std::to_string(codes) + ", " + std::to_string(scales));
  }
}

// Calls at(packed byte, row, k) for every code byte of the packed rows (k >= K: the slice's
// padding) and scale(packed byte, row, block) for every scale byte (block >= K / 32: padding;
// the word's bytes 1 and 3 are block -1).
template <typename Code, typename Scale>
void walk(int rows, int k, Code at, Scale scale) {
  const int k_tiles = (k + 63) / 64;
  const size_t scales_at = static_cast<size_t>(kernels::mxfp8_codes_bytes(rows, k_tiles));
  for (int row = 0; row < rows; ++row) {
    for (int kt = 0; kt < k_tiles; ++kt) {
      const size_t slice = (static_cast<size_t>(row) * k_tiles + kt) * kernels::kMxfp8SliceBytes;
      for (int block = 0; block < 2; ++block) {
        for (int position = 0; position < kMxBlock; ++position) {
          const int byte = kernels::mxfp8_slice_word_byte(block, position / 4) + position % 4;
          at(slice + byte, row, 64 * kt + kMxBlock * block + kernels::mma_order_k(position));
        }
      }
      const size_t word = scales_at + (static_cast<size_t>(kt) * rows + row) * 4;
      for (int b = 0; b < 4; ++b) scale(word + b, row, b % 2 ? -1 : 2 * kt + b / 2);
    }
  }
}

}  // namespace

std::vector<uint8_t> pack_mxfp8_rows(std::span<const uint8_t> codes, std::span<const uint8_t> scales, int rows, int k) {
  std::vector<uint8_t> packed(static_cast<size_t>(kernels::mxfp8_rows_bytes(rows, k > 0 ? k : 0)), 0);
  check("pack_mxfp8_rows", packed.size(), codes.size(), scales.size(), rows, k);
  walk(
      rows, k,
      [&](size_t byte, int row, int column) {
        if (column < k) packed[byte] = codes[static_cast<size_t>(row) * k + column];
      },
      [&](size_t byte, int row, int block) {
        if (block >= 0 && block < k / kMxBlock) packed[byte] = scales[static_cast<size_t>(row) * (k / kMxBlock) + block];
      });
  return packed;
}

void unpack_mxfp8_rows(std::span<const uint8_t> packed, int rows, int k, std::span<uint8_t> codes,
                       std::span<uint8_t> scales) {
  check("unpack_mxfp8_rows", packed.size(), codes.size(), scales.size(), rows, k);
  walk(
      rows, k,
      [&](size_t byte, int row, int column) {
        if (column < k) codes[static_cast<size_t>(row) * k + column] = packed[byte];
      },
      [&](size_t byte, int row, int block) {
        if (block >= 0 && block < k / kMxBlock) scales[static_cast<size_t>(row) * (k / kMxBlock) + block] = packed[byte];
      });
}

}  // namespace mxmoe
