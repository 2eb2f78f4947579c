// The gpt-oss activation on one (glu, linear) pair, for float and double evaluations alike:
// glu = min(glu, 7), lin = clamp(lin, -7, 7), out = glu * sigmoid(1.702 * glu) * (lin + 1).
#pragma once

#include <algorithm>
#include <cmath>

#include "mxmoe/moe_shape.hpp"

namespace mxmoe {

template <typename T>
T gpt_oss_swiglu(T glu, T lin) {
  const T limit = static_cast<T>(kSwigluLimit);
  glu = std::min(glu, limit);
  lin = std::clamp(lin, -limit, limit);
  return glu / (T(1) + std::exp(-static_cast<T>(kSwigluAlpha) * glu)) * (lin + T(1));
}

}  // namespace mxmoe
