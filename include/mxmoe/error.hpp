// Errors are values with a message that names the bad thing: the file, the tensor, the shape that was
// expected and the one that was found. Everything mxmoe throws is an mxmoe::Error.
#pragma once

#include <stdexcept>
#include <string>

namespace mxmoe {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

}  // namespace mxmoe
