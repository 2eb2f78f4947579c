// Reading safetensors files: map, parse the header, validate every entry against the mapped bytes.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>

#include "common/printable.hpp"
#include "io/json_text.hpp"
#include "mxmoe/error.hpp"
#include "mxmoe/safetensors.hpp"

namespace mxmoe {
namespace {

struct DtypeEntry {
  Dtype dtype;
  std::string_view name;
  size_t size;
};
constexpr std::array<DtypeEntry, 16> kDtypes{{
    {Dtype::kBool, "BOOL", 1}, {Dtype::kU8, "U8", 1},   {Dtype::kI8, "I8", 1},     {Dtype::kF8E4M3, "F8_E4M3", 1},
    {Dtype::kF8E5M2, "F8_E5M2", 1}, {Dtype::kF8E8M0, "F8_E8M0", 1}, {Dtype::kI16, "I16", 2}, {Dtype::kU16, "U16", 2}, {Dtype::kF16, "F16", 2},
    {Dtype::kBF16, "BF16", 2}, {Dtype::kI32, "I32", 4}, {Dtype::kU32, "U32", 4}, {Dtype::kF32, "F32", 4},
    {Dtype::kI64, "I64", 8},   {Dtype::kU64, "U64", 8}, {Dtype::kF64, "F64", 8},
}};

// The reference implementation (huggingface/safetensors) refuses headers over 100 MB.
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;
constexpr uint64_t kMaxTensorBytes = 1ull << 50;

[[noreturn]] void fail(const std::string& path, const std::string& what) { throw Error(printable(path) + ": " + what); }

using Json = nlohmann::json;


TensorInfo parse_entry(const std::string& path, const std::string& name, const Json& entry,
                       const uint8_t* data, uint64_t data_bytes) {
  const std::string where = "tensor '" + printable(name) + "': ";
  if (!entry.is_object()) fail(path, where + "header entry is not an object");
  TensorInfo info;
  info.name = name;

  const auto dtype_it = entry.find("dtype");
  if (dtype_it == entry.end() || !dtype_it->is_string()) fail(path, where + "missing dtype");
  const std::string dtype = dtype_it->get<std::string>();
  const auto known = std::find_if(kDtypes.begin(), kDtypes.end(), [&](const DtypeEntry& d) { return d.name == dtype; });
  if (known == kDtypes.end()) fail(path, where + "unknown dtype '" + printable(dtype) + "'");
  info.dtype = known->dtype;

  const auto shape_it = entry.find("shape");
  if (shape_it == entry.end() || !shape_it->is_array()) fail(path, where + "missing shape");
  uint64_t elements = 1;
  for (const Json& dim : *shape_it) {
    if (!dim.is_number_unsigned()) fail(path, where + "shape " + json_text(*shape_it) + " is not a list of sizes");
    const uint64_t d = dim.get<uint64_t>();
    if (d != 0 && elements > kMaxTensorBytes / d) fail(path, where + "shape " + json_text(*shape_it) + " is too large");
    elements *= d;
    info.shape.push_back(static_cast<int64_t>(d));
  }

  const auto offsets_it = entry.find("data_offsets");
  if (offsets_it == entry.end() || !offsets_it->is_array() || offsets_it->size() != 2 ||
      !(*offsets_it)[0].is_number_unsigned() || !(*offsets_it)[1].is_number_unsigned()) {
    fail(path, where + "data_offsets must be [begin, end]");
  }
  const uint64_t begin = (*offsets_it)[0].get<uint64_t>(), end = (*offsets_it)[1].get<uint64_t>();
  if (begin > end || end > data_bytes) {
    fail(path, where + "data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
                   "] out of range: the data section holds " + std::to_string(data_bytes) + " bytes");
  }
  if (end - begin != elements * known->size) {
    fail(path, where + "data_offsets span " + std::to_string(end - begin) + " bytes but " + info.describe() +
                   " needs " + std::to_string(elements * known->size));
  }
  info.bytes = std::span<const uint8_t>(data + begin, end - begin);
  return info;
}

}  // namespace

std::string_view dtype_name(Dtype dtype) {
  for (const auto& d : kDtypes) {
    if (d.dtype == dtype) return d.name;
  }
  return "?";
}

size_t dtype_size(Dtype dtype) {
  for (const auto& d : kDtypes) {
    if (d.dtype == dtype) return d.size;
  }
  return 0;
}

std::string TensorInfo::describe() const {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "] " + std::string(dtype_name(dtype));
}

SafetensorsFile::~SafetensorsFile() {
  if (mapping_) munmap(const_cast<uint8_t*>(mapping_), mapping_bytes_);
  if (fd_ >= 0) ::close(fd_);
}

std::shared_ptr<const SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  std::shared_ptr<SafetensorsFile> file(new SafetensorsFile);
  file->path_ = path;
  file->fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (file->fd_ < 0) fail(path, std::string("cannot open: ") + std::strerror(errno));
  struct stat st {};
  if (fstat(file->fd_, &st) != 0 || !S_ISREG(st.st_mode)) fail(path, "not a regular file");
  const uint64_t file_bytes = static_cast<uint64_t>(st.st_size);
  if (file_bytes < 8) {
    fail(path, "truncated: " + std::to_string(file_bytes) + " bytes, too short for the 8-byte header length");
  }
  void* mapping = mmap(nullptr, file_bytes, PROT_READ, MAP_PRIVATE, file->fd_, 0);
  if (mapping == MAP_FAILED) fail(path, std::string("cannot map: ") + std::strerror(errno));
  file->mapping_ = static_cast<const uint8_t*>(mapping);
  file->mapping_bytes_ = file_bytes;

