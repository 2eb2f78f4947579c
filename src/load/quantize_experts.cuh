// The device quantiser's steps: dense experts [experts, K, rows] (transformers' gate_up [E, H, 2I]
// and down [E, I, H], bf16 or fp32) into MXFP4 in the checkpoint layout (values [experts, rows,
// K/32, 16], scales [experts, rows, K/32]), each 32-long run along K of one row being one block,
// encoded by format/mxfp4_block_encode.hpp: the codes quantize_mxfp4 gives on the host, bit for
// bit. Host-device functions of one thread's part of one item: quantize_experts.cu runs them as a
// CTA's threads, and tests/cpu/test_load_kernels.cpp one thread after another on the CPU.
//
// A block's 32 values lie `rows` apart in the input, so an item (a tile of kTileK x kTileRows) goes
// through shared memory: its CTA loads the tile (16-byte loads, each K row of the tile contiguous),
// warp w encodes block w of the tile with one lane per row, and the CTA writes the tile's blocks as
// 16-byte stores and its scales as bytes, each row's kTileBlocks blocks contiguous.
//
// Budget: reads every dense value once and writes 17/32 of a byte per value; a gpt-oss-120b layer
// in bf16 is 6.4 GB in and 1.7 GB out, ~2.7 ms at the H100's ~3 TB/s, bound by DRAM (the encode is
// ~12 operations a value, ~1 ms of the SMs' rate).
#pragma once

#include <cstdint>

#include "format/mxfp4_block_encode.hpp"
#include "load/host_device.hpp"
#include "mxmoe/mx_format.hpp"

namespace mxmoe::load {

constexpr int kTileRows = 32;   // a warp's lanes, one row each
constexpr int kTileBlocks = 4;  // one per warp
constexpr int kTileK = kMxBlock * kTileBlocks;
constexpr int kQuantizeThreads = 32 * kTileBlocks;
static_assert(kTileRows == 8 * kTileBlocks, "write_quantize_item: a warp writes 8 rows, a quarter-warp a block");
// 4 floats past a row, so that the 16-byte stores of the eight lanes of a quarter-warp (two K rows)
// fall in different banks.
constexpr int kStagedRowFloats = kTileRows + 4;

struct QuantizeArgs {
  const void* dense;  // 16-byte aligned
  uint8_t* blocks;    // 16-byte aligned
  uint8_t* scales;
  int k, rows, row_tiles, k_tiles;  // k and rows multiples of 32
  long long items;                  // experts x row tiles x K tiles
};

inline QuantizeArgs quantize_args(const void* dense, int experts, int k, int rows, uint8_t* blocks, uint8_t* scales) {
  const int row_tiles = rows / kTileRows, k_tiles = (k + kTileK - 1) / kTileK;
  return {.dense = dense,
          .blocks = blocks,
          .scales = scales,
          .k = k,
          .rows = rows,
          .row_tiles = row_tiles,
          .k_tiles = k_tiles,
          .items = static_cast<long long>(experts) * row_tiles * k_tiles};
}

// The tile as floats, then its encoded blocks: block-major, so that a warp's 16-byte stores of one
// block column and a quarter-warp's loads of eight rows of one are each contiguous.
struct QuantizeStage {
  alignas(16) float tile[kTileK][kStagedRowFloats];
  alignas(16) uint32_t packed[kTileBlocks][kTileRows][4];
  uint8_t scales[kTileBlocks][kTileRows];
};

// Where `item`'s tile lies: its first row over all experts' rows, and its first K.
struct QuantizeTile {
  long long row0;
  int k0;
};
MXMOE_HOST_DEVICE QuantizeTile quantize_tile(const QuantizeArgs& a, long long item) {
  const long long row_tile = item / a.k_tiles;  // over all experts: expert * row_tiles + tile
  return {row_tile / a.row_tiles * a.rows + row_tile % a.row_tiles * kTileRows,
          static_cast<int>(item % a.k_tiles) * kTileK};
}

// Thread t's part of loading `item`'s tile (T: uint16_t, bf16 bits, or float), as floats.
template <typename T>
MXMOE_HOST_DEVICE void stage_quantize_item(const QuantizeArgs& a, long long item, int t, QuantizeStage& stage) {
  constexpr int kVector = 16 / sizeof(T);  // values a 16-byte load brings
  constexpr int kVectorsPerK = kTileRows / kVector;
  const QuantizeTile tile = quantize_tile(a, item);
  const long long expert = tile.row0 / a.rows, row_in_expert = tile.row0 % a.rows;
  for (int v = t; v < kTileK * kVectorsPerK; v += kQuantizeThreads) {
    const int kk = v / kVectorsPerK, column = v % kVectorsPerK * kVector;
    if (tile.k0 + kk >= a.k) continue;  // past K: the blocks there are not encoded
    const uint4 bits =
        load16(static_cast<const T*>(a.dense) + (expert * a.k + tile.k0 + kk) * a.rows + row_in_expert + column);
    const unsigned words[4] = {bits.x, bits.y, bits.z, bits.w};
    float* to = &stage.tile[kk][column];
    for (int i = 0; i < 4; ++i) {
      if constexpr (sizeof(T) == 2) {
        to[2 * i] = format::bits_float(words[i] << 16);
        to[2 * i + 1] = format::bits_float(words[i] & 0xFFFF0000u);
      } else {
        to[i] = format::bits_float(words[i]);
      }
    }
  }
}

// Lane `lane` of warp `warp`, once the tile is staged: encodes block `warp` of row `lane`.
MXMOE_HOST_DEVICE void encode_quantize_item(const QuantizeArgs& a, long long item, int warp, int lane,
                                            QuantizeStage& stage) {
  if (quantize_tile(a, item).k0 + kMxBlock * warp >= a.k) return;
  float values[kMxBlock];
  for (int i = 0; i < kMxBlock; ++i) values[i] = stage.tile[kMxBlock * warp + i][lane];
  uint32_t words[4];
  stage.scales[warp][lane] = static_cast<uint8_t>(format::encode_mxfp4_block(values, words));
  store16(stage.packed[warp][lane], uint4{words[0], words[1], words[2], words[3]});
}

// Thread t's part of writing the encoded tile: one block's 16 bytes and its scale. Warp w writes
// rows 8w to 8w + 7, each quarter-warp one block column of them.
MXMOE_HOST_DEVICE void write_quantize_item(const QuantizeArgs& a, long long item, int t, const QuantizeStage& stage) {
  const QuantizeTile tile = quantize_tile(a, item);
  const int row = t / 32 * 8 + t % 8, b = t % 32 / 8;
  const int k_blocks = a.k / kMxBlock, block = tile.k0 / kMxBlock + b;
  if (block >= k_blocks) return;
  const long long at = (tile.row0 + row) * k_blocks + block;
  store16(a.blocks + at * 16, load16(stage.packed[b][row]));
  a.scales[at] = stage.scales[b][row];
}

}  // namespace mxmoe::load
