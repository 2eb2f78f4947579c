// DeviceLayerTensors::validate: the shapes, dtypes and alignments of a layer's device tensors, on the
// host (the addresses are only compared, never read).
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <string>

#include "mxmoe/device_layer.hpp"
#include "mxmoe/error.hpp"
#include "mxmoe/mx_format.hpp"

namespace mxmoe {
namespace {

enum class Kind { kCodes, kFloats };  // U8, or BF16 / F32

std::string describe(Dtype dtype, const std::vector<int64_t>& shape) {
  TensorInfo info;
  info.dtype = dtype;
  info.shape = shape;
  return info.describe();
}

std::string expected_text(Kind kind, std::initializer_list<std::vector<int64_t>> shapes) {
  std::string text;
  for (const auto& shape : shapes) {
    text += (text.empty() ? "" : " or ") + describe(kind == Kind::kCodes ? Dtype::kU8 : Dtype::kBF16, shape);
  }
  return kind == Kind::kFloats ? text + " or F32" : text;
}

}  // namespace

void DeviceLayerTensors::validate() const {
  shape.validate();
  const std::string where = "device layer tensors (" + shape.describe() + "): ";
  auto check = [&](const char* name, const DeviceTensor& t, Kind kind,
                   std::initializer_list<std::vector<int64_t>> shapes, size_t alignment = 1) {
    if (!t.data) throw Error(where + name + ": null device address");
    const bool dtype_ok =
        kind == Kind::kCodes ? t.dtype == Dtype::kU8 : t.dtype == Dtype::kBF16 || t.dtype == Dtype::kF32;
    if (!dtype_ok || std::find(shapes.begin(), shapes.end(), t.shape) == shapes.end()) {
      throw Error(where + name + ": expected " + expected_text(kind, shapes) + ", got " + describe(t.dtype, t.shape));
    }
    alignment = std::max(alignment, dtype_size(t.dtype));
    if (reinterpret_cast<uintptr_t>(t.data) % alignment != 0) {
      char address[32];
      std::snprintf(address, sizeof(address), "%p", t.data);
      throw Error(where + name + ": device address " + address + " is not " + std::to_string(alignment) +
                  "-byte aligned");
    }
  };
  // A tensor the spec has is checked; one it has not must be absent.
  auto check_if = [&](bool present, const char* name, const DeviceTensor& t, std::vector<int64_t> tensor_shape) {
    if (present) return check(name, t, Kind::kFloats, {tensor_shape});
    if (t.data) throw Error(where + name + ": given, but the layer's spec (" + shape.spec.describe() + ") has none");
  };
  const int64_t e = shape.num_experts, h = shape.hidden, i = shape.intermediate;
  const LayerSpec& spec = shape.spec;
  check_if(spec.router != RouterKind::kCallerTopK, "router_weight", router_weight, {e, h});
  check_if(spec.router == RouterKind::kSoftmaxTopK, "router_bias", router_bias, {e});
  check_if(spec.router == RouterKind::kSqrtSoftplus, "router_selection_bias", router_selection_bias, {e});
  if (dense()) {
    for (const auto& [name, t] : {std::pair{"fc1_blocks", &fc1_blocks}, std::pair{"fc1_scales", &fc1_scales},
                                  std::pair{"fc2_blocks", &fc2_blocks}, std::pair{"fc2_scales", &fc2_scales}}) {
      if (t->data) throw Error(where + name + ": given with dense experts (gate_up, down); give one form");
    }
    check("gate_up", gate_up, Kind::kFloats, {{e, h, 2 * i}}, 16);
    check("down", down, Kind::kFloats, {{e, i, h}}, 16);
  } else {
    check("fc1_blocks", fc1_blocks, Kind::kCodes, {{e, 2 * i, h / kMxBlock, 16}, {e, 2 * i, h / 2}}, 16);
    check("fc1_scales", fc1_scales, Kind::kCodes, {{e, 2 * i, h / kMxBlock}});
    check("fc2_blocks", fc2_blocks, Kind::kCodes, {{e, h, i / kMxBlock, 16}, {e, h, i / 2}}, 16);
    check("fc2_scales", fc2_scales, Kind::kCodes, {{e, h, i / kMxBlock}});
  }
  check_if(spec.expert_biases, "fc1_bias", fc1_bias, {e, 2 * i});
  check_if(spec.expert_biases, "fc2_bias", fc2_bias, {e, h});
}

}  // namespace mxmoe