  uint64_t header_bytes = 0;
  for (int i = 7; i >= 0; --i) header_bytes = (header_bytes << 8) | file->mapping_[i];
  if (header_bytes > file_bytes - 8 && (file->mapping_[0] == '{' || file->mapping_[0] == '[')) {
    fail(path, "this is a JSON file (a config.json or an index?), not a safetensors file; give the checkpoint's "
               "directory or one of its .safetensors files");
  }
  if (header_bytes > file_bytes - 8) {
    fail(path, "header length " + std::to_string(header_bytes) + " runs past the end of the file (" +
                   std::to_string(file_bytes) + " bytes)");
  }
  if (header_bytes > kMaxHeaderBytes) fail(path, "header length " + std::to_string(header_bytes) + " exceeds 100 MB");
  const char* header = reinterpret_cast<const char*>(file->mapping_ + 8);
  Json json;
  try {
    json = Json::parse(header, header + header_bytes);
  } catch (const Json::exception& e) {
    fail(path, "header is not valid JSON: " + printable(e.what()));
  }
  if (!json.is_object()) fail(path, "header is not a JSON object");

  const uint8_t* data = file->mapping_ + 8 + header_bytes;
  const uint64_t data_bytes = file_bytes - 8 - header_bytes;
  for (const auto& [name, entry] : json.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) fail(path, "__metadata__ is not an object");
      for (const auto& [key, value] : entry.items()) {
        if (!value.is_string()) fail(path, "__metadata__ value for '" + printable(key) + "' is not a string");
        file->metadata_[key] = value.get<std::string>();
      }
      continue;
    }
    file->tensors_.push_back(parse_entry(path, name, entry, data, data_bytes));
  }

  std::vector<const TensorInfo*> by_offset;
  for (const auto& t : file->tensors_) {
    if (!t.bytes.empty()) by_offset.push_back(&t);
  }
  std::sort(by_offset.begin(), by_offset.end(),
            [](const TensorInfo* a, const TensorInfo* b) { return a->bytes.data() < b->bytes.data(); });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const TensorInfo& prev = *by_offset[i - 1];
    if (by_offset[i]->bytes.data() < prev.bytes.data() + prev.bytes.size()) {
      fail(path, "tensor '" + printable(by_offset[i]->name) + "': data_offsets overlap those of tensor '" +
                     printable(prev.name) + "'");
    }
  }
  std::sort(file->tensors_.begin(), file->tensors_.end(),
            [](const TensorInfo& a, const TensorInfo& b) { return a.name < b.name; });
  return file;
}

const TensorInfo* SafetensorsFile::find(std::string_view name) const {
  const auto it = std::lower_bound(tensors_.begin(), tensors_.end(), name,
                                   [](const TensorInfo& t, std::string_view n) { return t.name < n; });
  return (it != tensors_.end() && it->name == name) ? &*it : nullptr;
}

}  // namespace mxmoe
