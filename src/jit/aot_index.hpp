// The index the AOT generator writes (aot_index.cpp) over the blob it embeds (aot_blob.S).
#pragma once

#include <cstddef>

namespace mxmoe {

struct AotIndexEntry {
  const char* key;  // nullptr ends the table
  size_t offset;
  size_t bytes;
};

extern const AotIndexEntry kAotIndex[];

}  // namespace mxmoe

extern "C" const unsigned char mxmoe_aot_blob[];
