// A 128-bit content hash for cache keys and entry checksums: two 64-bit FNV-1a streams with
// different offsets, each finished with the SplitMix64 avalanche. Not cryptographic; collisions
// between distinct kernels are what it must make negligible.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

namespace mxmoe {

class Hash128 {
 public:
  Hash128& add(std::string_view bytes) {
    for (unsigned char c : bytes) {
      a_ = (a_ ^ c) * 0x100000001b3ull;
      b_ = (b_ ^ c) * 0x100000001b3ull;
    }
    // Length-delimited, so that ("ab", "c") and ("a", "bc") differ.
    const uint64_t n = bytes.size();
    a_ = (a_ ^ n) * 0x100000001b3ull;
    b_ = (b_ ^ (n + 1)) * 0x100000001b3ull;
    return *this;
  }
  Hash128& add(const void* data, size_t size) { return add(std::string_view(static_cast<const char*>(data), size)); }

  std::string hex() const {
    char text[33];
    std::snprintf(text, sizeof(text), "%016llx%016llx", static_cast<unsigned long long>(mix(a_)),
                  static_cast<unsigned long long>(mix(b_)));
    return text;
  }

 private:
  static uint64_t mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  uint64_t a_ = 0xcbf29ce484222325ull;
  uint64_t b_ = 0x84222325cbf29ce4ull;
};

}  // namespace mxmoe
