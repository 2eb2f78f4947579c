#include <nlohmann/json.hpp>
#include <vector>

#include "common/atomic_file.hpp"
#include "mxmoe/error.hpp"
#include "mxmoe/safetensors.hpp"

namespace mxmoe {

void write_safetensors(const std::string& path, std::span<const TensorToWrite> tensors,
                       const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    uint64_t elements = 1;
    for (int64_t d : t.shape) elements *= static_cast<uint64_t>(d);
    if (elements * dtype_size(t.dtype) != t.bytes.size()) {
      throw Error(path + ": tensor '" + t.name + "': " + std::to_string(t.bytes.size()) + " bytes given for " +
                  TensorInfo{t.name, t.dtype, t.shape, {}}.describe());
    }
    header[t.name] = {{"dtype", dtype_name(t.dtype)}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.bytes.size()}}};
    offset += t.bytes.size();
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // keeps the data 8-byte aligned, as the reference writer does
  uint8_t length[8];
  for (int i = 0; i < 8; ++i) length[i] = static_cast<uint8_t>(static_cast<uint64_t>(text.size()) >> (8 * i));

  std::vector<std::span<const uint8_t>> pieces{std::span<const uint8_t>(length, 8),
                                               std::span(reinterpret_cast<const uint8_t*>(text.data()), text.size())};
  for (const auto& t : tensors) pieces.push_back(t.bytes);
  write_file_atomically(path, pieces);
}

}  // namespace mxmoe
