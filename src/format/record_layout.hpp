// The layouts of the packed data the expert kernels read: the MXFP4 weight record and the MXFP8
// activation row. One definition for every side: format/ packs and unpacks them
// (mxfp4_records.cpp, mxfp8_rows.cpp), device/ describes a record to the copy engine
// (tensor_map.cpp), and the kernels read them (kernels/mxfp4_fragment.cuh dequantises a record,
// kernels/block_scaled_mma.cuh and kernels/mxfp8_quantize.cuh use the MXFP8 order). No headers,
// only constants and host-device functions, so that NVRTC compiles it as it is.
//
// MXFP4 record. A weight matrix [rows, K] (rows a multiple of 16, K a multiple of 32, padded to 64)
// is cut into records of 16 rows x 64 K, stored row-tile major (all K records of rows 0-15, then
// rows 16-31...), so that a CTA walking K over its rows reads one contiguous stream:
//
//   record = 512 bytes of E2M1 values, then 32 bytes of E8M0 scales  (544 bytes, 16-byte aligned)
//
// Values: lane l of a warp owns bytes [16 l, 16 l + 16): one 32-bit word per 16-wide k-step j of the
// record. With g = l / 4 and c = 2 (l % 4), word j holds exactly the eight elements that the
// m16n8k16 A fragment (row-major 16 x 16 tile at K offset 16 j) gives lane l (record_element):
//   fragment register i      elements (row, k - 16 j)
//   0  a0 a1                 (g, c), (g, c + 1)
//   1  a2 a3                 (g + 8, c), (g + 8, c + 1)
//   2  a4 a5                 (g, c + 8), (g, c + 9)
//   3  a6 a7                 (g + 8, c + 8), (g + 8, c + 9)
// Why: one 16-byte load per lane per record feeds four MMAs with no shuffles between lanes. Within
// the word the E2M1 code bits are not nibbles: each register's two elements are spread
// (e2m1_code_bit) so that one rotation and one mask turn them into a bf16x2 register
// (kernels/mxfp4_fragment.cuh, e2m1_pair_bits): 9 integer operations a word, where nibbles cost 15.
// Scales: word g (bytes 512 + 4 g) = [s(g, b0), s(g + 8, b0), s(g, b1), s(g + 8, b1)], where b0
// covers k-steps 0-1 and b1 k-steps 2-3 (record_scale_element). Why: the four lanes of a quad hold
// the same two rows, so they read one word that has both rows' scales for both 32-K blocks.
// FC1's rows are reordered (fc1_checkpoint_row): record rows 0-7 hold the glu rows of 8 outputs and
// rows 8-15 the linear rows of the same outputs, so that the thread that holds glu(j) in its
// accumulators also holds lin(j) and applies the SwiGLU with no exchange.
// The same fragment is also the B operand of a weight-as-B MMA, so the layout does not fix an
// orientation; mxmoe's kernels put weight rows on the MMA's M side and tokens on its N side.
//
// MXFP8 rows, the block-scaled tiles' input (kernels/expert_block_scaled_tile.cuh): `rows` rows of K
// (a multiple of 32) in k_tiles = ceil(K / 64) slices of 64, as
//   codes  [rows][k_tiles][64 bytes]: each slice in lane order, the 16 bytes at 16 t holding what
//          lane t of a quad hands the MMA: block 0's words t and t + 4, then block 1's (its two B
//          registers per block, one 16-byte load; mxfp8_slice_word_byte);
//   scales [k_tiles][rows] words, slice-major (a token tile's words of one slice are adjacent):
//          [s(b0), 0, s(b1), 0], the token's scale-B register of kernels/block_scaled_mma.cuh as
//          it is.
// Within each 32-K block the codes stand in the MMA's order, not in K order: position p holds
// k = mma_order_k(p). Why: a lane's record words hold, per row and 32-K block, k = 2 t + {0, 1, 8, 9}
// and 16 + those, so with that order the m16n8k32 A bytes come out of the record word with no
// shuffle, and a token row stored in the same order gives a lane its B registers as the two aligned
// words at bytes 4 t and 16 + 4 t. A slice's second block past K holds zero codes and scale code 0,
// so the MMA adds exact zeros.
#pragma once

#if defined(__CUDACC__)
#define MXMOE_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define MXMOE_HOST_DEVICE inline
#endif

