// The experts' activation on one (gate, up) pair, for float and double evaluations alike
// (layer_spec.hpp): gate = min(gate, limit), up = clamp(up, -limit, limit),
// out = gate * sigmoid(alpha * gate) * (up + up_offset).
#pragma once

#include <algorithm>
#include <cmath>

#include "mxmoe/moe_shape.hpp"

namespace mxmoe {

template <typename T>
T swiglu(const SwigluActivation& activation, T gate, T up) {
  const T limit = static_cast<T>(activation.limit);
  gate = std::min(gate, limit);
  up = std::clamp(up, -limit, limit);
  return gate / (T(1) + std::exp(-static_cast<T>(activation.alpha) * gate)) * (up + static_cast<T>(activation.up_offset));
}

template <typename T>
T gpt_oss_swiglu(T glu, T lin) {
  return swiglu(kGptOssSpec.activation, glu, lin);
}

}  // namespace mxmoe
