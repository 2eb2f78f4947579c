#include "test_support.hpp"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "io/gpt_oss_names.hpp"
#include "mxmoe/checkpoint.hpp"
#include "mxmoe/safetensors.hpp"

namespace mxmoe::test {
namespace fs = std::filesystem;

namespace {

// "Suite.Test" with the parameterised tests' slashes replaced, unique within the process.
std::string current_test_name() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string name = std::string(info->test_suite_name()) + "." + info->name();
  for (char& c : name) {
    if (c == '/') c = '_';
  }
  return name;
}

}  // namespace

fs::path scratch_dir() {
  const fs::path dir = fs::temp_directory_path() / ("mxmoe-test-" + std::to_string(getpid())) / current_test_name();
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

void write_file(const fs::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string safetensors_bytes(const std::string& header, const std::string& data, std::optional<uint64_t> header_length) {
  const uint64_t length = header_length.value_or(header.size());
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((length >> (8 * i)) & 0xff);
  return bytes + header + data;
}

CliResult run_cli(const std::string& args) {
  const fs::path base = fs::temp_directory_path() / ("mxmoe-cli-" + std::to_string(getpid()) + "-" + current_test_name());
  const std::string command = std::string(MXMOE_CLI) + " " + args + " >" + base.string() + ".out 2>" + base.string() + ".err";
  const int status = std::system(command.c_str());
  CliResult r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = read_file(base.string() + ".out");
  r.err = read_file(base.string() + ".err");
  fs::remove(base.string() + ".out");
  fs::remove(base.string() + ".err");
  return r;
}

namespace {

// A valid small checkpoint (hf scheme, one file) whose tensors can be edited before writing.
struct EditableLayer {
  MoeShape shape = small_shape(1);
  MoeLayerWeights weights = make_synthetic_layer(shape, 1);
  LayerTensorNames names = layer_tensor_names(CheckpointScheme::kHuggingFace, 0);
  std::vector<TensorToWrite> tensors;

  EditableLayer() {
    const int64_t e = shape.num_experts, h = shape.hidden, i = shape.intermediate, rows1 = shape.fc1_rows();
    auto bf16 = [](const std::vector<Bf16>& v) {
      return std::span(reinterpret_cast<const uint8_t*>(v.data()), v.size() * 2);
    };
    tensors = {{names.router_weight, Dtype::kBF16, {e, h}, bf16(weights.router_weight)},
               {names.router_bias, Dtype::kBF16, {e}, bf16(weights.router_bias)},
               {names.fc1_blocks, Dtype::kU8, {e, rows1, h / 32, 16}, weights.fc1_blocks},
               {names.fc1_scales, Dtype::kU8, {e, rows1, h / 32}, weights.fc1_scales},
               {names.fc1_bias, Dtype::kBF16, {e, rows1}, bf16(weights.fc1_bias)},
               {names.fc2_blocks, Dtype::kU8, {e, h, i / 32, 16}, weights.fc2_blocks},
               {names.fc2_scales, Dtype::kU8, {e, h, i / 32}, weights.fc2_scales},
               {names.fc2_bias, Dtype::kBF16, {e, h}, bf16(weights.fc2_bias)}};
  }
  TensorToWrite& tensor(const std::string& name) {
    for (auto& t : tensors) {
      if (t.name == name) return t;
    }
    throw std::runtime_error("no tensor " + name);
  }
  fs::path write(const fs::path& dir) {
    const fs::path path = dir / "model.safetensors";
    write_safetensors(path.string(), tensors);
    return path;
  }
};

// Rewrites a valid file's header through `edit`, keeping the data section.
fs::path with_header(const fs::path& dir, const std::function<void(nlohmann::json&)>& edit) {
  const fs::path path = EditableLayer().write(dir);
  const std::string bytes = read_file(path);
  uint64_t length = 0;
  for (int i = 7; i >= 0; --i) length = (length << 8) | static_cast<uint8_t>(bytes[i]);
  nlohmann::json header = nlohmann::json::parse(bytes.substr(8, length));
  edit(header);
  write_file(path, safetensors_bytes(header.dump(), bytes.substr(8 + length)));
  return path;
}

}  // namespace

std::vector<BadCheckpoint> bad_checkpoints() {
  const auto names = layer_tensor_names(CheckpointScheme::kHuggingFace, 0);
  return {
      {"empty_file",
       [](const fs::path& dir) {
         write_file(dir / "model.safetensors", "");
         return dir / "model.safetensors";
       },
       {"truncated"}},
      {"truncated_header",
       [](const fs::path& dir) {
         const std::string full = safetensors_bytes(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})", "abcd");
         write_file(dir / "model.safetensors", full.substr(0, 20));
         return dir / "model.safetensors";
       },
       {"header length", "past the end"}},
      {"truncated_data",
       [](const fs::path& dir) {
         const fs::path path = EditableLayer().write(dir);
         const std::string bytes = read_file(path);
         write_file(path, bytes.substr(0, bytes.size() - 100));
         return path;
       },
       {"out of range", "down_proj"}},
      {"header_length_past_end",
       [](const fs::path& dir) {
         write_file(dir / "model.safetensors", safetensors_bytes("{}", "", uint64_t{1} << 40));
         return dir / "model.safetensors";
       },
       {"header length", "past the end"}},
      {"bad_json",
       [](const fs::path& dir) {
         write_file(dir / "model.safetensors", safetensors_bytes(R"({"a": {"dtype": "U8", "shape": [4],)", "abcd"));
         return dir / "model.safetensors";
       },
       {"not valid JSON"}},
      {"header_not_object",
       [](const fs::path& dir) {
         write_file(dir / "model.safetensors", safetensors_bytes("[1, 2, 3]", ""));
         return dir / "model.safetensors";
       },
       {"not a JSON object"}},
      {"offsets_out_of_range",
       [names](const fs::path& dir) {
         return with_header(dir, [&](nlohmann::json& h) {
           auto& offsets = h[names.fc2_bias]["data_offsets"];
           offsets[1] = offsets[1].get<uint64_t>() + 1000000;
         });
       },
       {"out of range", names.fc2_bias}},
      {"offsets_overlapping",
       [names](const fs::path& dir) {
         return with_header(dir, [&](nlohmann::json& h) {
           // Point the router bias at the first bytes of the router weight (same size, so only the overlap is wrong).
           const uint64_t bias_bytes = h[names.router_bias]["data_offsets"][1].get<uint64_t>() -
                                       h[names.router_bias]["data_offsets"][0].get<uint64_t>();
           const uint64_t weight_begin = h[names.router_weight]["data_offsets"][0].get<uint64_t>();
           h[names.router_bias]["data_offsets"] = {weight_begin, weight_begin + bias_bytes};
         });
       },
       {"overlap"}},
      {"offsets_disagree_with_shape",
       [names](const fs::path& dir) {
         return with_header(dir, [&](nlohmann::json& h) { h[names.fc1_bias]["shape"] = {6, 100}; });
       },
       {names.fc1_bias, "needs"}},
      {"unknown_dtype",
       [names](const fs::path& dir) {
         return with_header(dir, [&](nlohmann::json& h) { h[names.fc1_scales]["dtype"] = "Q4"; });
       },
       {names.fc1_scales, "unknown dtype"}},
      {"wrong_dtype",
       [names](const fs::path& dir) {
         EditableLayer layer;
         auto& t = layer.tensor(names.router_bias);
         t.dtype = Dtype::kU16;  // same bytes, wrong type
         return layer.write(dir);
       },
       {names.router_bias, "expected [6] BF16", "got [6] U16"}},
      {"wrong_shape",
       [names](const fs::path& dir) {
         EditableLayer layer;
         layer.tensor(names.fc2_scales).shape = {6, 96, 2};  // H and I/32 swapped
         return layer.write(dir);
       },
       {names.fc2_scales, "expected [6, 64, 3] U8", "got [6, 96, 2] U8"}},
      {"wrong_fc1_rank",
       [names](const fs::path& dir) {
         EditableLayer layer;
         layer.tensor(names.fc1_blocks).shape = {6, 192, 32};
         return layer.write(dir);
       },
       {names.fc1_blocks, "expected [E, 2I, H/32, 16] U8"}},
      {"missing_tensor",
       [names](const fs::path& dir) {
         EditableLayer layer;
         std::erase_if(layer.tensors, [&](const TensorToWrite& t) { return t.name == names.fc2_blocks; });
         return layer.write(dir);
       },
       {names.fc2_blocks, "missing"}},
      {"missing_layer",
       [](const fs::path& dir) {
         write_file(dir / "model.safetensors", safetensors_bytes("{}", ""));
         return dir / "model.safetensors";
       },
       {"no MoE tensors for layer 0"}},
      {"index_names_missing_file",
       [names](const fs::path& dir) {
         EditableLayer().write(dir);
         write_file(dir / "model.safetensors.index.json",
                    nlohmann::json{{"weight_map", {{names.fc1_blocks, "model-00002-of-00002.safetensors"}}}}.dump());
         return dir;
       },
       {"model.safetensors.index.json", "does not exist"}},
      {"index_names_absent_tensor",
       [](const fs::path& dir) {
         EditableLayer().write(dir);
         write_file(dir / "model.safetensors.index.json",
                    nlohmann::json{{"weight_map", {{"model.layers.0.mlp.nonexistent", "model.safetensors"}}}}.dump());
         return dir;
       },
       {"model.layers.0.mlp.nonexistent", "missing"}},
      {"index_bad_json",
       [](const fs::path& dir) {
         EditableLayer().write(dir);
         write_file(dir / "model.safetensors.index.json", "{\"weight_map\": ");
         return dir;
       },
       {"model.safetensors.index.json", "not valid JSON"}},
  };
}

}  // namespace mxmoe::test
