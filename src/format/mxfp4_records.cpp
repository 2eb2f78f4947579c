// Packing to and from the kernel record layout. Both directions walk the same (lane, k-step, nibble)
// -> (row, k) map, `element_of`, which is the fragment table of kernels/mxfp4_fragment.cuh.
#include "format/mxfp4_records.hpp"

#include <cstring>
#include <string>

#include "common/parallel.hpp"
#include "kernels/mxfp4_fragment.cuh"
#include "mxmoe/bf16.hpp"
#include "mxmoe/error.hpp"
#include "mxmoe/mx_format.hpp"

namespace mxmoe {
namespace {

using kernels::kRecordBytes;
using kernels::kRecordValueBytes;

struct Element {
  int row;  // within the record, 0-15
  int k;    // within the record, 0-63
};

// Nibble n (0-7) of lane `lane`'s word for k-step j. Inverse of the table in mxfp4_fragment.cuh:
// nibble n belongs to fragment register 3 - (n % 4), low half for n < 4.
Element element_of(int lane, int j, int nibble) {
  const int reg = 3 - nibble % 4;
  const int high_half = nibble / 4;
  const int g = lane / 4, c = 2 * (lane % 4);
  const int row = g + ((reg == 1 || reg == 3) ? 8 : 0);
  const int col = c + ((reg >= 2) ? 8 : 0) + high_half;
  return {row, 16 * j + col};
}

// Scale byte b (0-3) of quad word g: (row, which 32-block of the record).
Element scale_of(int g, int byte) { return {g + ((byte % 2) ? 8 : 0), 32 * (byte / 2)}; }

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

// Visits every (record byte address, checkpoint element) pair of one row tile of one expert.
template <typename Value, typename Scale>
void walk_row_tile(const RecordGeometry& g, RowOrder order, int expert, int row_tile, Value value, Scale scale) {
  for (int kt = 0; kt < g.k_tiles(); ++kt) {
    const size_t record = (static_cast<size_t>(expert) * g.row_tiles() + row_tile) * g.k_tiles() + kt;
    for (int lane = 0; lane < 32; ++lane) {
      for (int j = 0; j < 4; ++j) {
        for (int nibble = 0; nibble < 8; ++nibble) {
          const Element e = element_of(lane, j, nibble);
          const int k = 64 * kt + e.k;
          const size_t byte = record * kRecordBytes + 16 * lane + 4 * j + nibble / 2;
          value(byte, 4 * (nibble % 2), g.checkpoint_row(16 * row_tile + e.row, order), k);
        }
      }
    }
    for (int quad = 0; quad < 8; ++quad) {
      for (int b = 0; b < 4; ++b) {
        const Element e = scale_of(quad, b);
        scale(record * kRecordBytes + kRecordValueBytes + 4 * quad + b,
              g.checkpoint_row(16 * row_tile + e.row, order), 64 * kt + e.k);
      }
    }
  }
}

}  // namespace

size_t RecordGeometry::bytes() const { return static_cast<size_t>(experts) * records_per_expert() * kRecordBytes; }

int RecordGeometry::checkpoint_row(int packed_row, RowOrder order) const {
  return order == RowOrder::kIdentity ? packed_row : kernels::fc1_checkpoint_row(packed_row);
}

std::vector<uint8_t> pack_records(const RecordGeometry& g, RowOrder order, std::span<const uint8_t> blocks,
                                  std::span<const uint8_t> scales) {
  check(g, blocks.size(), scales.size(), g.bytes());
  std::vector<uint8_t> records(g.bytes(), 0);
  const size_t row_values = g.k;
  parallel_for(static_cast<size_t>(g.experts) * g.row_tiles(), 0, [&](size_t item) {
    const int expert = static_cast<int>(item / g.row_tiles()), row_tile = static_cast<int>(item % g.row_tiles());
    const size_t expert_row0 = static_cast<size_t>(expert) * g.rows;
    walk_row_tile(
        g, order, expert, row_tile,
        [&](size_t byte, int shift, int row, int k) {
          if (k >= g.k) return;  // K padding stays zero
          const size_t element = (expert_row0 + row) * row_values + k;
          const uint8_t code = (blocks[element / 2] >> (4 * (element % 2))) & 0xF;
          records[byte] |= static_cast<uint8_t>(code << shift);
        },
        [&](size_t byte, int row, int k) {
          records[byte] = k >= g.k ? static_cast<uint8_t>(kE8m0Bias)
                                   : scales[((expert_row0 + row) * row_values + k) / kMxBlock];
        });
  });
  return records;
}

void unpack_records(const RecordGeometry& g, RowOrder order, std::span<const uint8_t> records,
                    std::span<uint8_t> blocks, std::span<uint8_t> scales) {
  check(g, blocks.size(), scales.size(), records.size());
  std::memset(blocks.data(), 0, blocks.size());
  const size_t row_values = g.k;
  // Items own disjoint checkpoint rows (a row tile holds 16 whole rows in either order), so the
  // read-modify-writes of shared nibble bytes never cross items.
  parallel_for(static_cast<size_t>(g.experts) * g.row_tiles(), 0, [&](size_t item) {
    const int expert = static_cast<int>(item / g.row_tiles()), row_tile = static_cast<int>(item % g.row_tiles());
    const size_t expert_row0 = static_cast<size_t>(expert) * g.rows;
    walk_row_tile(
        g, order, expert, row_tile,
        [&](size_t byte, int shift, int row, int k) {
          if (k >= g.k) return;
          const size_t element = (expert_row0 + row) * row_values + k;
          blocks[element / 2] |= static_cast<uint8_t>(((records[byte] >> shift) & 0xF) << (4 * (element % 2)));
        },
        [&](size_t byte, int row, int k) {
          if (k < g.k) scales[((expert_row0 + row) * row_values + k) / kMxBlock] = records[byte];
        });
  });
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
