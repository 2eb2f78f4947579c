// Plans found by `mxmoe tune`, persisted per device in the cache directory:
//   <cache>/tuned/<device name>.<arch>.json
// keyed inside by layer shape, activation format (a plan's activations, LayerPlan::activations: a
// shape's bf16 and MXFP8 plans are tuned and stored apart) and token-count bucket, stamped with the
// mxmoe version. A table from
// another mxmoe version, for another device or arch, or that does not parse, is ignored with one
// warning; so is an entry whose tactic is not valid here.
#pragma once

#include <map>
#include <optional>
#include <string>

#include "device/arch.hpp"
#include "mxmoe/moe_shape.hpp"
#include "mxmoe/tactic.hpp"

namespace mxmoe {

struct TunedEntry {
  LayerPlan plan;
  double us = 0.0;            // the winner's median time per layer
  double heuristic_us = 0.0;  // the heuristic plan's, measured in the same sweep
};

class TunedPlans {
 public:
  static std::string path(const std::string& cache_dir, const std::string& device_name, const Arch& arch);
  // Both activation formats' plans of the shape.
  static TunedPlans load(const std::string& cache_dir, const std::string& device_name, const Arch& arch,
                         const MoeShape& shape);
  // Replaces this shape's entries of `activations` in the device's table (other shapes and the other
  // format kept), written atomically. Every entry's plan has those activations.
  static void store(const std::string& cache_dir, const std::string& device_name, const Arch& arch,
                    const MoeShape& shape, const std::map<int, TunedEntry>& entries,
                    ActivationFormat activations = ActivationFormat::kBf16);

  // The plan tuned for the smallest bucket >= num_tokens; none past the largest bucket (a batch the
  // sweep never saw takes the heuristic's plan, not a smaller batch's).
  std::optional<LayerPlan> find(int num_tokens, ActivationFormat activations = ActivationFormat::kBf16) const;
  const std::map<int, TunedEntry>& entries(ActivationFormat activations = ActivationFormat::kBf16) const {
    return entries_[static_cast<int>(activations)];
  }

 private:
  std::map<int, TunedEntry> entries_[3];  // per activation format (ActivationFormat): token bucket -> entry
};

}  // namespace mxmoe
