#include "common/warnings.hpp"

#include <cstdio>
#include <mutex>
#include <set>

namespace mxmoe {

void warn_once(const std::string& message) {
  static std::mutex mutex;
  static std::set<std::string> said;
  std::lock_guard lock(mutex);
  if (said.insert(message).second) std::fprintf(stderr, "mxmoe: warning: %s\n", message.c_str());
}

}  // namespace mxmoe
