#include "tactics/tuned_plans.hpp"

#include <filesystem>
#include <nlohmann/json.hpp>

#include "common/atomic_file.hpp"
#include "common/read_file.hpp"
#include "common/warnings.hpp"
#include "mxmoe/error.hpp"
#include "tactics/validate_plan.hpp"

namespace mxmoe {
namespace {

using Json = nlohmann::ordered_json;
constexpr const char* kFormat = "mxmoe-tuned 1";

Json shape_json(const MoeShape& s) {
  return {{"experts", s.num_experts}, {"top_k", s.top_k}, {"hidden", s.hidden}, {"intermediate", s.intermediate}};
}

// Field by field: the file may have been rewritten with its keys in another order.
bool is_shape(const Json& j, const MoeShape& s) {
  return j.is_object() && j.value("experts", -1) == s.num_experts && j.value("top_k", -1) == s.top_k &&
         j.value("hidden", -1) == s.hidden && j.value("intermediate", -1) == s.intermediate;
}

// A shape's group of plans: its activations, bf16 where the group does not say.
ActivationFormat group_activations(const Json& group) {
  return parse_activation_format(group.value("activations", std::string("bf16")));
}

std::optional<Json> read_table(const std::string& path) {
  const std::optional<std::string> text = read_file(path);
  if (!text) return std::nullopt;
  try {
    Json table = Json::parse(*text);
    if (table.value("format", "") != kFormat) throw Error("unknown format");
    return table;
  } catch (const std::exception& e) {
    warn_once("tuned table " + path + " is malformed (" + e.what() + "); ignoring it");
    return std::nullopt;
  }
}

}  // namespace

std::string TunedPlans::path(const std::string& cache_dir, const std::string& device_name, const Arch& arch) {
  std::string name;
  for (char c : device_name) name += std::isalnum(static_cast<unsigned char>(c)) ? c : '-';
  return cache_dir + "/tuned/" + name + "." + std::string(arch.name) + ".json";
}

TunedPlans TunedPlans::load(const std::string& cache_dir, const std::string& device_name, const Arch& arch,
                            const MoeShape& shape) {
  TunedPlans tuned;
  const std::string file = path(cache_dir, device_name, arch);
  const auto table = read_table(file);
  if (!table) return tuned;
  if (table->value("mxmoe_version", "") != MXMOE_VERSION || table->value("device", "") != device_name ||
      table->value("arch", "") != arch.name) {
    warn_once("tuned table " + file + " was made by mxmoe " + table->value("mxmoe_version", "?") + " for " +
              table->value("device", "?") + " " + table->value("arch", "?") + "; ignoring it (re-run mxmoe tune)");
    return tuned;
  }
  try {
    for (const auto& s : table->at("shapes")) {
      if (!is_shape(s.at("shape"), shape)) continue;
      const ActivationFormat activations = group_activations(s);
      for (const auto& e : s.at("plans")) {
        const int tokens = e.at("tokens").get<int>();
        try {
          TunedEntry entry{{parse_tactic(e.at("fc1").get<std::string>()), parse_tactic(e.at("fc2").get<std::string>()),
                            activations},
                           e.value("us", 0.0), e.value("heuristic_us", 0.0)};
          validate_plan(shape, entry.plan, arch);
          tuned.entries_[static_cast<int>(activations)][tokens] = entry;
        } catch (const Error& bad) {
          const char* format = activations == ActivationFormat::kMxfp8 ? " with MXFP8 activations"
                               : activations == ActivationFormat::kFp8 ? " with FP8 activations"
                                                                        : "";
          warn_once("tuned table " + file + ": ignoring the plan for T = " + std::to_string(tokens) + format + " (" +
                    bad.what() + ")");
        }
      }
    }
  } catch (const std::exception& e) {  // JSON errors, and an activation format it does not know
    warn_once("tuned table " + file + " is malformed (" + e.what() + "); ignoring it");
    for (auto& entries : tuned.entries_) entries.clear();
  }
  return tuned;
}

void TunedPlans::store(const std::string& cache_dir, const std::string& device_name, const Arch& arch,
                       const MoeShape& shape, const std::map<int, TunedEntry>& entries,
                       ActivationFormat activations) {
  const std::string file = path(cache_dir, device_name, arch);
  Json table = read_table(file).value_or(Json::object());
  if (table.value("mxmoe_version", "") != MXMOE_VERSION) table = Json::object();
  table["format"] = kFormat;
  table["mxmoe_version"] = MXMOE_VERSION;
  table["device"] = device_name;
  table["arch"] = arch.name;
  Json shapes = Json::array();
  for (const auto& s : table.value("shapes", Json::array())) {
    bool same_group = false;
    try {
      same_group = is_shape(s.value("shape", Json{}), shape) && group_activations(s) == activations;
    } catch (const std::exception&) {  // a group it cannot read is kept as it is
    }
    if (!same_group) shapes.push_back(s);
  }
  Json plans = Json::array();
  for (const auto& [tokens, e] : entries) {
    plans.push_back({{"tokens", tokens}, {"fc1", e.plan.fc1.name()}, {"fc2", e.plan.fc2.name()}, {"us", e.us},
                     {"heuristic_us", e.heuristic_us}});
  }
  Json group = {{"shape", shape_json(shape)}};
  if (activations != ActivationFormat::kBf16) group["activations"] = activation_format_name(activations);
  group["plans"] = plans;
  shapes.push_back(group);
  table["shapes"] = shapes;
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(file).parent_path(), ec);
  const std::string text = table.dump(2) + "\n";
  const std::span<const uint8_t> piece(reinterpret_cast<const uint8_t*>(text.data()), text.size());
  write_file_atomically(file, std::span(&piece, 1));
}

std::optional<LayerPlan> TunedPlans::find(int num_tokens, ActivationFormat activations) const {
  const auto& entries = entries_[static_cast<int>(activations)];
  const auto it = entries.lower_bound(num_tokens);
  if (it == entries.end()) return std::nullopt;
  return it->second.plan;
}

}  // namespace mxmoe
