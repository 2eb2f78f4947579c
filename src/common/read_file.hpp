// A whole file's bytes, read with the system's calls rather than a stream: the library also runs
// inside other programs' processes (the Python extension beside PyTorch and its libraries), where
// the process's C++ stream and locale machinery was seen to crash (LayerSpec::describe's float
// output, on the device image).
#pragma once

#include <optional>
#include <string>

namespace mxmoe {

// The file's bytes, or nothing where it cannot be opened or read.
std::optional<std::string> read_file(const std::string& path);

}  // namespace mxmoe
