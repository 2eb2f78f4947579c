// Opening a checkpoint: a single file, an indexed multi-file directory, or a directory of files.
#include <algorithm>
#include <climits>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>

#include "common/printable.hpp"
#include "common/read_file.hpp"
#include "io/json_text.hpp"
#include "mxmoe/checkpoint.hpp"
#include "mxmoe/error.hpp"
#include "mxmoe/moe_shape.hpp"

namespace mxmoe {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

constexpr const char* kIndexName = "model.safetensors.index.json";


Json read_json(const fs::path& path) {
  const std::optional<std::string> text = read_file(path.string());
  if (!text) throw Error(printable(path.string()) + ": cannot open");
  try {
    return Json::parse(*text);
  } catch (const Json::exception& e) {
    throw Error(printable(path.string()) + ": not valid JSON: " + printable(e.what()));
  }
}

// What config.json says about the MoE layers, under the original gpt-oss's names or transformers'
// (gpt_oss, deepseek_v4). Only the types are checked here; the layer's spec checks the values.
CheckpointConfig read_config(const fs::path& dir) {
  CheckpointConfig out;
  const fs::path path = dir / "config.json";
  if (!fs::is_regular_file(path)) return out;
  const Json config = read_json(path);
  const std::string where = printable(path.string()) + ": ";
  if (!config.is_object()) throw Error(where + "not a JSON object");
  auto number = [&](const char* key) -> std::optional<float> {
    const auto it = config.find(key);
    if (it == config.end()) return std::nullopt;
    if (!it->is_number()) throw Error(where + key + " " + json_text(*it) + " is not a number");
    return it->get<float>();
  };
  for (const char* key : {"experts_per_token", "num_experts_per_tok"}) {
    if (const auto it = config.find(key); it != config.end()) {
      if (!it->is_number_unsigned() || it->get<uint64_t>() < 1 || it->get<uint64_t>() > kMaxTopK) {
        throw Error(where + key + " " + json_text(*it) + " is not a top-k in [1, " + std::to_string(kMaxTopK) + "]");
      }
      out.top_k = static_cast<int>(it->get<uint64_t>());
      break;
    }
  }
  auto size = [&](const char* key) -> std::optional<int> {
    const auto it = config.find(key);
    if (it == config.end()) return std::nullopt;
    if (!it->is_number_unsigned() || it->get<uint64_t>() > INT32_MAX) {
      throw Error(where + key + " " + json_text(*it) + " is not a size");
    }
    return static_cast<int>(it->get<uint64_t>());
  };
  out.routed_experts = size("n_routed_experts");
  out.hidden = size("hidden_size");
  out.moe_intermediate = size("moe_intermediate_size");
  out.swiglu_limit = number("swiglu_limit");
  out.routed_scaling = number("routed_scaling_factor");
  if (const auto it = config.find("scoring_func"); it != config.end()) {
    if (!it->is_string()) throw Error(where + "scoring_func " + json_text(*it) + " is not a string");
    out.scoring_func = it->get<std::string>();
  }
  // transformers' mlp_layer_types ("hash_moe" | "moe" per layer), or the legacy num_hash_layers.
  if (const auto it = config.find("mlp_layer_types"); it != config.end() && !it->is_null()) {
    if (!it->is_array()) throw Error(where + "mlp_layer_types is not a list");
    std::vector<bool> hash;
    for (const Json& type : *it) {
      if (!type.is_string() || (type != "hash_moe" && type != "moe")) {
        throw Error(where + "mlp_layer_types entry " + json_text(type) + " is neither \"hash_moe\" nor \"moe\"");
      }
      hash.push_back(type == "hash_moe");
    }
    out.hash_layers = std::move(hash);
  } else if (const auto n = config.find("num_hash_layers"); n != config.end()) {
    if (!n->is_number_unsigned()) throw Error(where + "num_hash_layers " + json_text(*n) + " is not a count");
    out.num_hash_layers = static_cast<int>(std::min<uint64_t>(n->get<uint64_t>(), INT32_MAX));
  }
  return out;
}

}  // namespace

