// The record repack's steps: checkpoint-layout MXFP4 matrices (values [experts, rows, K/2], scales
// [experts, rows, K/32]) into the records of format/record_layout.hpp, byte for byte what
// pack_records writes on the host (its K padding included: zero codes, scale code 127), through the
// same definitions (record_element, e2m1_place_code, record_scale_element, fc1_checkpoint_row).
// Host-device functions of one thread's part of one item: repack_records.cu runs them as a CTA's
// threads, and tests/cpu/test_load_kernels.cpp runs them one thread after another on the CPU.
//
// An item is one row tile (16 packed rows) of one expert over kChunkTiles consecutive K tiles. Its
// CTA stages the 16 checkpoint rows' kChunkTiles x 32 value bytes (one 16-byte load a thread, 16
// threads over each row's contiguous bytes) and their scales in shared memory, then warp w builds K
// tile w's record: each lane its 16 value bytes (one 16-byte store, the warp's 512 contiguous), and
// lanes 0-7 the quads' scale words. Staging tests every scale code for the one-multiply range, so
// the runner needs no second read of the scales.
//
// Budget: every checkpoint byte is read once and every record byte written once (a record's 544
// bytes hold 16 x 64 values: 17/32 of a byte each, as the checkpoint's), so a gpt-oss-120b layer is
// 1.69 GB in and 1.69 GB out (K = 2880 is 45 tiles: no padding), ~1.1 ms at the H100's ~3 TB/s,
// bound by DRAM. The arithmetic (a lane's 32 shared byte loads and 32 code placements of a dozen
// integer operations per record) is of the same order, so expect 1-3 ms, far inside the load's
// budget (0.5 s a layer), which the host side's copies dominate.
#pragma once

#include <cstdint>

#include "format/mxfp4_block_encode.hpp"
#include "format/mxfp4_records.hpp"
#include "format/record_layout.hpp"
#include "load/host_device.hpp"
#include "mxmoe/mx_format.hpp"