namespace mxmoe::kernels {

constexpr int kRecordRows = 16;
constexpr int kRecordK = 64;
constexpr int kRecordValueBytes = 512;
constexpr int kRecordScaleBytes = 32;
constexpr int kRecordBytes = kRecordValueBytes + kRecordScaleBytes;
static_assert(kRecordValueBytes * 2 == kRecordRows * kRecordK, "a record's values are 4 bits each");
static_assert(kRecordScaleBytes * 32 == kRecordRows * kRecordK, "a record holds one scale per 32 values");
static_assert(kRecordValueBytes == 32 * 16 && kRecordScaleBytes == 8 * 4,
              "a record is 16 value bytes per lane and one scale word per quad");
static_assert(kRecordBytes % 16 == 0, "records stay 16-byte aligned");

// A place in a record: row 0-15, k 0-63.
struct RecordPlace {
  int row, k;
};

// The element that element `half` (0: a0/a2/a4/a6, 1: the other) of fragment register `reg` of
// lane `lane`'s word for k-step j holds (the table above).
MXMOE_HOST_DEVICE RecordPlace record_element(int lane, int j, int reg, int half) {
  const int g = lane / 4, c = 2 * (lane % 4);
  const int row = g + ((reg == 1 || reg == 3) ? 8 : 0);
  const int col = c + ((reg >= 2) ? 8 : 0) + half;
  return {row, 16 * j + col};
}

// The block that scale byte `byte` (0-3) of quad word g scales: its row and its first k.
MXMOE_HOST_DEVICE RecordPlace record_scale_element(int g, int byte) { return {g + ((byte % 2) ? 8 : 0), 32 * (byte / 2)}; }

// Where the code bits sit. Element `half` of fragment register `reg` is wanted as bf16 bits worth
// value * 2^-126: code bit b (0: mantissa, 1-2: exponent, 3: sign) at bf16x2 bit 6 + b (b < 3) or
// 15, plus 16 for the high half, so exponent field 0 gives the E2M1 subnormal 0.5 as the bf16
// subnormal 2^-127. In the stored word that bit sits pair_rotation(reg, b) places lower (mod 32),
// and the four registers' rotations (0, 4, 10, and 6 / 14 for register 3's exponent bit 1) tile the
// word's 32 bits exactly. Registers 0-2 so cost one rotate and one mask and register 3 four
// operations: 9 per word, where nibbles cost 15.
MXMOE_HOST_DEVICE int pair_rotation(int reg, int bit) {
  return reg == 0 ? 0 : reg == 1 ? 4 : reg == 2 ? 10 : (bit == 2 ? 14 : 6);
}
MXMOE_HOST_DEVICE int e2m1_code_bit(int reg, int half, int bit) {
  const int target = (bit < 3 ? 6 + bit : 15) + 16 * half;
  return (target - pair_rotation(reg, bit) + 32) % 32;
}

// The word bits that store E2M1 `code` as element `half` of register `reg`, and the reverse.
MXMOE_HOST_DEVICE unsigned e2m1_place_code(unsigned code, int reg, int half) {
  unsigned word = 0;
  for (int bit = 0; bit < 4; ++bit) word |= ((code >> bit) & 1u) << e2m1_code_bit(reg, half, bit);
  return word;
}
MXMOE_HOST_DEVICE unsigned e2m1_code_at(unsigned word, int reg, int half) {
  unsigned code = 0;
  for (int bit = 0; bit < 4; ++bit) code |= ((word >> e2m1_code_bit(reg, half, bit)) & 1u) << bit;
  return code;
}

// Whether all four E8M0 codes of a scale word lie in [1, 128], where 2^(s - 1) is a normal bf16
// (kernels/mxfp4_fragment.cuh dequantises such records with one multiply). Adding 127 to a byte
// sets its top bit, and carries out of none, iff its code is in range; a carry only ever follows a
// byte that already failed, so one add and one mask test the four codes at once.
MXMOE_HOST_DEVICE bool scale_codes_take_one_multiply(unsigned scale_word) {
  return ((scale_word + 0x7F7F7F7Fu) & 0x80808080u) == 0x80808080u;
}

// The checkpoint row of packed row `packed_row` of FC1 (`rows` = 2 I rows): record rows 0-7 of row
// tile t are the glu (gate) rows of outputs 8 t .. 8 t + 7, rows 8-15 the linear (up) rows of the
// same outputs. The checkpoint interleaves them (glu 2 j, linear 2 j + 1: gpt-oss) or concatenates
// them (glu j, linear I + j: DeepSeek-V4's [w1; w3]); layer_spec.hpp's GateUpLayout.
MXMOE_HOST_DEVICE int fc1_checkpoint_row(int packed_row, int rows, bool concatenated) {
  const int output = 8 * (packed_row / 16) + packed_row % 8;
  const int linear = (packed_row % 16) >= 8 ? 1 : 0;
  return concatenated ? output + linear * (rows / 2) : 2 * output + linear;
}

constexpr int kMxfp8SliceBytes = 64;  // one row's 64 K of codes

// The scale block's k at MMA position p (a permutation of 0-31 within each block).
MXMOE_HOST_DEVICE int mma_order_k(int position) {
  const int upper = position / 16, t = position % 16 / 4, i = position % 4;
  return 16 * upper + 2 * t + i % 2 + 8 * (i / 2);
}

// Where word `word` (0-7: bytes 4 word .. of the block in MMA order) of block `block` (0, 1) of a
// slice lies within the slice's 64 bytes.
MXMOE_HOST_DEVICE int mxfp8_slice_word_byte(int block, int word) { return 16 * (word % 4) + 4 * (2 * block + word / 4); }

// Bytes of MXFP8 rows: codes, then the scale words.
MXMOE_HOST_DEVICE constexpr long long mxfp8_codes_bytes(long long rows, int k_tiles) { return rows * k_tiles * kMxfp8SliceBytes; }
MXMOE_HOST_DEVICE constexpr long long mxfp8_rows_bytes(long long rows, int k) {
  return mxfp8_codes_bytes(rows, (k + 63) / 64) + rows * ((k + 63) / 64) * 4;
}

}  // namespace mxmoe::kernels
