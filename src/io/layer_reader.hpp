// Reading one layer's tensors out of a checkpoint, holding each to exactly the dtype and shape the
// layer's shape implies, and keeping the files they live in open for as long as the weights view them.
#pragma once

#include <algorithm>
#include <climits>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/printable.hpp"
#include "mxmoe/checkpoint.hpp"
#include "mxmoe/error.hpp"

namespace mxmoe {

struct ExpectedTensor {
  const std::string& name;
  Dtype dtype;
  std::vector<int64_t> shape;
};

class LayerReader {
 public:
  LayerReader(const Checkpoint& checkpoint, int layer, CheckpointScheme scheme)
      : checkpoint_(checkpoint), layer_(layer), scheme_(scheme) {}

  // Throws Error naming the tensor, the layer and the scheme when the checkpoint lacks it.
  Checkpoint::Located require(const std::string& name) {
    auto located = checkpoint_.find(name);
    if (!located) {
      throw Error(printable(checkpoint_.path()) + ": tensor '" + name + "' is missing (layer " +
                  std::to_string(layer_) + ", " + std::string(scheme_name(scheme_)) + " scheme)");
    }
    files_.push_back(located->file);
    return *located;
  }

  // The tensor's bytes; throws Error quoting what was expected and what is there for any other
  // dtype (any of `dtypes`) or shape.
  std::span<const uint8_t> bytes(const ExpectedTensor& e, std::initializer_list<Dtype> also = {}) {
    const auto located = require(e.name);
    const bool dtype_ok = located.tensor->dtype == e.dtype ||
                          std::find(also.begin(), also.end(), located.tensor->dtype) != also.end();
    if (!dtype_ok || located.tensor->shape != e.shape) {
      const TensorInfo want{e.name, e.dtype, e.shape, {}};
      throw Error(printable(located.file->path()) + ": tensor '" + e.name + "': expected " + want.describe() +
                  ", got " + located.tensor->describe());
    }
    return located.tensor->bytes;
  }

  template <typename T>
  std::vector<T> copy(const ExpectedTensor& e) {
    const auto raw = bytes(e);
    std::vector<T> out(raw.size() / sizeof(T));
    std::memcpy(out.data(), raw.data(), raw.size());
    return out;
  }

  std::vector<MoeLayerWeights::MappedFile> mapped_files() const {
    std::vector<MoeLayerWeights::MappedFile> out;
    for (const auto& file : files_) {
      const auto mapping = file->mapping();
      if (std::none_of(out.begin(), out.end(), [&](const auto& f) { return f.base == mapping.data(); })) {
        out.push_back({mapping.data(), mapping.size(), file->fd()});
      }
    }
    return out;
  }

  // Keeps every file read so far open and mapped.
  std::shared_ptr<const void> keepalive() const {
    return std::make_shared<const std::vector<std::shared_ptr<const SafetensorsFile>>>(files_);
  }

 private:
  const Checkpoint& checkpoint_;
  int layer_;
  CheckpointScheme scheme_;
  std::vector<std::shared_ptr<const SafetensorsFile>> files_;
};

// The shape of a layer from one expert tensor's dimensions, the top-k and the spec; throws Error
// quoting the tensor when they do not make a valid shape.
inline MoeShape checked_layer_shape(const Checkpoint::Located& tensor, const std::string& name, int64_t experts,
                                    int64_t hidden, int64_t intermediate, int top_k, const LayerSpec& spec) {
  auto clamp = [](int64_t v) { return static_cast<int>(std::clamp<int64_t>(v, 0, INT32_MAX)); };
  const MoeShape shape(clamp(experts), top_k, clamp(hidden), clamp(intermediate), 1, spec);
  try {
    shape.validate();
  } catch (const Error& e) {
    throw Error(printable(tensor.file->path()) + ": tensor '" + name + "' " + tensor.tensor->describe() + ": " +
                e.what());
  }
  return shape;
}

}  // namespace mxmoe