std::optional<bool> CheckpointConfig::hash_routed(int layer) const {
  if (hash_layers) return layer < static_cast<int>(hash_layers->size()) && (*hash_layers)[layer];
  if (num_hash_layers) return layer < *num_hash_layers;
  return std::nullopt;
}

Checkpoint Checkpoint::open(const std::string& path) {
  Checkpoint c;
  c.path_ = path;
  std::error_code ec;
  const auto status = fs::status(path, ec);
  if (ec || !fs::exists(status)) throw Error(printable(path) + ": no such file or directory");

  auto add_file = [&](const fs::path& file_path) {
    c.files_.push_back(SafetensorsFile::open(file_path.string()));
    return c.files_.size() - 1;
  };
  fs::path dir;
  if (fs::is_regular_file(status)) {
    dir = fs::path(path).parent_path();
    const size_t f = add_file(path);
    for (const auto& t : c.files_[f]->tensors()) c.file_of_tensor_[t.name] = f;
  } else if (fs::is_directory(status)) {
    dir = path;
    if (const fs::path index_path = dir / kIndexName; fs::exists(index_path)) {
      const Json index = read_json(index_path);
      const auto map = index.is_object() ? index.find("weight_map") : index.end();
      if (map == index.end() || !map->is_object()) throw Error(printable(index_path.string()) + ": no weight_map object");
      std::map<std::string, size_t> file_index;
      for (const auto& [tensor, file] : map->items()) {
        if (!file.is_string()) {
          throw Error(printable(index_path.string()) + ": weight_map entry '" + printable(tensor) +
                      "' is not a file name");
        }
        const std::string name = file.get<std::string>();
        if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..") {
          throw Error(printable(index_path.string()) + ": weight_map entry '" + printable(tensor) + "' names '" +
                      printable(name) + "', not a file in the checkpoint directory");
        }
        auto [it, inserted] = file_index.try_emplace(name, 0);
        if (inserted) {
          if (!fs::exists(dir / name)) {
            throw Error(printable(index_path.string()) + ": tensor '" + printable(tensor) + "' is in '" +
                        printable(name) + "', which does not exist");
          }
          it->second = add_file(dir / name);
        }
        if (!c.files_[it->second]->find(tensor)) {
          throw Error(printable(c.files_[it->second]->path()) + ": tensor '" + printable(tensor) + "' listed in " +
                      kIndexName + " is missing");
        }
        c.file_of_tensor_[tensor] = it->second;
      }
    } else {
      std::vector<fs::path> files;
      for (const auto& entry : fs::directory_iterator(dir)) {
        if (entry.is_regular_file() && entry.path().extension() == ".safetensors") files.push_back(entry.path());
      }
      if (files.empty()) throw Error(printable(path) + ": no .safetensors files and no " + kIndexName);
      std::sort(files.begin(), files.end());
      for (const auto& file_path : files) {
        const size_t f = add_file(file_path);
        for (const auto& t : c.files_[f]->tensors()) {
          if (!c.file_of_tensor_.try_emplace(t.name, f).second) {
            throw Error(printable(file_path.string()) + ": tensor '" + printable(t.name) + "' is also in " +
                        printable(c.files_[c.file_of_tensor_[t.name]]->path()));
          }
        }
      }
    }
  } else {
    throw Error(printable(path) + ": neither a file nor a directory");
  }
  c.config_ = read_config(dir.empty() ? fs::path(".") : dir);
  return c;
}

std::optional<Checkpoint::Located> Checkpoint::find(const std::string& name) const {
  const auto it = file_of_tensor_.find(name);
  if (it == file_of_tensor_.end()) return std::nullopt;
  const auto& file = files_[it->second];
  return Located{file->find(name), file};
}

}  // namespace mxmoe
