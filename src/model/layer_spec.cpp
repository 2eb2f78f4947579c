#include "mxmoe/layer_spec.hpp"

#include <cmath>
#include <sstream>

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
  std::ostringstream s;
  s << "swiglu(alpha=" << activation.alpha << ", limit=" << activation.limit << ", up+" << activation.up_offset << ") "
    << (gate_up == GateUpLayout::kInterleaved ? "interleaved" : "[gate; up]") << (expert_biases ? " biases" : " no-bias");
  switch (router) {
    case RouterKind::kSoftmaxTopK: s << " softmax"; break;
    case RouterKind::kSqrtSoftplus: s << " sqrt-softplus*" << routed_scaling; break;
    case RouterKind::kCallerTopK: s << " caller-routed"; break;
  }
  return s.str();
}

}  // namespace mxmoe
