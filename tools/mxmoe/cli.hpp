// Command-line plumbing shared by the subcommands: option specs, parsing, usage text, and the
// model-shape options several subcommands take.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "mxmoe/moe_shape.hpp"
#include "mxmoe/mx_format.hpp"

namespace mxmoe::cli {

// Bad command-line input: reported like any error, but exits 2.
class UsageError : public std::runtime_error {
 public:
  explicit UsageError(const std::string& message) : std::runtime_error(message) {}
};

struct OptionSpec {
  std::string_view name;        // without the leading "--"
  std::string_view value_name;  // empty for a flag
  std::string_view help;
};

struct CommandSpec {
  std::string_view name;
  std::string_view synopsis;
  std::string_view summary;
  std::span<const OptionSpec> options;
};

class ParsedArgs {
 public:
  bool has(std::string_view name) const { return values_.count(std::string(name)) != 0; }
  bool flag(std::string_view name) const { return has(name); }
  std::string get(std::string_view name, std::string_view fallback) const;
  int64_t get_int(std::string_view name, int64_t fallback, int64_t min, int64_t max) const;
  uint64_t get_u64(std::string_view name, uint64_t fallback) const;
  std::vector<int64_t> get_int_list(std::string_view name, std::vector<int64_t> fallback, int64_t min, int64_t max) const;

 private:
  friend std::optional<ParsedArgs> parse(const CommandSpec&, std::span<const std::string>);
  std::map<std::string, std::string> values_;
};

// nullopt when --help was given (the usage went to stdout); UsageError for anything malformed.
std::optional<ParsedArgs> parse(const CommandSpec& spec, std::span<const std::string> args);
std::string usage(const CommandSpec& spec);

// --model NAME (default gpt-oss-20b) with --experts/--top-k/--hidden/--intermediate/--layers
// overrides; UsageError when the result is not a valid shape.
inline constexpr OptionSpec kModelOption{"model", "NAME", "model shape: gpt-oss-20b (default), gpt-oss-120b,\n"
                                                  "deepseek-v4-flash or deepseek-v4-pro"};
inline constexpr OptionSpec kShapeOptions[] = {
    {"experts", "E", "override the number of experts"},
    {"top-k", "K", "override the experts per token"},
    {"hidden", "H", "override the hidden size (a multiple of 32)"},
    {"intermediate", "I", "override the expert intermediate size (a multiple of 32)"},
};
MoeShape shape_from_args(const ParsedArgs& args);
bool has_shape_override(const ParsedArgs& args);

// bench's and tune's --model: "all" (every preset, in model_presets() order) or presets by name,
// comma-separated; UsageError naming one that is not a preset.
std::vector<std::string> model_list(const std::string& arg);
// --activations (default bf16) of a command that runs the GPU kernels: bf16, mxfp8 or fp8;
// UsageError naming anything else.
ActivationFormat gpu_activations(const ParsedArgs& args);

}  // namespace mxmoe::cli
