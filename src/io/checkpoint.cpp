// Opening a checkpoint: a single file, an indexed multi-file directory, or a directory of files.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/printable.hpp"
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
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(printable(path.string()) + ": cannot open");
  std::stringstream text;
  text << in.rdbuf();
  try {
    return Json::parse(text.str());
  } catch (const Json::exception& e) {
    throw Error(printable(path.string()) + ": not valid JSON: " + printable(e.what()));
  }
}

// top-k from config.json (experts_per_token in the original config, num_experts_per_tok in
// transformers'); rejects a swiglu_limit other than the one the kernels implement.
std::optional<int> read_config_top_k(const fs::path& dir) {
  const fs::path path = dir / "config.json";
  if (!fs::is_regular_file(path)) return std::nullopt;
  const Json config = read_json(path);
  if (!config.is_object()) throw Error(printable(path.string()) + ": not a JSON object");
  if (const auto it = config.find("swiglu_limit"); it != config.end()) {
    if (!it->is_number() || it->get<double>() != kSwigluLimit) {
      throw Error(printable(path.string()) + ": swiglu_limit " + json_text(*it) +
                  " is not supported (mxmoe implements 7.0)");
    }
  }
  for (const char* key : {"experts_per_token", "num_experts_per_tok"}) {
    if (const auto it = config.find(key); it != config.end()) {
      if (!it->is_number_unsigned() || it->get<uint64_t>() < 1 || it->get<uint64_t>() > kMaxTopK) {
        throw Error(printable(path.string()) + ": " + key + " " + json_text(*it) + " is not a top-k in [1, " +
                    std::to_string(kMaxTopK) + "]");
      }
      return static_cast<int>(it->get<uint64_t>());
    }
  }
  return std::nullopt;
}

}  // namespace

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
  c.config_top_k_ = read_config_top_k(dir.empty() ? fs::path(".") : dir);
  return c;
}

std::optional<Checkpoint::Located> Checkpoint::find(const std::string& name) const {
  const auto it = file_of_tensor_.find(name);
  if (it == file_of_tensor_.end()) return std::nullopt;
  const auto& file = files_[it->second];
  return Located{file->find(name), file};
}

}  // namespace mxmoe
