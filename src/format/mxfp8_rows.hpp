// MXFP8 rows in the layout the block-scaled tiles read (format/record_layout.hpp): from and to
// the plain form of quantize_mxfp8 (codes [rows][K] in K order, scales [rows][K / 32]). For the
// first-use self-check's inputs and for tests that read what the GPU wrote.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace mxmoe {

// Throws Error when K is not a positive multiple of 32 or the sizes disagree with rows and K.
std::vector<uint8_t> pack_mxfp8_rows(std::span<const uint8_t> codes, std::span<const uint8_t> scales, int rows, int k);
void unpack_mxfp8_rows(std::span<const uint8_t> packed, int rows, int k, std::span<uint8_t> codes,
                       std::span<uint8_t> scales);

}  // namespace mxmoe