namespace mxmoe::load {

constexpr int kChunkTiles = 8;  // K tiles an item covers: one per warp
constexpr int kRepackThreads = 32 * kChunkTiles;
constexpr int kChunkValueBytes = kChunkTiles * kernels::kRecordK / 2;  // a row's value bytes in an item
constexpr int kChunkScales = kChunkTiles * 2;                          // a row's scales in an item
// 16 bytes past a row, so that the eight quads of a warp, each reading one word of row g or g + 8,
// hit eight different banks.
constexpr int kStagedRowBytes = kChunkValueBytes + 16;
static_assert(kernels::kRecordRows * kChunkValueBytes / 16 == kRepackThreads, "one 16-byte load a thread");
static_assert(kernels::kRecordRows * kChunkScales == kRepackThreads, "one scale byte a thread");

struct RepackArgs {
  const uint8_t* blocks;  // 16-byte aligned
  const uint8_t* scales;
  uint8_t* records;  // 16-byte aligned
  int rows, k, row_tiles, k_tiles, k_chunks;
  long long items;  // experts x row tiles x K chunks
  int row_order;  // RowOrder
};

// The checkpoint row, within its expert, of packed row `packed_row` of a matrix of `rows` rows in
// `row_order` (a RowOrder).
MXMOE_HOST_DEVICE int checkpoint_row_of(int packed_row, int rows, int row_order) {
  return row_order == static_cast<int>(RowOrder::kIdentity)
             ? packed_row
             : kernels::fc1_checkpoint_row(packed_row, rows,
                                           row_order == static_cast<int>(RowOrder::kGluLinSplitConcatenated));
}

inline RepackArgs repack_args(const RecordGeometry& g, RowOrder order, const uint8_t* blocks, const uint8_t* scales,
                              uint8_t* records) {
  const int k_chunks = (g.k_tiles() + kChunkTiles - 1) / kChunkTiles;
  return {.blocks = blocks,
          .scales = scales,
          .records = records,
          .rows = g.rows,
          .k = g.k,
          .row_tiles = g.row_tiles(),
          .k_tiles = g.k_tiles(),
          .k_chunks = k_chunks,
          .items = static_cast<long long>(g.experts) * g.row_tiles() * k_chunks,
          .row_order = static_cast<int>(order)};
}

struct RepackStage {
  alignas(16) uint8_t values[kernels::kRecordRows][kStagedRowBytes];
  uint8_t scales[kernels::kRecordRows][kChunkScales];
};

// The checkpoint row (over all experts) of packed row `row` (0-15) of `item`'s row tile.
MXMOE_HOST_DEVICE long long repack_source_row(const RepackArgs& a, long long item, int row) {
  const long long row_tile = item / a.k_chunks;  // over all experts: expert * row_tiles + tile
  const int packed_row = 16 * static_cast<int>(row_tile % a.row_tiles) + row;
  return row_tile / a.row_tiles * a.rows + checkpoint_row_of(packed_row, a.rows, a.row_order);
}

// Thread t's part of staging `item`: 16 value bytes and one scale. Returns whether that scale (a
// checkpoint one, not padding) lies outside the one-multiply range [1, 128].
MXMOE_HOST_DEVICE bool stage_repack_item(const RepackArgs& a, long long item, int t, RepackStage& stage) {
  const int chunk = static_cast<int>(item % a.k_chunks);
  const int row_bytes = a.k / 2, row_scales = a.k / 32;
  const int value_row = t / (kChunkValueBytes / 16), piece = t % (kChunkValueBytes / 16);
  const int byte = chunk * kChunkValueBytes + 16 * piece;
  uint4 values = {0, 0, 0, 0};  // K padding: zero codes
  if (byte < row_bytes) values = load16(a.blocks + repack_source_row(a, item, value_row) * row_bytes + byte);
  store16(&stage.values[value_row][16 * piece], values);

  const int scale_row = t / kChunkScales, index = t % kChunkScales;
  const int block = chunk * kChunkScales + index;
  uint8_t scale = kE8m0Bias;  // K padding: 2^0
  bool out_of_range = false;
  if (block < row_scales) {
    scale = a.scales[repack_source_row(a, item, scale_row) * row_scales + block];
    out_of_range = !kernels::scale_codes_take_one_multiply(0x01010101u * scale);
  }
  stage.scales[scale_row][index] = scale;
  return out_of_range;
}

// Lane `lane` of warp `warp`, once `item` is staged: its 16 bytes of K tile `warp`'s record, and for
// lanes 0-7 their quad's scale word.
MXMOE_HOST_DEVICE void write_record(const RepackArgs& a, long long item, int warp, int lane, const RepackStage& stage) {
  const int k_tile = static_cast<int>(item % a.k_chunks) * kChunkTiles + warp;
  if (k_tile >= a.k_tiles) return;
  uint8_t* record = a.records + (item / a.k_chunks * a.k_tiles + k_tile) * kernels::kRecordBytes;
  unsigned words[4];
  for (int j = 0; j < 4; ++j) {
    words[j] = 0;
    for (int reg = 0; reg < 4; ++reg) {
      for (int half = 0; half < 2; ++half) {
        const kernels::RecordPlace e = kernels::record_element(lane, j, reg, half);
        const unsigned pair = stage.values[e.row][kernels::kRecordK / 2 * warp + e.k / 2];
        words[j] |= kernels::e2m1_place_code((pair >> (4 * (e.k % 2))) & 0xFu, reg, half);
      }
    }
  }
  store16(record + 16 * lane, uint4{words[0], words[1], words[2], words[3]});
  if (lane < 8) {
    unsigned word = 0;
    for (int byte = 0; byte < 4; ++byte) {
      const kernels::RecordPlace e = kernels::record_scale_element(lane, byte);
      word |= static_cast<unsigned>(stage.scales[e.row][2 * warp + e.k / 32]) << (8 * byte);
    }
    store4(record + kernels::kRecordValueBytes + 4 * lane, word);
  }
}

// Value i of a packed row vector [experts, rows] (pack_row_vector's): its expert's checkpoint row's,
// as float. T: uint16_t (bf16 bits) or float.
template <typename T>
MXMOE_HOST_DEVICE float packed_row_value(const T* values, int rows, int row_order, long long i) {
  const int r = static_cast<int>(i % rows);
  const T v = values[i - r + checkpoint_row_of(r, rows, row_order)];
  if constexpr (sizeof(T) == 2) {
    return format::bits_float(static_cast<uint32_t>(v) << 16);
  } else {
    return v;
  }
}

}  // namespace mxmoe::load
