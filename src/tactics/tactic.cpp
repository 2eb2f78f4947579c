// Tactic names, the tactic table and the plan facts of include/mxmoe/tactic.hpp, from the kernel
// families' registry.
#include "mxmoe/tactic.hpp"

#include <charconv>

#include "device/arch.hpp"
#include "kernels/family_registry.hpp"
#include "mxmoe/error.hpp"
#include "route/route_buffers.hpp"

namespace mxmoe {
namespace {

// Reads "<separator><number>" at the front of `text`, advancing it.
int take_number(std::string_view& text, std::string_view separator, std::string_view whole) {
  if (text.substr(0, separator.size()) != separator) {
    throw Error("malformed tactic '" + std::string(whole) + "': expected '" + std::string(separator) + "'");
  }
  text.remove_prefix(separator.size());
  int value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || value <= 0) throw Error("malformed tactic '" + std::string(whole) + "': expected a number");
  text.remove_prefix(static_cast<size_t>(end - text.data()));
  return value;
}

}  // namespace

std::string Tactic::name() const {
  require_family(*this, "naming a tactic");
  std::string s(family->prefix());
  for (const NameField& field : family->name_fields()) {
    s.append(field.separator).append(std::to_string(this->*field.field));
  }
  return s;
}

Tactic Tactic::binary() const {
  Tactic t = *this;
  t.k_split = 1;
  return t;
}

Tactic parse_tactic(std::string_view name) {
  const size_t dot = name.find('.');
  const KernelFamily* f = dot == std::string_view::npos ? nullptr : family_by_prefix(name.substr(0, dot));
  if (!f) {
    std::string expected;
    for (const KernelFamily* family : kernel_families()) {
      expected += (expected.empty() ? "'" : ", '") + std::string(family->prefix()) + ".'";
    }
    throw Error("malformed tactic '" + std::string(name) + "': expected one of " + expected);
  }
  Tactic t;
  t.family = f;
  std::string_view rest = name.substr(dot);
  for (const NameField& field : f->name_fields()) t.*field.field = take_number(rest, field.separator, name);
  if (!rest.empty()) throw Error("malformed tactic '" + std::string(name) + "': trailing '" + std::string(rest) + "'");
  return t;
}

ActivationFormat activations_of(const Tactic& t) {
  require_family(t, "the activations of a tactic");
  return t.family->activations();
}

bool LayerPlan::whole_layer() const {
  require_family(fc1, "FC1 tactic");
  return fc1.family->whole_layer();
}

bool can_route_in_expert_kernels(const LayerPlan& plan, int num_tokens, int top_k) {
  require_family(plan.fc1, "FC1 tactic");
  require_family(plan.fc2, "FC2 tactic");
  return plan.fc1.family->routes_small_batches() && plan.fc2.family->routes_small_batches() &&
         num_tokens * top_k <= kernels::kSmallBatchPairs;
}

std::vector<TacticEntry> tactic_table(std::string_view arch_name) {
  const Arch& arch = arch_by_name(arch_name);
  std::vector<TacticEntry> table;
  for (const KernelFamily* f : kernel_families()) {
    for (const TacticCandidate& c : f->candidates()) {
      table.push_back({c.tactic, std::string(c.reason), f->why_invalid(c.tactic, arch)});
    }
  }
  return table;
}

const std::vector<Tactic>& valid_tactics(std::string_view arch) {
  static const std::vector<std::vector<Tactic>> per_arch = [] {
    std::vector<std::vector<Tactic>> all;
    for (const Arch& a : supported_archs()) {
      std::vector<Tactic> valid;
      for (const TacticEntry& e : tactic_table(a.name)) {
        if (e.invalid.empty()) valid.push_back(e.tactic);
      }
      all.push_back(std::move(valid));
    }
    return all;
  }();
  return per_arch[&arch_by_name(arch) - supported_archs().data()];
}

}  // namespace mxmoe
