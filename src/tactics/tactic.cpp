// Tactic names and parsing, plan validation, and the token-count heuristic.
#include <algorithm>
#include <charconv>
#include <cmath>

#include "kernels/smem_bytes.hpp"
#include "mxmoe/error.hpp"
#include "tactics/tactic_choice.hpp"

namespace mxmoe {
namespace {

// The GEMV shapes `mxmoe tune` kept choosing on an H100 (docs/perf-notes.md, decode rounds 6-18),
// all with the shallow two-record pipeline held to 80 registers: for the few columns of <= 4
// touched experts, warps along K (FC1 2 per column, FC2, which has half FC1's rows, 4); 8 columns
// per CTA once more experts fill the SMs (FC2 of <= 12 experts keeps 2 warps along K). Past ~12
// touched experts, where those CTAs run in more than one wave, the stream-K GEMV with one 24-warp
// CTA per SM (round 22): 8 tokens per tile up to ~4 expected rows per expert, 16 up to 8.
const Tactic kGemvFewFc1{KernelFamily::kGemv, 64, 8, 4, 2, 2, 1};
const Tactic kGemvFewFc2{KernelFamily::kGemv, 32, 8, 2, 4, 2, 1};
const Tactic kGemvWide{KernelFamily::kGemv, 128, 8, 8, 1, 2, 1};
const Tactic kStreamK{KernelFamily::kGemvStreamK, 384, 8, 24, 1, 2, 1};
const Tactic kStreamK16{KernelFamily::kGemvStreamK, 384, 16, 24, 1, 2, 1};
Tactic mma_tile(int tile_tokens) {
  if (tile_tokens <= 32) return {KernelFamily::kMmaTile, 128, tile_tokens, 4, 1, 4, 1};
  return {KernelFamily::kMmaTile, 128, tile_tokens, 2, tile_tokens / 32, 3, 1};
}

// Reads "<prefix><number>" at the front of `text`, advancing it.
int take_number(std::string_view& text, std::string_view prefix, std::string_view whole) {
  if (text.substr(0, prefix.size()) != prefix) {
    throw Error("malformed tactic '" + std::string(whole) + "': expected '" + std::string(prefix) + "'");
  }
  text.remove_prefix(prefix.size());
  int value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || value <= 0) throw Error("malformed tactic '" + std::string(whole) + "': expected a number");
  text.remove_prefix(static_cast<size_t>(end - text.data()));
  return value;
}

// Every family's name is <family>.r<rows>x<tokens>.w<warps>[x<warps>].<stage letter><n>.k<split>;
// the ring and the stream-K GEMV have one warp per column, so no second warp count.
struct Spelling {
  KernelFamily family;
  std::string_view prefix;
  bool warps_tokens;
  std::string_view stages;
};
constexpr Spelling kSpellings[] = {{KernelFamily::kGemv, "gemv", true, ".u"},
                                   {KernelFamily::kGemvRing, "ring", false, ".s"},
                                   {KernelFamily::kMmaTile, "mma", true, ".s"},
                                   {KernelFamily::kFused, "fused", true, ".u"},
                                   {KernelFamily::kGemvStreamK, "sk", false, ".u"}};

}  // namespace

std::string Tactic::name() const {
  const Spelling& f = *std::find_if(std::begin(kSpellings), std::end(kSpellings),
                                    [&](const Spelling& s) { return s.family == family; });
  std::string s(f.prefix);
  auto add = [&](std::string_view separator, int value) { s.append(separator).append(std::to_string(value)); };
  add(".r", tile_rows);
  add("x", tile_tokens);
  add(".w", warps_rows);
  if (f.warps_tokens) add("x", warps_tokens);
  add(f.stages, stages);
  add(".k", k_split);
  return s;
}

Tactic Tactic::binary() const {
  Tactic t = *this;
  t.k_split = 1;
  return t;
}

Tactic parse_tactic(std::string_view name) {
  std::string_view rest = name;
  const Spelling* f = std::find_if(std::begin(kSpellings), std::end(kSpellings), [&](const Spelling& s) {
    return rest.substr(0, s.prefix.size()) == s.prefix && rest.substr(s.prefix.size(), 1) == ".";
  });
  if (f == std::end(kSpellings)) {
    throw Error("malformed tactic '" + std::string(name) + "': expected 'gemv.', 'ring.', 'mma.', 'fused.' or 'sk.'");
  }
  rest.remove_prefix(f->prefix.size());
  Tactic t;
  t.family = f->family;
  t.tile_rows = take_number(rest, ".r", name);
  t.tile_tokens = take_number(rest, "x", name);
  t.warps_rows = take_number(rest, ".w", name);
  t.warps_tokens = f->warps_tokens ? take_number(rest, "x", name) : 1;
  t.stages = take_number(rest, f->stages, name);
  t.k_split = take_number(rest, ".k", name);
  if (!rest.empty()) throw Error("malformed tactic '" + std::string(name) + "': trailing '" + std::string(rest) + "'");
  return t;
}

bool can_route_in_expert_kernels(const LayerPlan& plan, int num_tokens, int top_k) {
  return plan.fc1.family == KernelFamily::kGemv && plan.fc2.family == KernelFamily::kGemv &&
         num_tokens * top_k <= kernels::kSmallBatchPairs;
}

