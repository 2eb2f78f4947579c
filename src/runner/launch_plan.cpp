#include "runner/launch_plan.hpp"

#include <algorithm>
#include <bit>

#include "device/current_device.hpp"
#include "kernels/family_registry.hpp"
#include "runner/expert_modules.hpp"
#include "tactics/validate_plan.hpp"

namespace mxmoe {

LayerLaunch make_layer_launch(const MoeShape& shape, const Arch& arch, const LayerPlan& plan, int num_tokens) {
  validate_plan(shape, plan, arch);
  const KernelFamily& fc1_family = *plan.fc1.family;
  const ExpertKernels &fc1_kernels = expert_kernels(plan.fc1), &fc2_kernels = expert_kernels(plan.fc2);
  const StageShape fc1{shape, Stage::kFc1}, fc2{shape, Stage::kFc2};

  // A small batch routes itself in FC1 only where FC1's CTAs are all resident at once: a
  // CTA of a later wave would pay the routing before its first load, while the streaming CTAs wait
  // on its issue slots (docs/performance.md, "The heuristic's decisions"). They route from the
  // router logits as the layer's router does, or from the caller's top-k, through an
  // expert-parallel shard's map to its local experts (LayerArgs::source).
  bool routes_itself = false;
  if (can_route_in_expert_kernels(plan, num_tokens, shape.top_k)) {
    const LaunchGeometry g = fc1_family.geometry(plan.fc1, fc1, num_tokens, true, fc1_kernels.fc1);
    const long long ctas = static_cast<long long>(g.grid.x) * g.grid.y * g.grid.z;
    routes_itself = ctas <= resident_ctas(fc1_kernels.fc1, g.threads, g.smem_bytes);
  }

  LayerLaunch l;
  l.plan = plan;
  l.routing_launch = !routes_itself;
  l.gather_launch = !fc1_family.whole_layer() && fc1_family.reads_sorted_input();
  auto expert_launch = [&](const Tactic& t, const StageShape& stage, const void* kernel, std::string what) {
    return ExpertLaunch{.stage = stage.stage,
                        .tactic = t,
                        .kernel = kernel,
                        .geometry = t.family->geometry(t, stage, num_tokens,
                                                       routes_itself && stage.stage == Stage::kFc1, kernel),
                        .what = std::move(what) + " " + t.name() + " launch"};
  };
  if (fc1_family.whole_layer()) {
    l.expert_launches.push_back(expert_launch(plan.fc1, fc1, fc1_kernels.fc1, "whole layer"));
    l.unpermute_launch = false;
  } else {
    l.expert_launches.push_back(expert_launch(plan.fc1, fc1, fc1_kernels.fc1, "FC1"));
    l.expert_launches.push_back(expert_launch(plan.fc2, fc2, fc2_kernels.fc2, "FC2"));
    l.unpermute_launch = !plan.fc2.family->writes_layer_output();
  }
  for (const auto& [stage, t] : {std::pair{0, &plan.fc1}, std::pair{1, &plan.fc2}}) {
    l.tile_offsets_index[stage] = kernels::tile_size_index(t->tile_tokens);
  }
  return l;
}

void LaunchTable::build(int max_tokens, const std::function<LayerPlan(int)>& plan_of,
                        const std::function<LayerLaunch(const LayerPlan&, int)>& make) {
  std::vector<int> last_tokens;
  std::vector<LayerPlan> plans;
  for (int t = 1; t <= max_tokens; ++t) {
    LayerPlan plan = plan_of(t);
    const bool joins = t > kExactTokens && !std::has_single_bit(static_cast<unsigned>(t - 1)) && plan == plans.back();
    if (joins) {
      last_tokens.back() = t;
    } else {
      last_tokens.push_back(t);
      plans.push_back(std::move(plan));
    }
  }
  std::vector<LayerLaunch> launches;
  for (size_t b = 0; b < plans.size(); ++b) launches.push_back(make(plans[b], last_tokens[b]));
  last_tokens_ = std::move(last_tokens);
  launches_ = std::move(launches);
}

const LayerLaunch& LaunchTable::find(int num_tokens) const {
  const auto it = std::lower_bound(last_tokens_.begin(), last_tokens_.end(), num_tokens);
  return launches_[static_cast<size_t>(it - last_tokens_.begin())];
}

}  // namespace mxmoe
