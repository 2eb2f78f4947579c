// Whole-file writes that readers never see half done: the bytes go to a temporary file in the
// target's directory, which is flushed and then renamed over the target. On any failure the
// temporary file is removed and an Error names the path and the system's reason.
#pragma once

#include <cstdint>
#include <span>
#include <string>

namespace mxmoe {

void write_file_atomically(const std::string& path, std::span<const std::span<const uint8_t>> pieces);

}  // namespace mxmoe
