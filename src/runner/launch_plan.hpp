// What forward() launches for a batch, decided once when a plan is prepared: whether a routing
// launch runs (a small batch may route itself inside FC1 and FC2), whether x is gathered into
// sorted rows before FC1, each expert launch (its family, loaded kernel, grid, block, shared memory
// and staged rows), and whether the un-permute runs as a launch of its own (not after a whole-layer
// launch). forward() looks the launch up, fills the arguments and launches; nothing more.
#pragma once

#include <functional>
#include <vector>

#include "device/arch.hpp"
#include "kernels/kernel_family.hpp"
#include "mxmoe/moe_shape.hpp"
#include "mxmoe/tactic.hpp"

namespace mxmoe {

struct LayerLaunch {
  LayerPlan plan;
  bool routing_launch = true;
  bool gather_launch = false;  // x gathered into sorted rows after the routing (FC1 reads it so)
  std::vector<ExpertLaunch> expert_launches;  // FC1's then FC2's, or the one whole-layer launch
  bool unpermute_launch = true;
  // Per stage, which of the routing's tile-offset prefix arrays its tactic reads
  // (tile_size(index) = tile_tokens; route_buffers.hpp).
  int tile_offsets_index[2] = {0, 0};
};

// Checks `plan` against the shape and arch (validate_plan), loads its kernels on the current device
// (compiling them on first use), and decides each launch for `num_tokens` tokens; the launches
// serve any smaller batch too. Throws Error when the plan cannot run.
LayerLaunch make_layer_launch(const MoeShape& shape, const Arch& arch, const LayerPlan& plan, int num_tokens);

// The LayerLaunch of every token count from 1 to a prepared maximum, in buckets: every count up to
// kExactTokens is a bucket of its own (staged rows, self-routing and the per-expert grids change
// with each count there); past it, a bucket is a run of counts with the same plan, cut after each
// power of two, and its launches are made for its largest count (so a grid holds at most twice
// the CTAs a smaller count's work needs, and the CTAs past that work exit at once).
class LaunchTable {
 public:
  static constexpr int kExactTokens = 64;

  // Rebuilds the buckets of 1..max_tokens: plan_of(T) is the plan for T tokens, make(plan, T) a
  // bucket's launches for its largest count T.
  void build(int max_tokens, const std::function<LayerPlan(int)>& plan_of,
             const std::function<LayerLaunch(const LayerPlan&, int)>& make);
  int max_tokens() const { return last_tokens_.empty() ? 0 : last_tokens_.back(); }
  size_t buckets() const { return launches_.size(); }
  // The launches of `num_tokens` tokens, in [1, max_tokens()].
  const LayerLaunch& find(int num_tokens) const;

 private:
  std::vector<int> last_tokens_;  // each bucket's largest count, ascending
  std::vector<LayerLaunch> launches_;
};

}  // namespace mxmoe
