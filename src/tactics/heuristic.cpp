#include "tactics/heuristic.hpp"

#include <algorithm>
#include <cmath>

#include "kernels/family_registry.hpp"

namespace mxmoe {
namespace {

// Decode: up to ~12 touched experts, per stage the 8-warp GEMV with the most rows a CTA (128, 64 or
// 32: fewer rows, more warps along K) whose grid still has kDecodeGridCtas CTAs, where FC1's grid
// fits one resident wave; then the stream-K GEMV (one 24-warp CTA an SM), 8 tokens a tile up to ~4
// expected rows per expert and 16 up to 12. Thresholds: docs/performance.md, "The heuristic's
// decisions".
const Tactic kGemvFewFc1{
    .family = &gemv_family(), .tile_rows = 64, .tile_tokens = 8, .warps_rows = 4, .warps_k = 2, .batch_records = 2};
const Tactic kGemvFewFc2{
    .family = &gemv_family(), .tile_rows = 32, .tile_tokens = 8, .warps_rows = 2, .warps_k = 4, .batch_records = 2};
const Tactic kGemvWide{
    .family = &gemv_family(), .tile_rows = 128, .tile_tokens = 8, .warps_rows = 8, .batch_records = 2};
const Tactic kStreamK{
    .family = &gemv_streamk_family(), .tile_rows = 384, .tile_tokens = 8, .warps_rows = 24, .batch_records = 2};
const Tactic kStreamK16{
    .family = &gemv_streamk_family(), .tile_rows = 384, .tile_tokens = 16, .warps_rows = 24, .batch_records = 2};
constexpr long long kStreamK16RowsExpected = 12;
// Enough CTAs of 8 warps to keep the weight loads of a 132-SM Hopper in flight: above 267 (gpt-oss-120b's
// FC2 at T = 3 on the GEMVs, to which the tuner gave 64 rows a CTA) and at most 337 (gpt-oss-20b's FC1
// at T = 2, 128 rows); DeepSeek-V4-Flash's FC1 at T = 1 (192 CTAs of 128 rows) runs 1.16x faster on
// 64 rows.
constexpr double kDecodeGridCtas = 300;
constexpr double kDecodeMaxTouched = 12;
// One resident wave of the 8-warp GEMV CTAs on a 132-SM Hopper (three an SM at up to 80 registers).
// An FC1 grid past it runs a second, partial wave and cannot route the batch itself (a routing
// launch before it): the stream-K GEMV was 4-11 % faster there (H200, FC1 CTAs: gpt-oss-20b T = 3
// 478, gpt-oss-120b T = 3 522, DeepSeek-V4-Pro T = 1 576 and T = 2 571), the GEMV 5-41 % faster up
// to 384 (gpt-oss T = 1-2, DeepSeek-V4-Flash T = 1-2).
constexpr double kDecodeWaveCtas = 396;

// A self-routed batch's FC2 sums each token's experts itself (the token-sum GEMV, no un-permute
// launch): up to kTokenSumTokens tokens at a top-k of at most kTokenSumClusterTopK, a CTA a pair
// (the decode GEMV's FC2 CTA) and a token's CTAs one cluster; for one token at top-6, the token's
// six pairs in one CTA. H200: gpt-oss T = 1 1.5-1.7 us and T = 2 1.2 us faster, V4-Flash T = 1
// 0.9 us; a CTA a pair at top-6 was 4.0-4.4 us slower, and the one CTA at T = 2 3.0 us slower
// (docs/performance.md, "The heuristic's decisions").
constexpr int kTokenSumTokens = 2;
constexpr int kTokenSumClusterTopK = 4;
const Tactic kTokenSumOneCta{.family = &gemv_token_sum_family(),
                             .tile_rows = 16,
                             .tile_tokens = 8,
                             .warps_rows = 1,
                             .warps_tokens = 6,
                             .warps_k = 2,
                             .batch_records = 2};

// The token-sum GEMV of the decode GEMV `gemv`'s CTA, a pair a CTA.
Tactic token_sum(const Tactic& gemv) {
  Tactic t = gemv;
  t.family = &gemv_token_sum_family();
  return t;
}

// FC2's tactic for a self-routed batch of `num_tokens` on the decode GEMVs, whose FC2 is `gemv`.
Tactic decode_fc2(const MoeShape& shape, int num_tokens, const Arch& arch, const Tactic& gemv) {
  const StageShape fc2{shape, Stage::kFc2};
  auto valid = [&](const Tactic& t) { return t.family->why_invalid(t, arch, &fc2).empty(); };
  if (num_tokens <= kTokenSumTokens && shape.top_k <= kTokenSumClusterTopK && valid(token_sum(gemv))) {
    return token_sum(gemv);
  }
  if (num_tokens == 1 && shape.top_k == kTokenSumOneCta.warps_tokens && valid(kTokenSumOneCta)) return kTokenSumOneCta;
  return gemv;
}

// The CTAs of a decode GEMV `t` over `touched` experts of `rows` weight rows.
double gemv_ctas(const Tactic& t, double touched, int rows) { return touched * ((rows + t.tile_rows - 1) / t.tile_rows); }

// The decode GEMV of a stage of `rows` weight rows over `touched` experts.
Tactic decode_gemv(double touched, int rows) {
  for (const Tactic& t : {kGemvWide, kGemvFewFc1}) {
    if (gemv_ctas(t, touched, rows) >= kDecodeGridCtas) return t;
  }
  return kGemvFewFc2;
}

// On sm_90a past the stream-K GEMV, the wgmma tile whose tokens the expected rows per expert fill,
// so that most experts take one tile; the 64- and 96-token tiles on four consumer warpgroups of one
// record a warp (their 112 registers hold up to 96 tokens' accumulators). Thresholds and ring
// depths: docs/performance.md, "The heuristic's decisions".
const Tactic kWgmma32{
    .family = &wgmma_family(), .tile_rows = 256, .tile_tokens = 32, .warps_rows = 8, .smem_stages = 7};
const Tactic kWgmma64{
    .family = &wgmma_family(), .tile_rows = 256, .tile_tokens = 64, .warps_rows = 16, .smem_stages = 6};
const Tactic kWgmma96{
    .family = &wgmma_family(), .tile_rows = 256, .tile_tokens = 96, .warps_rows = 16, .smem_stages = 6};
const Tactic kWgmmaPrefill{
    .family = &wgmma_family(), .tile_rows = 256, .tile_tokens = 128, .warps_rows = 8, .smem_stages = 6};
const Tactic kWgmma144{
    .family = &wgmma_family(), .tile_rows = 256, .tile_tokens = 144, .warps_rows = 8, .smem_stages = 6};
const Tactic kWgmmaWide{
    .family = &wgmma_family(), .tile_rows = 128, .tile_tokens = 256, .warps_rows = 8, .smem_stages = 4};
constexpr long long kWgmma64RowsExpected = 32;
constexpr long long kWgmma96RowsExpected = 64;
constexpr long long kWgmmaPrefillRowsExpected = 88;
constexpr long long kWgmma144RowsExpected = 112;
constexpr long long kWgmmaWideRowsExpected = 144;

Tactic wgmma_tile(long long rows_expected) {
  if (rows_expected >= kWgmmaWideRowsExpected) return kWgmmaWide;
  if (rows_expected >= kWgmma144RowsExpected) return kWgmma144;
  if (rows_expected >= kWgmmaPrefillRowsExpected) return kWgmmaPrefill;
  if (rows_expected >= kWgmma96RowsExpected) return kWgmma96;
  return rows_expected >= kWgmma64RowsExpected ? kWgmma64 : kWgmma32;
}

}  // namespace

Tactic row_tile_for(const KernelFamily& family, long long rows_expected, int tile_rows) {
  int tile_tokens = 16;
  while (tile_tokens < (tile_rows == 128 ? 128 : 64) && tile_tokens < rows_expected) tile_tokens *= 2;
  return {.family = &family,
          .tile_rows = tile_rows,
          .tile_tokens = tile_tokens,
          .warps_rows = tile_rows == 128 && tile_tokens > 32 ? 2 : 4,
          .warps_tokens = tile_tokens <= 32 ? 1 : tile_tokens / 32,
          .smem_stages = tile_tokens <= 32 ? 4 : 3};
}

LayerPlan heuristic_plan(const MoeShape& shape, int num_tokens, const Arch& arch, int routed_experts) {
  const long long pairs = static_cast<long long>(num_tokens) * shape.top_k;
  const long long rows_expected = (pairs + shape.num_experts - 1) / shape.num_experts;
  auto fits = [&](const Tactic& t) {
    const StageShape fc1{shape, Stage::kFc1}, fc2{shape, Stage::kFc2};
    return t.family->why_invalid(t, arch, &fc1).empty() && t.family->why_invalid(t, arch, &fc2).empty();
  };
  // Up to ~4 rows per expert (an expert past 8 takes a second pass over its weights, rare there).
  if (fits(kGemvWide) && (num_tokens <= kGemvWide.tile_tokens || rows_expected <= 4)) {
    // The expected experts of this layer that the batch touches where each pair picks among `among`.
    auto touched_of = [&](int among) {
      return shape.num_experts * (1.0 - std::pow(1.0 - static_cast<double>(shape.top_k) / among, num_tokens));
    };
    // Whether to take the GEMVs: for the busiest case, every pair on this layer's experts (an
    // expert-parallel shard's worst case, which the layer waits for). Their rows per CTA: for the
    // experts the shard touches on average, the pairs' share that lands on it, which sizes their
    // grids for its usual batch (the widest rows sized for the worst case left half a 2-token
    // shard's CTAs idle: docs/performance.md, "The heuristic's decisions").
    const double touched = touched_of(shape.num_experts);
    const LayerPlan gemv{decode_gemv(touched, shape.fc1_rows()), decode_gemv(touched, shape.hidden)};
    const bool few = touched <= kDecodeMaxTouched;
    if (few && gemv_ctas(gemv.fc1, touched, shape.fc1_rows()) <= kDecodeWaveCtas) {
      const double share = touched_of(std::max(routed_experts, shape.num_experts));
      return {decode_gemv(share, shape.fc1_rows()),
              decode_fc2(shape, num_tokens, arch, decode_gemv(share, shape.hidden))};
    }
    if (fits(kStreamK)) return {kStreamK, kStreamK};
    return few ? gemv : LayerPlan{kGemvWide, kGemvWide};
  }
  if (fits(kStreamK16) && rows_expected <= kStreamK16RowsExpected) return {kStreamK16, kStreamK16};
  if (const Tactic wgmma = wgmma_tile(rows_expected); fits(wgmma)) return {wgmma, wgmma};
  const Tactic mma = row_tile_for(mma_tile_family(), rows_expected);
  return {mma, mma};
}

std::vector<Tactic> default_tactics() {
  const KernelFamily& mma = mma_tile_family();
  return {kGemvFewFc1,  kGemvFewFc2,  kGemvWide,    token_sum(kGemvFewFc1), token_sum(kGemvFewFc2),
          token_sum(kGemvWide), kTokenSumOneCta, kStreamK, kStreamK16,
          row_tile_for(mma, 16), row_tile_for(mma, 32), row_tile_for(mma, 64), row_tile_for(mma, 128),
          kWgmma32,     kWgmma64,     kWgmma96,
          kWgmmaPrefill, kWgmma144, kWgmmaWide};
}

}  // namespace mxmoe
