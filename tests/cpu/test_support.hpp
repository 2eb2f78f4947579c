// Helpers shared by the CPU test suites: scratch directories, raw safetensors bytes, the mxmoe
// command, and the catalogue of malformed checkpoints that the loader and the CLI must reject.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "mxmoe/moe_shape.hpp"

namespace mxmoe::test {

// A small shape with odd-ish sizes that keeps the tests fast.
inline MoeShape small_shape(int layers = 2) { return MoeShape{6, 2, 64, 96, layers}; }

// An empty directory unique to the running test (removed and recreated).
std::filesystem::path scratch_dir();

void write_file(const std::filesystem::path& path, const std::string& bytes);
std::string read_file(const std::filesystem::path& path);

// A safetensors file's bytes from a header text and a data section; `header_length` overrides the
// 8-byte length field.
std::string safetensors_bytes(const std::string& header, const std::string& data,
                              std::optional<uint64_t> header_length = std::nullopt);

struct CliResult {
  int exit_code = -1;
  std::string out, err;
};
CliResult run_cli(const std::string& args);

// A checkpoint damaged in one way, and the words its error must contain besides the path.
struct BadCheckpoint {
  std::string name;
  std::function<std::filesystem::path(const std::filesystem::path& dir)> make;  // returns --checkpoint's PATH
  std::vector<std::string> error_mentions;
};
std::vector<BadCheckpoint> bad_checkpoints();
inline void PrintTo(const BadCheckpoint& c, std::ostream* os) { *os << c.name; }

}  // namespace mxmoe::test
