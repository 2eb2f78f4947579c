// Comparisons of computed outputs with float64 values, for tests and `mxmoe run --check`.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "mxmoe/error.hpp"
#include "mxmoe/reference.hpp"

namespace mxmoe {
namespace {

void check_same_size(const char* what, size_t a, size_t b) {
  if (a != b) throw Error(std::string(what) + ": sizes differ (" + std::to_string(a) + " vs " + std::to_string(b) + ")");
}

// bf16 keeps 8 significant bits: one ulp of y is 2^(exponent(y) - 7), subnormals sharing the
// smallest normal's ulp.
double bf16_ulp(double y) {
  const int exponent = y == 0.0 ? -126 : std::max(std::ilogb(y), -126);
  return std::ldexp(1.0, exponent - 7);
}

}  // namespace

double relative_error(std::span<const float> a, std::span<const double> b) {
  check_same_size("relative_error", a.size(), b.size());
  double diff = 0.0, norm = 0.0;
  for (size_t j = 0; j < a.size(); ++j) {
    diff += (a[j] - b[j]) * (a[j] - b[j]);
    norm += b[j] * b[j];
  }
  if (norm == 0.0 && diff == 0.0) return 0.0;
  if (norm == 0.0) return std::numeric_limits<double>::infinity();
  return std::sqrt(diff / norm);
}

Bf16RoundingCheck check_bf16_rounding(std::span<const Bf16> out, std::span<const double> expected, double abs_slack) {
  check_same_size("check_bf16_rounding", out.size(), expected.size());
  Bf16RoundingCheck check;
  for (size_t j = 0; j < out.size(); ++j) {
    const double bound = 0.5 * bf16_ulp(expected[j]) + abs_slack;
    const double error = std::fabs(static_cast<double>(bf16_to_float(out[j])) - expected[j]);
    const bool ok = error <= bound;  // false for NaN
    check.worst_ratio = std::max(check.worst_ratio, std::isnan(error) ? INFINITY : error / bound);
    if (!ok && check.failures++ == 0) check.first_failure = j;
  }
  return check;
}

}  // namespace mxmoe