void validate_plan(const MoeShape& shape, const LayerPlan& plan, const Arch& arch) {
  const auto& valid = valid_tactics(arch.name);
  if ((plan.fc1.family == KernelFamily::kFused || plan.fc2.family == KernelFamily::kFused) &&
      !(plan.fc1 == plan.fc2 && plan.fc1.k_split == 1)) {
    throw Error("plan " + plan.fc1.name() + " + " + plan.fc2.name() +
                ": a fused tactic runs the whole layer, so it must be both stages' tactic, with k_split 1");
  }
  for (const auto& [tactic, stage] : {std::pair{plan.fc1, Stage::kFc1}, std::pair{plan.fc2, Stage::kFc2}}) {
    const std::string which = stage == Stage::kFc1 ? "FC1" : "FC2";
    if (std::find(valid.begin(), valid.end(), tactic.binary()) == valid.end()) {
      throw Error(which + " tactic " + tactic.name() + " is not in the " + std::string(arch.name) + " tactic table");
    }
    const int k_tiles = ((stage == Stage::kFc1 ? shape.hidden : shape.intermediate) + 63) / 64;
    const bool stream_k = tactic.family == KernelFamily::kGemvStreamK;
    const int max_split = stage == Stage::kFc1 || stream_k ? 1 : std::min(kMaxKSplit, k_tiles);
    if (tactic.k_split < 1 || tactic.k_split > max_split) {
      throw Error(which + " tactic " + tactic.name() + ": k_split must be in [1, " + std::to_string(max_split) + "]" +
                  (stream_k ? " (a stream-K GEMV splits K itself)"
                   : stage == Stage::kFc1 ? " (FC1's SwiGLU needs whole sums)" : ""));
    }
    const int fc1_k_tiles = (shape.hidden + 63) / 64, fc2_k_tiles = (shape.intermediate + 63) / 64;
    // A GEMV is checked with a small batch's routing past it, which it may hold.
    const int smem =
        tactic.family == KernelFamily::kFused
            ? kernels::fused_smem_bytes(tactic.tile_tokens, tactic.tile_tokens, fc1_k_tiles, fc2_k_tiles,
                                        tactic.warps_rows, tactic.warps_tokens, shape.num_experts)
            : expert_stage_smem_bytes(tactic, tactic.tile_tokens, k_tiles, shape.num_experts,
                                      tactic.family == KernelFamily::kGemv);
    if (smem > arch.smem_per_block) {
      throw Error(which + " tactic " + tactic.name() + ": K = " + std::to_string(k_tiles * 64) +
                  " needs more shared memory than " + std::string(arch.name) + " has; use a K split or a tiled tactic");
    }
  }
}

int expert_stage_smem_bytes(const Tactic& t, int staged_rows, int k_tiles, int num_experts, bool routes_itself) {
  switch (t.family) {
    case KernelFamily::kGemv: {
      const int own = kernels::gemv_smem_bytes(t.tile_tokens, staged_rows, k_tiles, t.k_split, t.warps_rows,
                                               t.warps_tokens);
      if (!routes_itself) return own;
      return kernels::small_route_offset(own) + kernels::small_route_bytes(num_experts);
    }
    case KernelFamily::kGemvStreamK:
      return kernels::stream_smem_bytes(t.tile_tokens, staged_rows, k_tiles, num_experts);
    case KernelFamily::kGemvRing:
      return kernels::ring_smem_bytes(t.tile_tokens, staged_rows, k_tiles, t.k_split, t.warps_rows, t.stages);
    case KernelFamily::kMmaTile:
      return kernels::mma_tile_smem_bytes(t.tile_rows, t.tile_tokens, t.stages);
    case KernelFamily::kFused:
      break;
  }
  throw Error("internal: " + t.name() + " is a whole-layer tactic; its shared memory is the fused layer's");
}

LayerPlan heuristic_plan(const MoeShape& shape, int num_tokens, const Arch& arch) {
  const long long pairs = static_cast<long long>(num_tokens) * shape.top_k;
  const long long rows_expected = (pairs + shape.num_experts - 1) / shape.num_experts;
  const int fc1_k_tiles = (shape.hidden + 63) / 64;
  auto fits = [&](const Tactic& t) {
    return expert_stage_smem_bytes(t, t.tile_tokens, fc1_k_tiles, shape.num_experts, false) <= arch.smem_per_block;
  };
  // Up to ~4 rows per expert (an expert past 8 takes a second pass over its weights, rare there).
  if (fits(kGemvWide) && (num_tokens <= kGemvWide.tile_tokens || rows_expected <= 4)) {
    const double touched =
        shape.num_experts * (1.0 - std::pow(1.0 - static_cast<double>(shape.top_k) / shape.num_experts, num_tokens));
    if (touched < 4.5) return {kGemvFewFc1, kGemvFewFc2};
    if (touched <= 12.0) return {kGemvWide, kGemvFewFc1};
    if (fits(kStreamK)) return {kStreamK, kStreamK};
    return {kGemvWide, kGemvWide};
  }
  if (fits(kStreamK16) && rows_expected <= 8) return {kStreamK16, kStreamK16};
  int tile = 16;
  while (tile < 128 && tile < rows_expected) tile *= 2;
  return {mma_tile(tile), mma_tile(tile)};
}

std::vector<Tactic> default_tactics() {
  return {kGemvFewFc1,  kGemvFewFc2,  kGemvWide,    kStreamK,     kStreamK16,
          mma_tile(16), mma_tile(32), mma_tile(64), mma_tile(128)};
}

}  // namespace mxmoe
