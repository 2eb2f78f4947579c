// Text taken from a file (tensor names, dtype strings, JSON values, parser messages) as it may be
// quoted in an error message: printable ASCII kept, every other byte written as \xNN, so that a
// crafted file cannot put terminal control sequences on a user's screen.
#pragma once

#include <string>
#include <string_view>

namespace mxmoe {

inline std::string printable(std::string_view text) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte >= 0x20 && byte < 0x7f && byte != '\\') {
      out += c;
    } else {
      out += "\\x";
      out += kHex[byte >> 4];
      out += kHex[byte & 15];
    }
  }
  return out;
}

}  // namespace mxmoe
