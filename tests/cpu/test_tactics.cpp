// The tactic table (walked against the documented rules, and every entry mutated to break one),
// tactic names, plan validation, the pinned choices of the heuristic, and a compile of every valid
// tactic for every arch.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "jit/kernel_binary.hpp"
#include "kernels/expert_gemv.cuh"
#include "kernels/family_registry.hpp"
#include "mxmoe/error.hpp"
#include "route/route_buffers.hpp"
#include "tactics/heuristic.hpp"
#include "tactics/validate_plan.hpp"

namespace mxmoe {
namespace {

// The documented rules of the table (docs/tactics.md), written here apart from the families'
// why_invalid, in the order it checks them: the first rule `t` breaks on `arch`, and a word its
// reason must contain; empty when it breaks none.
struct BrokenRule {
  std::string rule, word;
};
BrokenRule first_broken_rule(const Tactic& t, const Arch& arch) {
  // Fields a family's names do not spell keep their defaults (1 warp, 0 records or stages).
  const std::map<std::string, std::vector<int Tactic::*>> unspelled = {
      {"gemv", {&Tactic::warps_tokens, &Tactic::smem_stages}},
      {"gemvsum", {&Tactic::smem_stages}},
      {"fused", {&Tactic::warps_tokens, &Tactic::smem_stages}},
      {"sk", {&Tactic::warps_tokens, &Tactic::warps_k, &Tactic::smem_stages}},
      {"ring", {&Tactic::warps_tokens, &Tactic::warps_k, &Tactic::batch_records}},
      {"mma", {&Tactic::warps_k, &Tactic::batch_records}},
      {"bsmma", {&Tactic::warps_k, &Tactic::batch_records}},
      {"wgmma", {&Tactic::warps_tokens, &Tactic::warps_k, &Tactic::batch_records}}};
  const std::string family(t.family->prefix());
  const Tactic defaults;
  for (auto field : unspelled.at(family)) {
    if (t.*field != defaults.*field) return {"unspelled fields keep their defaults", "default"};
  }
  if (family == "wgmma") {
    if (arch.name != "sm_90a") return {"wgmma on sm_90a only", "sm_90a only"};
    if (t.warps_rows != 8 && t.warps_rows != 12 && t.warps_rows != 16)
      return {"2-4 consumer warpgroups", "consumer warps"};
    if (t.tile_rows % (16 * t.warps_rows) != 0) return {"whole 16-row records per warp", "16-row records"};
    if (t.tile_tokens != 32 && t.tile_tokens != 64 && t.tile_tokens != 96 && t.tile_tokens != 128 &&
        t.tile_tokens != 144 && t.tile_tokens != 256)
      return {"the wgmma N: 32, 64, 96, 128, 144 or 256 tokens", "32, 64, 96, 128, 144 or 256"};
    // a consumer thread's accumulators, two fragment sets of 16 a record and 32 others in what the
    // launch's registers leave it beside a 24-register producer: 240, 160 or 112
    const int warp_records = t.tile_rows / t.warps_rows / 16;
    const int consumer_registers = t.warps_rows == 8 ? 240 : t.warps_rows == 12 ? 160 : 112;
    if (warp_records * t.tile_tokens / 2 + 32 * warp_records + 32 > consumer_registers)
      return {"the consumers' registers", "registers per consumer thread"};
    if (t.smem_stages < 2) return {"at least 2 stages", "2 stages"};
    // slack to align to 1024, per stage the swizzled activations in 32-token boxes and the records rounded
    // to 1024, two barriers
    const int stage_bytes = (t.tile_tokens + 31) / 32 * 32 * 128 + (t.tile_rows / 16 * 544 + 1023) / 1024 * 1024;
    if (1024 + t.smem_stages * (stage_bytes + 16) > arch.smem_per_block)
      return {"the arch's shared memory", "shared memory"};
    return {};
  }
  const bool column_cta = t.tile_rows == 16 * t.warps_rows && (t.tile_tokens == 8 || t.tile_tokens == 16);
  const bool up_to_16_warps = t.warps_rows >= 1 && t.warps() <= 16;
  if (family == "sk") {
    if (!column_cta) return {"a record column per warp over 8 or 16 tokens", "record column"};
    if (t.warps() > 24) return {"at most 24 warps", "warps per stream-K CTA"};
  } else if (!up_to_16_warps) {
    return {"1 to 16 warps per CTA", "warps per CTA"};
  } else if (family != "mma" && family != "bsmma" && !column_cta) {
    return {"a record column per warp over 8 or 16 tokens", "record column"};
  }
  if (family == "ring") {
    return t.smem_stages < 2 || t.smem_stages > 16 ? BrokenRule{"2 to 16 ring slots", "ring slots"} : BrokenRule{};
  }
  if (family == "bsmma") {
    if (t.tile_rows % (16 * t.warps_rows) != 0) return {"whole 16-row records per warp", "16-row records"};
    if (t.tile_rows % 128 != 0) return {"FC1 quantises whole 64-K slices of FC2's input", "multiple of 128"};
    if (t.tile_tokens % (8 * t.warps_tokens) != 0) return {"whole 8-token tiles per warp", "8-token MMA tiles"};
    const int records = t.tile_rows / t.warps_rows / 16, token_tiles = t.tile_tokens / t.warps_tokens / 8;
    if (records * token_tiles * 4 > 64) return {"at most 64 accumulators per thread", "accumulators"};
    if (records * 8 > 64) return {"at most 64 E4M3 weight registers per thread", "weight registers"};
    if (t.smem_stages < 2) return {"at least 2 cp.async stages", "2 stages"};
    // per stage the records and each token's 64 codes and scale word; FC1's fp32 outputs after
    const int stages = t.smem_stages * (t.tile_rows / 16 * 544 + t.tile_tokens * 68);
    const int epilogue = t.tile_tokens * (t.tile_rows / 2 + 4) * 4;
    if (std::max(stages, epilogue) > arch.smem_per_block) return {"the arch's shared memory", "shared memory"};
    return {};
  }
  if (family != "mma") {
    if (t.warps_k != 1 && t.warps_k != 2 && t.warps_k != 4) return {"1, 2 or 4 warps along K", "along K"};
    if (t.batch_records < 1 || t.batch_records > 16) return {"1 to 16 records in flight per lane", "in flight"};
    if (family == "gemvsum" && t.tile_tokens != 8) return {"one staged row a pair", "8 tokens"};
    if (family == "gemvsum" && t.warps_tokens > 8) return {"1 to 8 pairs a CTA", "pairs a CTA"};
    return {};
  }
  if (t.tile_rows % (16 * t.warps_rows) != 0) return {"whole 16-row records per warp", "16-row records"};
  if (t.tile_tokens % (8 * t.warps_tokens) != 0) return {"whole 8-token tiles per warp", "8-token MMA tiles"};
  const int records = t.tile_rows / t.warps_rows / 16, token_tiles = t.tile_tokens / t.warps_tokens / 8;
  if (records * token_tiles * 4 > 64) return {"at most 64 accumulators per thread", "accumulators"};
  if (records * 16 > 64) return {"at most 64 fragment registers per thread", "fragment registers"};
  if (t.smem_stages < 2) return {"at least 2 cp.async stages", "2 stages"};
  const int stage_bytes = t.tile_rows / 16 * 544 + t.tile_tokens * (64 + 8) * 2;  // records, activation rows
  if (t.smem_stages * stage_bytes + t.tile_tokens * 8 > arch.smem_per_block)
    return {"the arch's shared memory", "shared memory"};
  return {};
}

// Every entry is valid exactly when it obeys the rules above, and an invalid one's reason names the
// rule it breaks; so does every entry with one of its parameters broken.
TEST(TacticTable, ValidEntriesObeyTheRulesAndInvalidOnesSayWhy) {
  for (const auto& arch : supported_archs()) {
    const auto table = tactic_table(arch.name);
    std::set<std::string> names;
    std::map<const KernelFamily*, int> valid_per_family;
    for (const auto& e : table) {
      SCOPED_TRACE(std::string(arch.name) + " " + e.tactic.name());
      EXPECT_FALSE(e.reason.empty());
      EXPECT_EQ(parse_tactic(e.tactic.name()), e.tactic);
      EXPECT_EQ(e.tactic.k_split, 1);
      EXPECT_TRUE(names.insert(e.tactic.name()).second) << "listed twice";
      const BrokenRule broken = first_broken_rule(e.tactic, arch);
      EXPECT_EQ(e.invalid.empty(), broken.rule.empty()) << "rule: " << broken.rule << "; reason: " << e.invalid;
      EXPECT_NE(e.invalid.find(broken.word), std::string::npos) << e.invalid;
      if (e.invalid.empty()) ++valid_per_family[e.tactic.family];
    }
    for (const KernelFamily* f : kernel_families()) {
      const bool hopper_only = f->prefix() == "wgmma";  // the block-scaled family runs on all four
      if (!hopper_only || arch.name == "sm_90a") {
        EXPECT_GE(valid_per_family[f], 2) << arch.name << " " << f->prefix();
      }
    }
  }
  // On sm_90a every entry is valid but one, kept to show the accumulator budget (docs/tactics.md):
  // an entry changed into one that cannot run is caught here.
  std::vector<std::string> invalid_on_sm90;
  for (const auto& e : tactic_table("sm_90a")) {
    if (!e.invalid.empty()) invalid_on_sm90.push_back(e.tactic.name());
  }
  EXPECT_EQ(invalid_on_sm90, std::vector<std::string>{"mma.r256x128.w4x2.s3.k1"});
}

// Each mutation breaks a rule of every family that spells (or must leave at its default) the
// field it changes; a table entry so mutated must be caught, and its reason must name the rule.
// The routing precomputes tile offsets for an ascending list of tile sizes; every token-tiled
// tactic (the mma, block-scaled and wgmma tiles) must tile by one of them exactly, else its CTAs
// would walk another size's offsets.
TEST(TacticTable, TiledTacticsTileByARoutingTileSize) {
  for (int i = 1; i < kernels::kTileSizeCount; ++i) EXPECT_LT(kernels::tile_size(i - 1), kernels::tile_size(i));
  EXPECT_EQ(kernels::tile_size(kernels::tile_size_index(65)), 96);
  EXPECT_EQ(kernels::tile_size(kernels::tile_size_index(97)), 128);
  EXPECT_EQ(kernels::tile_size(kernels::tile_size_index(144)), 144);
  EXPECT_EQ(kernels::tile_size(kernels::tile_size_index(129)), 144);
  EXPECT_EQ(kernels::tile_size(kernels::tile_size_index(145)), 256);
  int tiled = 0;
  for (const auto& arch : supported_archs()) {
    for (const Tactic& t : valid_tactics(arch.name)) {
      if (t.family != &mma_tile_family() && t.family != &block_scaled_tile_family() && t.family != &wgmma_family()) {
        continue;
      }
      ++tiled;
      EXPECT_EQ(kernels::tile_size(kernels::tile_size_index(t.tile_tokens)), t.tile_tokens) << t.name();
    }
  }
  EXPECT_GT(tiled, 0);
}

TEST(TacticTable, MutatedEntriesAreCaught) {
  struct Mutation {
    const char* what;
    void (*apply)(Tactic&);
  };
  const Mutation mutations[] = {
      {"tile rows off the record grid", [](Tactic& t) { t.tile_rows += 8; }},
      {"12 tokens", [](Tactic& t) { t.tile_tokens = 12; }},
      {"64 times the warps along rows", [](Tactic& t) { t.warps_rows *= 64; }},
      {"a second warp along tokens",
       [](Tactic& t) {
         t.warps_tokens = t.family == &mma_tile_family() || t.family == &block_scaled_tile_family() ? 3
                          : t.family == &gemv_token_sum_family()                                    ? 9
                                                                                                    : 2;
       }},
      {"three warps along K", [](Tactic& t) { t.warps_k = 3; }},
      {"no records in flight", [](Tactic& t) { t.batch_records = t.batch_records == 0 ? 1 : 0; }},
      {"one pipeline stage", [](Tactic& t) { t.smem_stages = 1; }},
      {"a K split in the table", [](Tactic& t) { t.k_split = 2; }},
  };
  const Arch& sm90 = arch_by_name("sm_90a");
  int caught = 0;
  for (const Tactic& valid : valid_tactics("sm_90a")) {
    const KernelFamily& family = *valid.family;
    for (const auto& m : mutations) {
      Tactic t = valid;
      m.apply(t);
      const std::string why = family.why_invalid(t, sm90);
      EXPECT_FALSE(why.empty()) << valid.name() << " with " << m.what << " was accepted";
      if (t.k_split == 1) {
        const BrokenRule broken = first_broken_rule(t, sm90);
        EXPECT_FALSE(broken.rule.empty()) << valid.name() << " with " << m.what << ": the test's rules miss it";
        EXPECT_NE(why.find(broken.word), std::string::npos) << valid.name() << " with " << m.what << ": " << why;
      }
      caught += !why.empty();
    }
  }
  EXPECT_GE(caught, 8 * 30);
}

TEST(TacticTable, ArchLimitsDecide) {
  auto invalid = [](std::string_view arch, std::string_view name) {
    for (const auto& e : tactic_table(arch)) {
      if (e.tactic.name() == name) return e.invalid;
    }
    ADD_FAILURE() << name << " is not a candidate";
    return std::string();
  };
  // 5 stages of a 128 x 128 tile need 115 KB: Hopper and sm_100 have 227 KB, the sm_12x parts 99 KB.
  EXPECT_EQ(invalid("sm_90a", "mma.r128x128.w2x4.s5.k1"), "");
  EXPECT_EQ(invalid("sm_100a", "mma.r128x128.w2x4.s5.k1"), "");
  EXPECT_NE(invalid("sm_120a", "mma.r128x128.w2x4.s5.k1").find("shared memory"), std::string::npos);
  EXPECT_NE(invalid("sm_121a", "mma.r128x128.w2x4.s5.k1").find("shared memory"), std::string::npos);
  // 64 x 64 warp tiles: 128 accumulators per thread on every arch.
  for (const auto& a : supported_archs()) {
    EXPECT_NE(invalid(a.name, "mma.r256x128.w4x2.s3.k1").find("accumulators"), std::string::npos) << a.name;
  }
  EXPECT_THROW(tactic_table("sm_80"), Error);
}

// FP8 activations: the GEMV rounds the rows it stages where a CTA stages the whole of K (one K
// split), the stream-K GEMV up to 16 tokens, every other family leaves it to the rounding launch.
TEST(TacticTable, WhichFamiliesRoundFp8RowsAsTheyStageThem) {
  const Tactic gemv = parse_tactic("gemv.r64x8.w4x2.u2.k1"), split = parse_tactic("gemv.r32x8.w2x4.u2.k4");
  const Tactic stream_k = parse_tactic("sk.r384x8.w24.u2.k1"), stream_k16 = parse_tactic("sk.r384x16.w24.u2.k1");
  EXPECT_TRUE(gemv.family->rounds_fp8_when_staging(gemv, 1));
  EXPECT_TRUE(gemv.family->rounds_fp8_when_staging(gemv, 4096));
  EXPECT_FALSE(split.family->rounds_fp8_when_staging(split, 1));
  EXPECT_TRUE(stream_k.family->rounds_fp8_when_staging(stream_k, 16));
  EXPECT_FALSE(stream_k.family->rounds_fp8_when_staging(stream_k, 17));
  EXPECT_TRUE(stream_k16.family->rounds_fp8_when_staging(stream_k16, 16));
  EXPECT_FALSE(stream_k16.family->rounds_fp8_when_staging(stream_k16, 17));
  for (const char* other : {"wgmma.r256x128.w8.s6.k1", "mma.r128x32.w4x1.s4.k1", "fused.r128x8.w8x1.u2.k1"}) {
    const Tactic t = parse_tactic(other);
    EXPECT_FALSE(t.family->rounds_fp8_when_staging(t, 1)) << other;
  }
}

// A tactic's family is resolved where it is made, to the registry's one object: by parse_tactic,
// by the family whose table lists it, and by the heuristic.
TEST(TacticNames, EveryTacticKnowsTheFamilyThatMadeIt) {
  for (const KernelFamily* f : kernel_families()) {
    for (const TacticCandidate& c : f->candidates()) {
      EXPECT_EQ(c.tactic.family, f) << c.tactic.name();
      EXPECT_EQ(parse_tactic(c.tactic.name()).family, f) << c.tactic.name();
    }
  }
  for (const Tactic& t : default_tactics()) {
    ASSERT_NE(t.family, nullptr);
    EXPECT_EQ(family_by_prefix(t.family->prefix()), t.family) << t.name();
  }
  EXPECT_EQ(parse_tactic("sk.r384x8.w24.u2.k1").family, &gemv_streamk_family());
  EXPECT_EQ(parse_tactic("bsmma.r128x32.w4x1.s4.k1").family, &block_scaled_tile_family());
}

// A tactic made by hand without a family is an Error wherever it is used, not a crash.
TEST(TacticNames, ATacticWithoutAFamilyIsAnError) {
  Tactic orphan = parse_tactic("gemv.r64x8.w4x1.u4.k1");
  orphan.family = nullptr;
  const Tactic gemv = parse_tactic("gemv.r64x8.w4x1.u4.k1");
  const MoeShape shape = model_shape("gpt-oss-20b");
  const Arch& sm90 = arch_by_name("sm_90a");
  auto expect_error = [](const std::function<void()>& use, const char* what) {
    try {
      use();
      ADD_FAILURE() << what << ": accepted a tactic without a family";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("without a kernel family"), std::string::npos) << what << ": " << e.what();
    }
  };
  expect_error([&] { (void)orphan.name(); }, "name");
  expect_error([&] { validate_plan(shape, {orphan, gemv}, sm90); }, "validate_plan FC1");
  expect_error([&] { validate_plan(shape, {gemv, orphan}, sm90); }, "validate_plan FC2");
  expect_error([&] { (void)activations_of(orphan); }, "activations_of");
  expect_error([&] { (void)LayerPlan{orphan, orphan}.whole_layer(); }, "whole_layer");
  expect_error([&] { (void)can_route_in_expert_kernels({gemv, orphan}, 1, 4); }, "can_route_in_expert_kernels");
  expect_error([&] { (void)kernel_key(orphan, sm90); }, "kernel_key");
  expect_error([&] { (void)compile_tactic(orphan, sm90); }, "compile_tactic");
  EXPECT_EQ(gemv_family().why_invalid(orphan, sm90), "not a 'gemv' tactic");
  EXPECT_FALSE(orphan == gemv);
}

TEST(TacticNames, ParseRejectsMalformedNames) {
  for (const char* bad : {"gemv.r64", "foo.r64.w4.u4.k1", "mma.r128x16.w4x1.s4.k1.extra", "mma.r128x16.w4.s4.k1",
                          "gemv.r64x8.w4x1.u0.k1", ""}) {
    EXPECT_THROW(parse_tactic(bad), Error) << bad;
  }
}

TEST(ValidatePlan, RejectsWhatCannotRun) {
  const MoeShape shape = model_shape("gpt-oss-20b");
  const Arch& sm90 = arch_by_name("sm_90a");
  const Tactic gemv = parse_tactic("gemv.r64x8.w4x1.u4.k1");
  EXPECT_NO_THROW(validate_plan(shape, {gemv, parse_tactic("gemv.r64x8.w4x1.u4.k4")}, sm90));
  EXPECT_THROW(validate_plan(shape, {parse_tactic("gemv.r64x8.w4x1.u4.k2"), gemv}, sm90), Error);  // FC1 split
  EXPECT_THROW(validate_plan(shape, {gemv, parse_tactic("gemv.r64x8.w4x1.u4.k5")}, sm90), Error);  // past kMaxKSplit
  EXPECT_THROW(validate_plan(shape, {gemv, parse_tactic("gemv.r48x8.w3x1.u4.k1")}, sm90), Error);  // not a candidate
  EXPECT_THROW(validate_plan(shape, {parse_tactic("mma.r128x128.w2x4.s5.k1"), gemv}, arch_by_name("sm_120a")), Error);
  const MoeShape small{4, 2, 64, 64, 1};  // FC2 has one K tile: no split
  EXPECT_THROW(validate_plan(small, {gemv, parse_tactic("gemv.r64x8.w4x1.u4.k2")}, sm90), Error);
}

// A fused tactic is a whole-layer plan: both stages, no K split; its name round-trips.
TEST(ValidatePlan, FusedTacticIsTheWholeLayer) {
  const MoeShape shape = model_shape("gpt-oss-120b");
  const Arch& sm90 = arch_by_name("sm_90a");
  const Tactic fused = parse_tactic("fused.r64x8.w4x2.u2.k1");
  EXPECT_EQ(fused.family, &fused_layer_family());
  EXPECT_EQ(fused.name(), "fused.r64x8.w4x2.u2.k1");
  EXPECT_TRUE((LayerPlan{fused, fused}.whole_layer()));
  EXPECT_FALSE((LayerPlan{parse_tactic("gemv.r64x8.w4x2.u2.k1"), parse_tactic("gemv.r64x8.w4x2.u2.k1")}.whole_layer()));
  EXPECT_NO_THROW(validate_plan(shape, {fused, fused}, sm90));
  const Tactic gemv = parse_tactic("gemv.r64x8.w4x2.u2.k1");
  for (const LayerPlan& mixed : {LayerPlan{fused, gemv}, LayerPlan{gemv, fused}}) {
    try {
      validate_plan(shape, mixed, sm90);
      ADD_FAILURE() << mixed.fc1.name() << " + " << mixed.fc2.name() << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("whole layer"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(validate_plan(shape, {fused, parse_tactic("fused.r64x8.w4x2.u2.k2")}, sm90), Error);
  EXPECT_THROW(validate_plan(shape, {fused, parse_tactic("fused.r128x8.w8x1.u2.k1")}, sm90), Error);
  // A stream-K GEMV splits K itself: no K split on top, for either stage.
  const Tactic stream_k = parse_tactic("sk.r384x8.w24.u2.k1");
  EXPECT_NO_THROW(validate_plan(shape, {stream_k, stream_k}, sm90));
  EXPECT_THROW(validate_plan(shape, {stream_k, parse_tactic("sk.r384x8.w24.u2.k2")}, sm90), Error);
}

// The token-sum GEMV is an FC2 tactic that writes the layer's output (no un-permute launch): refused
// as FC1, with a K split, and where a token's pairs would be a cluster of more than 8 CTAs.
TEST(ValidatePlan, TokenSumGemvIsFc2OnlyAndWritesTheOutput) {
  const Arch& sm90 = arch_by_name("sm_90a");
  const Tactic gemv = parse_tactic("gemv.r64x8.w4x2.u2.k1"), summed = parse_tactic("gemvsum.r64x8.w4x2x1.u2.k1");
  EXPECT_EQ(summed.family, &gemv_token_sum_family());
  EXPECT_TRUE(summed.family->writes_layer_output());
  EXPECT_FALSE(gemv.family->writes_layer_output());
  EXPECT_TRUE(parse_tactic("fused.r64x8.w4x2.u2.k1").family->writes_layer_output());
  EXPECT_FALSE((LayerPlan{gemv, summed}.whole_layer()));
  EXPECT_TRUE(can_route_in_expert_kernels({gemv, summed}, 1, 6));
  for (const char* model : {"gpt-oss-20b", "deepseek-v4-flash", "deepseek-v4-pro"}) {
    const MoeShape shape = model_shape(model);
    EXPECT_NO_THROW(validate_plan(shape, {gemv, summed}, sm90)) << model;
    auto refusal = [&](const LayerPlan& plan) {
      try {
        validate_plan(shape, plan, sm90);
      } catch (const Error& e) {
        return std::string(e.what());
      }
      return std::string();
    };
    EXPECT_NE(refusal({summed, summed}).find("FC2 only"), std::string::npos) << model;
    EXPECT_NE(refusal({gemv, parse_tactic("gemvsum.r64x8.w4x2x1.u2.k2")}).find("one cluster"), std::string::npos);
    MoeShape wide_top_k = shape;
    wide_top_k.top_k = 9;
    const StageShape fc2{wide_top_k, Stage::kFc2};
    EXPECT_NE(summed.family->why_invalid(summed, sm90, &fc2).find("at most 8"), std::string::npos) << model;
  }
  // a CTA of several pairs: they must divide the top-k
  const Tactic six = parse_tactic("gemvsum.r16x8.w1x2x6.u2.k1");
  const StageShape v4_fc2{model_shape("deepseek-v4-flash"), Stage::kFc2}, oss_fc2{model_shape("gpt-oss-20b"), Stage::kFc2};
  EXPECT_EQ(six.family->why_invalid(six, sm90, &v4_fc2), "");
  EXPECT_NE(six.family->why_invalid(six, sm90, &oss_fc2).find("do not divide top-k 4"), std::string::npos);
  const Tactic sixteen = parse_tactic("gemvsum.r64x16.w4x2x1.u2.k1");
  EXPECT_NE(sixteen.family->why_invalid(sixteen, sm90).find("8 tokens"), std::string::npos);
}

// Its launch: x = column groups, y = the batch's pairs in groups of the pairs a CTA, a token's
// CTAs one cluster along y (none where one CTA holds the token), a group of warps a pair; the
// shared memory holds every pair's row of FC1's output whole.
TEST(TokenSumGemv, GeometryIsAClusterAToken) {
  struct Case {
    const char* model;
    const char* tactic;
    int tokens;
    unsigned grid_x, grid_y, cluster_y;
    int threads;
  };
  const Case cases[] = {
      {"gpt-oss-20b", "gemvsum.r32x8.w2x4x1.u2.k1", 1, 90, 4, 4, 256},     // H = 2880: 180 record columns
      {"gpt-oss-20b", "gemvsum.r64x8.w4x2x1.u2.k1", 2, 45, 8, 4, 256},
      {"gpt-oss-20b", "gemvsum.r16x8.w1x4x2.u2.k1", 3, 180, 6, 2, 256},
      {"deepseek-v4-flash", "gemvsum.r16x8.w1x2x6.u2.k1", 1, 256, 1, 1, 384},  // H = 4096: 256
      {"deepseek-v4-flash", "gemvsum.r32x8.w2x2x3.u2.k1", 5, 128, 10, 2, 384},
      {"deepseek-v4-flash", "gemvsum.r128x8.w8x1x1.u2.k1", 1, 32, 6, 6, 256},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(c.model) + " " + c.tactic + " T=" + std::to_string(c.tokens));
    const Tactic t = parse_tactic(c.tactic);
    const StageShape fc2{model_shape(c.model), Stage::kFc2};
    EXPECT_EQ(t.family->why_invalid(t, arch_by_name("sm_90a"), &fc2), "");
    const LaunchGeometry g = t.family->geometry(t, fc2, c.tokens, false, nullptr);
    EXPECT_EQ(g.grid.x, c.grid_x);
    EXPECT_EQ(g.grid.y, c.grid_y);
    EXPECT_EQ(g.grid.z, 1u);
    EXPECT_EQ(g.cluster.x, 1u);
    EXPECT_EQ(g.cluster.y, c.cluster_y);
    EXPECT_EQ(g.cluster.z, 1u);
    EXPECT_EQ(g.grid.y % g.cluster.y, 0u);
    EXPECT_EQ(g.threads, c.threads);
    EXPECT_EQ(g.staged_rows, 1);
    const int pairs = t.warps_tokens, k = fc2.k();
    EXPECT_GE(g.smem_bytes, pairs * k * 2) << "every pair's row of FC1's output, whole";
    EXPECT_EQ(g.smem_bytes, kernels::gemv_token_sum_smem_bytes(fc2.k_tiles(), t.warps_rows, t.warps_k, pairs));
  }
}

// A small batch under two GEMV tactics may be routed by the expert kernels themselves (no routing
// launch): up to 32 pairs, whatever the K split; never under another family.
TEST(CanRouteInExpertKernels, SmallBatchUnderGemvPlansOnly) {
  const Tactic gemv = parse_tactic("gemv.r64x8.w4x2.u2.k1"), split = parse_tactic("gemv.r32x8.w2x4.u2.k3");
  const Tactic fused = parse_tactic("fused.r128x8.w8x1.u2.k1"), ring = parse_tactic("ring.r64x8.w4.s6.k1");
  const Tactic tiled = parse_tactic("mma.r128x16.w4x1.s4.k1");
  for (int tokens : {1, 5, 8}) {
    EXPECT_TRUE(can_route_in_expert_kernels({gemv, split}, tokens, 4)) << tokens;
    EXPECT_FALSE(can_route_in_expert_kernels({fused, fused}, tokens, 4)) << tokens;
    EXPECT_FALSE(can_route_in_expert_kernels({gemv, ring}, tokens, 4)) << tokens;
    EXPECT_FALSE(can_route_in_expert_kernels({tiled, gemv}, tokens, 4)) << tokens;
    // the stream-K GEMV's flags are zeroed by the routing launch, so it never routes itself
    EXPECT_FALSE(can_route_in_expert_kernels({gemv, parse_tactic("sk.r384x8.w24.u2.k1")}, tokens, 4)) << tokens;
  }
  EXPECT_FALSE(can_route_in_expert_kernels({gemv, gemv}, 9, 4));
  EXPECT_TRUE(can_route_in_expert_kernels({gemv, gemv}, 10, 3));
  EXPECT_FALSE(can_route_in_expert_kernels({gemv, gemv}, 11, 3));
}

struct Pin {
  const char* model;
  int tokens;
  const char* fc1;
  const char* fc2;
};

// The heuristic's choices, pinned: rows per expert expected ceil(T k / E), worst case T.
TEST(Heuristic, PinnedChoices) {
  const Pin pins[] = {
      {"gpt-oss-20b", 1, "gemv.r64x8.w4x2.u2.k1", "gemvsum.r32x8.w2x4x1.u2.k1"},   // 4 experts touched
      {"gpt-oss-20b", 2, "gemv.r128x8.w8x1.u2.k1", "gemvsum.r64x8.w4x2x1.u2.k1"},  // ~7.5
      {"gpt-oss-20b", 3, "sk.r384x8.w24.u2.k1", "sk.r384x8.w24.u2.k1"},  // ~10.6, but 478 CTAs of 128 rows
      {"gpt-oss-20b", 4, "sk.r384x8.w24.u2.k1", "sk.r384x8.w24.u2.k1"},  // ~13.2
      {"gpt-oss-20b", 8, "sk.r384x8.w24.u2.k1", "sk.r384x8.w24.u2.k1"},
      {"gpt-oss-20b", 32, "sk.r384x8.w24.u2.k1", "sk.r384x8.w24.u2.k1"},  // expected 4 rows
      {"gpt-oss-20b", 33, "sk.r384x16.w24.u2.k1", "sk.r384x16.w24.u2.k1"},
      {"gpt-oss-20b", 64, "sk.r384x16.w24.u2.k1", "sk.r384x16.w24.u2.k1"},  // expected 8 rows
      {"gpt-oss-20b", 96, "sk.r384x16.w24.u2.k1", "sk.r384x16.w24.u2.k1"},  // expected 12 rows
      {"gpt-oss-20b", 97, "wgmma.r256x32.w8.s7.k1", "wgmma.r256x32.w8.s7.k1"},  // 13: wgmma from here
      {"gpt-oss-20b", 248, "wgmma.r256x32.w8.s7.k1", "wgmma.r256x32.w8.s7.k1"},  // expected 31 rows
      {"gpt-oss-20b", 249, "wgmma.r256x64.w16.s6.k1", "wgmma.r256x64.w16.s6.k1"},  // 32: 64 tokens a tile
      {"gpt-oss-20b", 504, "wgmma.r256x64.w16.s6.k1", "wgmma.r256x64.w16.s6.k1"},  // 63
      {"gpt-oss-20b", 505, "wgmma.r256x96.w16.s6.k1", "wgmma.r256x96.w16.s6.k1"},  // 64: 96 tokens a tile
      {"gpt-oss-20b", 696, "wgmma.r256x96.w16.s6.k1", "wgmma.r256x96.w16.s6.k1"},  // 87
      {"gpt-oss-20b", 697, "wgmma.r256x128.w8.s6.k1", "wgmma.r256x128.w8.s6.k1"},  // 88: 128 tokens a tile
      {"gpt-oss-20b", 888, "wgmma.r256x128.w8.s6.k1", "wgmma.r256x128.w8.s6.k1"},  // 111
      {"gpt-oss-20b", 889, "wgmma.r256x144.w8.s6.k1", "wgmma.r256x144.w8.s6.k1"},  // 112: 144 tokens a tile
      {"gpt-oss-20b", 1144, "wgmma.r256x144.w8.s6.k1", "wgmma.r256x144.w8.s6.k1"}, // 143
      {"gpt-oss-20b", 1145, "wgmma.r128x256.w8.s4.k1", "wgmma.r128x256.w8.s4.k1"}, // 144: 256 tokens a tile
      {"gpt-oss-20b", 4096, "wgmma.r128x256.w8.s4.k1", "wgmma.r128x256.w8.s4.k1"},
      {"gpt-oss-120b", 1, "gemv.r64x8.w4x2.u2.k1", "gemvsum.r32x8.w2x4x1.u2.k1"},
      {"gpt-oss-120b", 2, "gemv.r128x8.w8x1.u2.k1", "gemvsum.r64x8.w4x2x1.u2.k1"},  // ~7.9 touched: 355 CTAs
      {"gpt-oss-120b", 3, "sk.r384x8.w24.u2.k1", "sk.r384x8.w24.u2.k1"},       // ~11.6: 522 CTAs
      {"gpt-oss-120b", 64, "sk.r384x8.w24.u2.k1", "sk.r384x8.w24.u2.k1"},   // expected 2 rows
      {"gpt-oss-120b", 128, "sk.r384x8.w24.u2.k1", "sk.r384x8.w24.u2.k1"},  // expected 4 rows
      {"gpt-oss-120b", 129, "sk.r384x16.w24.u2.k1", "sk.r384x16.w24.u2.k1"},
      {"gpt-oss-120b", 384, "sk.r384x16.w24.u2.k1", "sk.r384x16.w24.u2.k1"},
      {"gpt-oss-120b", 385, "wgmma.r256x32.w8.s7.k1", "wgmma.r256x32.w8.s7.k1"},
      {"gpt-oss-120b", 992, "wgmma.r256x32.w8.s7.k1", "wgmma.r256x32.w8.s7.k1"},
      {"gpt-oss-120b", 993, "wgmma.r256x64.w16.s6.k1", "wgmma.r256x64.w16.s6.k1"},
      {"gpt-oss-120b", 2016, "wgmma.r256x64.w16.s6.k1", "wgmma.r256x64.w16.s6.k1"},
      {"gpt-oss-120b", 2017, "wgmma.r256x96.w16.s6.k1", "wgmma.r256x96.w16.s6.k1"},
      {"gpt-oss-120b", 2784, "wgmma.r256x96.w16.s6.k1", "wgmma.r256x96.w16.s6.k1"},
      {"gpt-oss-120b", 2785, "wgmma.r256x128.w8.s6.k1", "wgmma.r256x128.w8.s6.k1"},
      {"gpt-oss-120b", 3552, "wgmma.r256x128.w8.s6.k1", "wgmma.r256x128.w8.s6.k1"},
      {"gpt-oss-120b", 3553, "wgmma.r256x144.w8.s6.k1", "wgmma.r256x144.w8.s6.k1"},
      {"gpt-oss-120b", 4576, "wgmma.r256x144.w8.s6.k1", "wgmma.r256x144.w8.s6.k1"},
      {"gpt-oss-120b", 4577, "wgmma.r128x256.w8.s4.k1", "wgmma.r128x256.w8.s4.k1"},
      // Decode GEMVs by grid size: 6 experts of 4096 FC1 rows are 192 CTAs of 128 rows, 384 of 64;
      // past one resident wave (396 CTAs) the stream-K GEMV.
      {"deepseek-v4-flash", 1, "gemv.r64x8.w4x2.u2.k1", "gemvsum.r16x8.w1x2x6.u2.k1"},
      {"deepseek-v4-flash", 2, "gemv.r128x8.w8x1.u2.k1", "gemv.r128x8.w8x1.u2.k1"},  // ~11.8 touched: 377
      {"deepseek-v4-flash", 3, "sk.r384x8.w24.u2.k1", "sk.r384x8.w24.u2.k1"},
      {"deepseek-v4-pro", 1, "sk.r384x8.w24.u2.k1", "sk.r384x8.w24.u2.k1"},  // FC1 576 CTAs of 64 rows
      {"deepseek-v4-pro", 2, "sk.r384x8.w24.u2.k1", "sk.r384x8.w24.u2.k1"},  // FC1 571 of 128 rows
  };

  const Arch& sm90 = arch_by_name("sm_90a");
  for (const auto& p : pins) {
    const LayerPlan plan = heuristic_plan(model_shape(p.model), p.tokens, sm90);
    EXPECT_EQ(plan.fc1.name(), p.fc1) << p.model << " T=" << p.tokens;
    EXPECT_EQ(plan.fc2.name(), p.fc2) << p.model << " T=" << p.tokens;
  }
}

// An expert-parallel shard of half the experts, taking the gathered batch of 2 ranks: the choice of
// the GEMVs is the whole batch's on its experts (their worst case); their rows per CTA are for the
// share that lands on it (a 2-token batch touches ~3.9 of gpt-oss-120b's 64, ~5.9 of V4-Flash's 128:
// the 1-token layer's tiles). A whole layer's plan is the same with or without its routed count.
TEST(Heuristic, ExpertParallelShardSizesItsGemvsForItsShareOfThePairs) {
  const Arch& sm90 = arch_by_name("sm_90a");
  struct Pin {
    const char* model;
    int tokens;
    const char* fc1;
    const char* fc2;
  };
  const Pin pins[] = {
      {"gpt-oss-20b", 2, "gemv.r64x8.w4x2.u2.k1", "gemvsum.r32x8.w2x4x1.u2.k1"},  // whole batch: r128/r64, 315 CTAs
      {"gpt-oss-120b", 2, "gemv.r64x8.w4x2.u2.k1", "gemvsum.r32x8.w2x4x1.u2.k1"},  // whole batch: r128/r64, 349
      {"deepseek-v4-flash", 2, "gemv.r64x8.w4x2.u2.k1", "gemv.r64x8.w4x2.u2.k1"},  // whole batch: r128, 375
      {"gpt-oss-120b", 4, "sk.r384x8.w24.u2.k1", "sk.r384x8.w24.u2.k1"},  // all 16 pairs here: 14.5 touched
      {"deepseek-v4-flash", 4, "sk.r384x8.w24.u2.k1", "sk.r384x8.w24.u2.k1"},
      {"gpt-oss-120b", 4096, "wgmma.r128x256.w8.s4.k1", "wgmma.r128x256.w8.s4.k1"},  // 256 rows an expert
  };
  for (const auto& p : pins) {
    const MoeShape whole = model_shape(p.model);
    MoeShape shard = whole;
    shard.num_experts = whole.num_experts / 2;
    const LayerPlan plan = heuristic_plan(shard, p.tokens, sm90, whole.num_experts);
    EXPECT_EQ(plan.fc1.name(), p.fc1) << p.model << " T=" << p.tokens;
    EXPECT_EQ(plan.fc2.name(), p.fc2) << p.model << " T=" << p.tokens;
    EXPECT_EQ(heuristic_plan(shard, p.tokens, sm90), heuristic_plan(shard, p.tokens, sm90, shard.num_experts));
    EXPECT_EQ(heuristic_plan(whole, p.tokens, sm90), heuristic_plan(whole, p.tokens, sm90, whole.num_experts));
  }
  EXPECT_EQ(heuristic_plan(MoeShape{64, 4, 2880, 2880, 1}, 2, sm90).fc1.name(), "gemv.r128x8.w8x1.u2.k1");
}

TEST(Heuristic, GemvMakesWayWhenItsStagingExceedsTheArch) {
  const MoeShape wide{8, 2, 8192, 1024, 1};  // FC1's 8 x 8192 activations need 128 KB
  EXPECT_EQ(heuristic_plan(wide, 1, arch_by_name("sm_90a")).fc1.family, &gemv_family());
  EXPECT_EQ(heuristic_plan(wide, 1, arch_by_name("sm_120a")).fc1.name(), "mma.r128x16.w4x1.s4.k1");
}

TEST(Heuristic, ChoosesOnlyDefaultTacticsThatValidate) {
  const auto defaults = default_tactics();
  for (const auto& arch : supported_archs()) {
    for (const auto& preset : model_presets()) {
      const std::string model(preset.name);
      for (int t : {1, 2, 3, 5, 8, 9, 15, 16, 17, 31, 33, 64, 100, 255, 256, 1000, 4096, 65536}) {
        const LayerPlan plan = heuristic_plan(preset.shape, t, arch);
        EXPECT_NO_THROW(validate_plan(preset.shape, plan, arch)) << arch.name << " " << model << " T=" << t;
        for (const Tactic& tactic : {plan.fc1, plan.fc2}) {
          EXPECT_NE(std::find(defaults.begin(), defaults.end(), tactic.binary()), defaults.end()) << tactic.name();
        }
      }
    }
  }
}

// MXFP8 activations are the caller's choice: the bf16 heuristic never plans the block-scaled
// family; asked for MXFP8 it plans it for both stages on every arch, with the token tile of the
// expected rows (16 up to 16, then 32, 64, 128), and the plans validate.
TEST(Heuristic, Mxfp8PlansOnlyWhenAskedAndThenBlockScaled) {
  for (const auto& arch : supported_archs()) {
    for (const char* model : {"gpt-oss-20b", "gpt-oss-120b"}) {
      const MoeShape shape = model_shape(model);
      for (int t : {1, 2, 5, 8, 9, 16, 33, 64, 100, 255, 1000, 4096, 65536}) {
        const LayerPlan bf16 = heuristic_plan(shape, t, arch, ActivationFormat::kBf16);
        EXPECT_EQ(bf16, heuristic_plan(shape, t, arch));
        EXPECT_EQ(bf16.activations, ActivationFormat::kBf16);
        EXPECT_NE(bf16.fc1.family, &block_scaled_tile_family());
        const LayerPlan plan = heuristic_plan(shape, t, arch, ActivationFormat::kMxfp8);
        EXPECT_EQ(plan.activations, ActivationFormat::kMxfp8);
        EXPECT_EQ(plan.fc1, plan.fc2);
        EXPECT_EQ(plan.fc1.family, &block_scaled_tile_family()) << arch.name << " " << model << " T=" << t;
        EXPECT_NO_THROW(validate_plan(shape, plan, arch)) << arch.name << " " << model << " T=" << t;
      }
    }
  }
  const Arch& sm90 = arch_by_name("sm_90a");
  const MoeShape s20b = model_shape("gpt-oss-20b");
  auto fc1 = [&](int t) { return heuristic_plan(s20b, t, sm90, ActivationFormat::kMxfp8).fc1.name(); };
  EXPECT_EQ(fc1(1), "bsmma.r128x16.w4x1.s4.k1");
  EXPECT_EQ(fc1(128), "bsmma.r128x16.w4x1.s4.k1");   // 16 expected rows
  EXPECT_EQ(fc1(129), "bsmma.r128x32.w4x1.s4.k1");
  EXPECT_EQ(fc1(257), "bsmma.r128x64.w2x2.s3.k1");
  EXPECT_EQ(fc1(513), "bsmma.r128x128.w2x4.s3.k1");
  EXPECT_EQ(fc1(65536), "bsmma.r128x128.w2x4.s3.k1");
}

// A plan's activations are both its families': a block-scaled tactic only in an MXFP8 plan, and
// the others only in bf16 ones; the error names the stage, the tactic and both formats.
TEST(ValidatePlan, ActivationsMustBeTheFamilies) {
  const MoeShape shape = model_shape("gpt-oss-20b");
  const Arch& sm90 = arch_by_name("sm_90a");
  const Tactic bs = parse_tactic("bsmma.r128x32.w4x1.s4.k1"), mma = parse_tactic("mma.r128x32.w4x1.s4.k1");
  EXPECT_EQ(activations_of(bs), ActivationFormat::kMxfp8);
  EXPECT_EQ(activations_of(mma), ActivationFormat::kBf16);
  EXPECT_NO_THROW(validate_plan(shape, {bs, bs, ActivationFormat::kMxfp8}, sm90));
  EXPECT_NO_THROW(validate_plan(shape, {bs, parse_tactic("bsmma.r128x32.w4x1.s4.k2"), ActivationFormat::kMxfp8}, sm90));
  // FP8 activations run on the bf16 families (the runner rounds their rows between the stages),
  // but not on a whole-layer launch; and on the block-scaled family as MXFP8 rows of one scale per
  // 128, where FC1's tile has 256 rows (whole 128-column blocks); both stages' rows the same kind.
  const Tactic gemv = parse_tactic("gemv.r64x8.w4x2.u2.k1"), fused = parse_tactic("fused.r64x8.w4x2.u2.k1");
  const Tactic bs256 = parse_tactic("bsmma.r256x32.w4x1.s4.k1");
  EXPECT_NO_THROW(validate_plan(shape, {gemv, gemv, ActivationFormat::kFp8}, sm90));
  EXPECT_NO_THROW(validate_plan(shape, {mma, parse_tactic("mma.r128x32.w4x1.s4.k2"), ActivationFormat::kFp8}, sm90));
  EXPECT_NO_THROW(validate_plan(shape, {bs256, bs, ActivationFormat::kFp8}, sm90));
  EXPECT_NO_THROW(validate_plan(shape, {bs256, parse_tactic("bsmma.r256x32.w4x1.s4.k2"), ActivationFormat::kFp8}, sm90));
  EXPECT_NO_THROW(validate_plan(shape, {bs256, bs256, ActivationFormat::kMxfp8}, sm90));
  const std::pair<LayerPlan, const char*> wrong[] = {
      {{bs, bs, ActivationFormat::kBf16}, "FC1 tactic bsmma.r128x32.w4x1.s4.k1 takes mxfp8 activations; the plan's are bf16"},
      {{mma, bs, ActivationFormat::kMxfp8}, "FC1 tactic mma.r128x32.w4x1.s4.k1 takes bf16 activations; the plan's are mxfp8"},
      {{bs, mma, ActivationFormat::kMxfp8}, "FC2 tactic mma.r128x32.w4x1.s4.k1 takes bf16 activations; the plan's are mxfp8"},
      {{bs, bs, ActivationFormat::kFp8},
       "FC1 tactic bsmma.r128x32.w4x1.s4.k1: FP8 activations need FC1 tiles of a multiple of 256 rows (whole "
       "128-column blocks of FC2's input); the plan's activations are fp8"},
      {{bs256, mma, ActivationFormat::kFp8},
       "plan bsmma.r256x32.w4x1.s4.k1 + mma.r128x32.w4x1.s4.k1: FP8 activations pass from FC1 to FC2 as rows both "
       "tactics take, but FC1's family takes mxfp8 rows and FC2's bf16"},
      {{fused, fused, ActivationFormat::kFp8},
       "FC1 tactic fused.r64x8.w4x2.u2.k1: a whole-layer launch cannot round FC1's output between its stages; the "
       "plan's activations are fp8"},
  };
  for (const auto& [plan, message] : wrong) {
    try {
      validate_plan(shape, plan, sm90);
      ADD_FAILURE() << message << ": accepted";
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()), message);
    }
  }
  EXPECT_THROW(parse_activation_format("fp16"), Error);
  EXPECT_EQ(parse_activation_format(activation_format_name(ActivationFormat::kMxfp8)), ActivationFormat::kMxfp8);
  // The FP8 plan is the bf16 one at every T where the tensor cores take no block scales (sm_90a),
  // or where the block-scaled family is not to be used (its first-use check failed).
  const Arch& sm120 = arch_by_name("sm_120a");
  EXPECT_FALSE(multiplies_block_scaled(sm90));
  EXPECT_TRUE(multiplies_block_scaled(sm120));
  for (const int tokens : {1, 8, 64, 512, 4096}) {
    LayerPlan bf16 = heuristic_plan(shape, tokens, sm90);
    bf16.activations = ActivationFormat::kFp8;
    EXPECT_EQ(heuristic_plan(shape, tokens, sm90, ActivationFormat::kFp8), bf16) << tokens;
    LayerPlan bf16_sm120 = heuristic_plan(shape, tokens, sm120);
    bf16_sm120.activations = ActivationFormat::kFp8;
    EXPECT_EQ(heuristic_plan(shape, tokens, sm120, ActivationFormat::kFp8, false), bf16_sm120) << tokens;
  }
  // On sm_120a the block-scaled tiles: FC1's of 256 rows, FC2's the MXFP8 plan's.
  for (const MoeShape& s : {shape, model_shape("deepseek-v4-flash")}) {
    for (const auto& [tokens, fc1] :
         std::initializer_list<std::pair<int, const char*>>{{1, "bsmma.r256x16.w4x1.s4.k1"},
                                                            {16 * s.num_experts / s.top_k, "bsmma.r256x16.w4x1.s4.k1"},
                                                            {16 * s.num_experts / s.top_k + 1, "bsmma.r256x32.w4x1.s4.k1"},
                                                            {32 * s.num_experts / s.top_k + 1, "bsmma.r256x64.w4x2.s3.k1"},
                                                            {65536, "bsmma.r256x64.w4x2.s3.k1"}}) {
      const LayerPlan plan = heuristic_plan(s, tokens, sm120, ActivationFormat::kFp8);
      EXPECT_EQ(plan.activations, ActivationFormat::kFp8);
      EXPECT_EQ(plan.fc1.name(), fc1) << s.describe() << " T=" << tokens;
      EXPECT_EQ(plan.fc2, heuristic_plan(s, tokens, sm120, ActivationFormat::kMxfp8).fc2) << tokens;
      EXPECT_NO_THROW(validate_plan(s, plan, sm120)) << tokens;
    }
  }
}

// A wgmma kernel must run on the registers its consumers' setmaxnreg assumes the launch allocates;
// fewer would leave them waiting forever, so such a binary is refused when it is compiled.
TEST(TacticTable, WgmmaBinaryWithFewerRegistersThanItsLaunchAssumesIsRefused) {
  const Tactic w16 = parse_tactic("wgmma.r256x64.w16.s6.k1"), w8 = parse_tactic("wgmma.r256x64.w8.s5.k1");
  const KernelFamily& family = *w16.family;
  EXPECT_EQ(family.why_unfit_binary(w16, std::vector<int>{96, 96}), "");
  EXPECT_EQ(family.why_unfit_binary(w8, std::vector<int>{168, 168}), "");
  EXPECT_NE(family.why_unfit_binary(w16, std::vector<int>{96, 88}).find("88 registers"), std::string::npos);
  EXPECT_NE(family.why_unfit_binary(w8, std::vector<int>{0, 168}), "");
  const Tactic mma = parse_tactic("mma.r128x64.w2x2.s3.k1");
  EXPECT_EQ(mma.family->why_unfit_binary(mma, std::vector<int>{40, 40}), "");
}

// CI's check that the whole table builds: every valid tactic for every arch through NVRTC. It also
// reads the assembler's performance warnings, which no run on a GPU names (the tactic is only
// slower than its design): no tactic may have its MMAs serialised, the tensor-core tile families
// (their loops hold the accumulators) may not spill, and the GEMV-style decode kernels spill at
// most kDecodeSpillBytes of stores (with NVRTC 13.0: 4-20 bytes, a few words of state,
// in 16 of the (tactic, arch) pairs of the gemv, sk, ring and fused families).
TEST(TacticTable, EveryValidTacticCompilesForEveryArchWithoutSerialisedMmasOrSpilledTiles) {
  constexpr int kDecodeSpillBytes = 32;
  auto is_tile_family = [](const KernelFamily* family) {
    return family == &wgmma_family() || family == &mma_tile_family() || family == &block_scaled_tile_family();
  };
  struct Job {
    Tactic tactic;
    const Arch* arch;
  };
  std::vector<Job> jobs;
  for (const auto& arch : supported_archs()) {
    for (const Tactic& t : valid_tactics(arch.name)) jobs.push_back({t, &arch});
  }
  std::atomic<size_t> next{0};
  std::mutex mutex;
  std::vector<std::string> failures;
  std::vector<std::thread> threads;
  for (unsigned i = 0; i < std::max(1u, std::thread::hardware_concurrency()); ++i) {
    threads.emplace_back([&] {
      for (size_t j = next++; j < jobs.size(); j = next++) {
        try {
          const KernelBinary b = compile_tactic(jobs[j].tactic, *jobs[j].arch);
          if (b.cubin->empty() || b.kernel_names.size() != 2) throw Error("empty result");
          for (const std::string& w : b.assembler_warnings) {
            const int spilled = spill_store_bytes(w);
            if (serialises_mma(w) || (spilled > 0 && is_tile_family(jobs[j].tactic.family)) ||
                spilled > kDecodeSpillBytes) {
              throw Error("the assembler: " + w);
            }
          }
        } catch (const std::exception& e) {
          std::lock_guard lock(mutex);
          failures.push_back(std::string(jobs[j].arch->name) + " " + jobs[j].tactic.name() + ": " + e.what());
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_TRUE(failures.empty()) << failures.front();
  EXPECT_GE(jobs.size(), 40u);
}

}  // namespace
}  // namespace mxmoe
