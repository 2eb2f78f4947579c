#include <nlohmann/json.hpp>
#include <vector>

#include "common/atomic_file.hpp"
#include "mxmoe/error.hpp"
#include "mxmoe/safetensors.hpp"

namespace mxmoe {

SafetensorsWriter::SafetensorsWriter(const std::string& path, std::span<const TensorToWrite> layout,
                                     const std::map<std::string, std::string>& metadata)
    : path_(path) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& t : layout) {
    uint64_t elements = 1;
    for (int64_t d : t.shape) elements *= static_cast<uint64_t>(d);
    const uint64_t bytes = elements * dtype_size(t.dtype);
    header[t.name] = {{"dtype", dtype_name(t.dtype)}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    layout_.push_back({t.name, bytes});
    offset += bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // keeps the data 8-byte aligned, as the reference writer does
  uint8_t length[8];
  for (int i = 0; i < 8; ++i) length[i] = static_cast<uint8_t>(static_cast<uint64_t>(text.size()) >> (8 * i));
  file_ = std::make_unique<AtomicFileWriter>(path);
  file_->write(std::span<const uint8_t>(length, 8));
  file_->write(std::span(reinterpret_cast<const uint8_t*>(text.data()), text.size()));
}

SafetensorsWriter::~SafetensorsWriter() = default;

void SafetensorsWriter::append(const std::string& name, std::span<const uint8_t> bytes) {
  if (next_ == layout_.size()) throw Error(path_ + ": tensor '" + name + "' is past the end of the layout");
  const Pending& want = layout_[next_];
  if (want.name != name) throw Error(path_ + ": tensor '" + name + "' given where '" + want.name + "' comes next");
  if (want.bytes != bytes.size()) {
    throw Error(path_ + ": tensor '" + name + "': " + std::to_string(bytes.size()) + " bytes given, the layout says " +
                std::to_string(want.bytes));
  }
  file_->write(bytes);
  ++next_;
}

void SafetensorsWriter::finish() {
  if (next_ != layout_.size()) {
    throw Error(path_ + ": finished with " + std::to_string(layout_.size() - next_) + " tensors unwritten (next '" +
                layout_[next_].name + "')");
  }
  file_->commit();
}

void write_safetensors(const std::string& path, std::span<const TensorToWrite> tensors,
                       const std::map<std::string, std::string>& metadata) {
  for (const auto& t : tensors) {
    uint64_t elements = 1;
    for (int64_t d : t.shape) elements *= static_cast<uint64_t>(d);
    if (elements * dtype_size(t.dtype) != t.bytes.size()) {
      throw Error(path + ": tensor '" + t.name + "': " + std::to_string(t.bytes.size()) + " bytes given for " +
                  TensorInfo{t.name, t.dtype, t.shape, {}}.describe());
    }
  }
  SafetensorsWriter writer(path, tensors, metadata);
  for (const auto& t : tensors) writer.append(t.name, t.bytes);
  writer.finish();
}

}  // namespace mxmoe
