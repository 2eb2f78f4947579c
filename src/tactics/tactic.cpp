// Tactic names, validation against a layer shape, and the token-count heuristic.
#include "tactics/tactic_choice.hpp"

#include <algorithm>

#include "mxmoe/error.hpp"

namespace mxmoe {

std::string Tactic::name() const {
  const std::string split = ".k" + std::to_string(k_split);
  if (family == KernelFamily::kGemv) {
    return "gemv.r" + std::to_string(tile_rows) + ".w" + std::to_string(warps()) + ".u" + std::to_string(stages) + split;
  }
  return "mma.r" + std::to_string(tile_rows) + "x" + std::to_string(tile_tokens) + ".w" + std::to_string(warps_rows) +
         "x" + std::to_string(warps_tokens) + ".s" + std::to_string(stages) + split;
}

void validate_plan(const MoeShape& shape, const LayerPlan& plan) {
  for (const auto& [tactic, stage] : {std::pair{plan.fc1, Stage::kFc1}, std::pair{plan.fc2, Stage::kFc2}}) {
    Tactic compiled = tactic;
    compiled.k_split = 1;
    const auto list = compiled_tactics();
    const char* which = stage == Stage::kFc1 ? "FC1" : "FC2";
    if (std::find(list.begin(), list.end(), compiled) == list.end()) {
      throw Error(std::string(which) + " tactic " + tactic.name() + " is not compiled into this library");
    }
    const int k = stage == Stage::kFc1 ? shape.hidden : shape.intermediate;
    const int k_tiles = (k + 63) / 64;
    if (tactic.k_split < 1 || tactic.k_split > std::min(kMaxKSplit, k_tiles) || (stage == Stage::kFc1 && tactic.k_split != 1)) {
      throw Error(std::string(which) + " tactic " + tactic.name() + ": k_split must be 1 for FC1 and in [1, " +
                  std::to_string(std::min(kMaxKSplit, k_tiles)) + "] for FC2");
    }
  }
}

// Rows per expert if routing were even: T k / E. At most 8 tokens every expert sees at most 8 rows
// (one GEMV pass); past that the smallest token tile that covers the expected count, so that
// padding stays under half the tile, up to 128.
LayerPlan heuristic_plan(const MoeShape& shape, int num_tokens) {
  const auto list = compiled_tactics();
  auto first_of = [&](KernelFamily family, int tile_tokens) {
    for (const auto& t : list) {
      if (t.family == family && t.tile_tokens == tile_tokens) return t;
    }
    throw Error("no compiled tactic for " + std::to_string(tile_tokens) + "-token tiles");
  };
  if (num_tokens <= 8) {
    const Tactic gemv = first_of(KernelFamily::kGemv, 8);
    return {gemv, gemv};
  }
  const long long expected = (static_cast<long long>(num_tokens) * shape.top_k + shape.num_experts - 1) / shape.num_experts;
  int tile = 16;
  while (tile < 128 && tile < expected) tile *= 2;
  const Tactic mma = first_of(KernelFamily::kMmaTile, tile);
  return {mma, mma};
}

}  // namespace mxmoe
