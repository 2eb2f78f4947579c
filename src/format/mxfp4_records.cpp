// Packing to and from the kernel record layout (format/record_layout.hpp). Both directions walk the
// same (lane, k-step, register, half) -> (row, k) map, record_element, and place a code's bits in
// the word with e2m1_place_code.
#include "format/mxfp4_records.hpp"

#include <algorithm>
#include <cstring>
#include <string>

#include "common/parallel.hpp"
#include "format/record_layout.hpp"
#include "mxmoe/bf16.hpp"
#include "mxmoe/error.hpp"
#include "mxmoe/mx_format.hpp"

namespace mxmoe {
namespace {

using kernels::kRecordBytes;
using kernels::kRecordValueBytes;
using kernels::RecordPlace;

void check(const RecordGeometry& g, size_t blocks, size_t scales, size_t records) {
  if (g.experts < 1 || g.rows < 16 || g.rows % 16 != 0 || g.k < 32 || g.k % 32 != 0) {
    throw Error("pack_records: rows must be a positive multiple of 16 and K of 32 (rows " + std::to_string(g.rows) +
                ", K " + std::to_string(g.k) + ")");
  }
  const size_t values = static_cast<size_t>(g.experts) * g.rows * g.k;
  if (blocks != values / 2 || scales != values / kMxBlock || records != g.bytes()) {
    throw Error("pack_records: expected " + std::to_string(values / 2) + " value bytes, " +
                std::to_string(values / kMxBlock) + " scales and " + std::to_string(g.bytes()) +
                " record bytes; got " + std::to_string(blocks) + ", " + std::to_string(scales) + ", " +
                std::to_string(records));
  }
}

// Calls value(word, reg, half, element) for every element of every record, where `word` is the
// byte offset of its 32-bit word, (reg, half) its place in the word, and `element` the checkpoint
// element it holds (its index in [experts, rows, K]) or -1 in the K padding, and
// scale(byte, block) for every scale byte, `block` being the checkpoint scale index or -1. Runs in
// parallel over (expert, row tile); items own disjoint checkpoint rows (a row tile holds 16 whole
// rows in either order), so read-modify-writes of shared words never cross items.
template <typename Value, typename Scale>
void walk_records(const RecordGeometry& g, RowOrder order, Value value, Scale scale) {
  parallel_for(static_cast<size_t>(g.experts) * g.row_tiles(), 0, [&](size_t item) {
    const size_t row0 = (item / g.row_tiles()) * g.rows;  // the expert's first checkpoint row
    const int row_tile = static_cast<int>(item % g.row_tiles());
    const size_t first_record = item * g.k_tiles();
    auto element_at = [&](int packed_row, int k) -> long long {
      if (k >= g.k) return -1;
      return static_cast<long long>((row0 + g.checkpoint_row(16 * row_tile + packed_row, order)) * g.k + k);
    };
    for (int kt = 0; kt < g.k_tiles(); ++kt) {
      const size_t record = first_record + kt;
      for (int lane = 0; lane < 32; ++lane) {
        for (int j = 0; j < 4; ++j) {
          for (int reg = 0; reg < 4; ++reg) {
            for (int half = 0; half < 2; ++half) {
              const RecordPlace e = kernels::record_element(lane, j, reg, half);
              value(record * kRecordBytes + 16 * lane + 4 * j, reg, half, element_at(e.row, 64 * kt + e.k));
            }
          }
        }
      }
      for (int quad = 0; quad < 8; ++quad) {
        for (int b = 0; b < 4; ++b) {
          const RecordPlace e = kernels::record_scale_element(quad, b);
          const long long element = element_at(e.row, 64 * kt + e.k);
          scale(record * kRecordBytes + kRecordValueBytes + 4 * quad + b, element < 0 ? -1 : element / kMxBlock);
        }
      }
    }
  });
}

}  // namespace

size_t RecordGeometry::bytes() const { return static_cast<size_t>(experts) * records_per_expert() * kRecordBytes; }

const char* row_order_name(RowOrder order) {
  switch (order) {
    case RowOrder::kIdentity:
      return "identity";
    case RowOrder::kGluLinSplit:
      return "glu/lin interleaved";
    case RowOrder::kGluLinSplitConcatenated:
      return "glu/lin concatenated";
  }
  return "?";
}

int RecordGeometry::checkpoint_row(int packed_row, RowOrder order) const {
  return order == RowOrder::kIdentity ? packed_row
                                      : kernels::fc1_checkpoint_row(packed_row, rows,
                                                                    order == RowOrder::kGluLinSplitConcatenated);
}

std::vector<uint8_t> pack_records(const RecordGeometry& g, RowOrder order, std::span<const uint8_t> blocks,
                                  std::span<const uint8_t> scales) {
  check(g, blocks.size(), scales.size(), g.bytes());
  std::vector<uint8_t> records(g.bytes(), 0);
  walk_records(
      g, order,
      [&](size_t word, int reg, int half, long long element) {
        if (element < 0) return;  // K padding stays zero
        const unsigned code = (blocks[element / 2] >> (4 * (element % 2))) & 0xF;
        const unsigned bits = kernels::e2m1_place_code(code, reg, half);
        for (int b = 0; b < 4; ++b) records[word + b] |= static_cast<uint8_t>(bits >> (8 * b));
      },
      [&](size_t byte, long long block) { records[byte] = block < 0 ? static_cast<uint8_t>(kE8m0Bias) : scales[block]; });
  return records;
}

void unpack_records(const RecordGeometry& g, RowOrder order, std::span<const uint8_t> records,
                    std::span<uint8_t> blocks, std::span<uint8_t> scales) {
  check(g, blocks.size(), scales.size(), records.size());
  std::memset(blocks.data(), 0, blocks.size());
  walk_records(
      g, order,
      [&](size_t word, int reg, int half, long long element) {
        if (element < 0) return;
        uint32_t bits = 0;
        for (int b = 0; b < 4; ++b) bits |= static_cast<uint32_t>(records[word + b]) << (8 * b);
        blocks[element / 2] |= static_cast<uint8_t>(kernels::e2m1_code_at(bits, reg, half) << (4 * (element % 2)));
      },
      [&](size_t byte, long long block) {
        if (block >= 0) scales[block] = records[byte];
      });
}

bool scales_take_one_multiply(std::span<const uint8_t> scales) {
  return std::all_of(scales.begin(), scales.end(),
                     [](uint8_t s) { return kernels::scale_codes_take_one_multiply(0x01010101u * s); });
}

std::vector<float> pack_row_vector(const RecordGeometry& g, RowOrder order, std::span<const uint16_t> bf16_bits) {
  if (bf16_bits.size() != static_cast<size_t>(g.experts) * g.rows) {
    throw Error("pack_row_vector: expected " + std::to_string(static_cast<size_t>(g.experts) * g.rows) +
                " values, got " + std::to_string(bf16_bits.size()));
  }
  std::vector<float> out(bf16_bits.size());
  for (int e = 0; e < g.experts; ++e) {
    for (int r = 0; r < g.rows; ++r) {
      out[static_cast<size_t>(e) * g.rows + r] =
          bf16_to_float(Bf16{bf16_bits[static_cast<size_t>(e) * g.rows + g.checkpoint_row(r, order)]});
    }
  }
  return out;
}

}  // namespace mxmoe
