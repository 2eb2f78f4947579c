#include "jit/aot.hpp"

#include <cstring>

#include "jit/aot_index.hpp"
#include "mxmoe/error.hpp"

namespace mxmoe {

std::optional<KernelBinary> find_ahead_of_time(const std::string& key) {
  for (const AotIndexEntry* e = kAotIndex; e->key; ++e) {
    if (key != e->key) continue;
    std::string problem;
    auto binary = parse_entry({mxmoe_aot_blob + e->offset, e->bytes}, key, &problem);
    if (!binary) throw Error("the library's ahead-of-time kernel " + key + " is damaged: " + problem);
    return binary;
  }
  return std::nullopt;
}

size_t ahead_of_time_entries() {
  size_t n = 0;
  for (const AotIndexEntry* e = kAotIndex; e->key; ++e) ++n;
  return n;
}

}  // namespace mxmoe
