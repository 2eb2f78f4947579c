#include "mxmoe/layer_spec.hpp"

#include <charconv>
#include <cmath>

#include "mxmoe/error.hpp"

namespace mxmoe {

void LayerSpec::validate() const {
  auto fail = [&](const std::string& what) { throw Error("layer spec " + describe() + ": " + what); };
  if (!std::isfinite(activation.alpha) || activation.alpha <= 0.0f) fail("alpha must be finite and positive");
  if (std::isnan(activation.limit) || activation.limit <= 0.0f) fail("limit must be positive");
  if (!std::isfinite(activation.up_offset)) fail("up_offset must be finite");
  if (gate_up != GateUpLayout::kInterleaved && gate_up != GateUpLayout::kConcatenated) fail("unknown gate/up layout");
  if (router != RouterKind::kSoftmaxTopK && router != RouterKind::kSqrtSoftplus && router != RouterKind::kCallerTopK) {
    fail("unknown router");
  }
  if (!std::isfinite(routed_scaling) || routed_scaling <= 0.0f) fail("routed_scaling must be finite and positive");
  if (router != RouterKind::kSqrtSoftplus && routed_scaling != 1.0f) {
    fail("routed_scaling applies to the sqrt-softplus router only and must be 1 otherwise");
  }
}

std::string LayerSpec::describe() const {
  // std::to_chars, not a stream: no locale (a stream's float output crashed the Python extension on the
  // device image, in the facets of the process's libstdc++), and the shortest text that reads back.
  auto number = [](float v) {
    char text[32];
    return std::string(text, std::to_chars(text, text + sizeof(text), v).ptr);
  };
  std::string s = "swiglu(alpha=" + number(activation.alpha) + ", limit=" + number(activation.limit) + ", up+" +
                  number(activation.up_offset) + ") " +
                  (gate_up == GateUpLayout::kInterleaved ? "interleaved" : "[gate; up]") +
                  (expert_biases ? " biases" : " no-bias");
  switch (router) {
    case RouterKind::kSoftmaxTopK: s += " softmax"; break;
    case RouterKind::kSqrtSoftplus: s += " sqrt-softplus*" + number(routed_scaling); break;
    case RouterKind::kCallerTopK: s += " caller-routed"; break;
  }
  return s;
}

}  // namespace mxmoe
