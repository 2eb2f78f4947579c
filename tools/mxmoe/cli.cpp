#include "cli.hpp"

#include <charconv>
#include <iostream>

#include "mxmoe/error.hpp"

namespace mxmoe::cli {
namespace {

const OptionSpec* find_option(const CommandSpec& spec, std::string_view name) {
  for (const auto& o : spec.options) {
    if (o.name == name) return &o;
  }
  return nullptr;
}

template <typename T>
T parse_number(std::string_view option, std::string_view text) {
  T value{};
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size()) {
    throw UsageError("--" + std::string(option) + ": expected an integer, got '" + std::string(text) + "'");
  }
  return value;
}

}  // namespace

std::string ParsedArgs::get(std::string_view name, std::string_view fallback) const {
  const auto it = values_.find(std::string(name));
  return it == values_.end() ? std::string(fallback) : it->second;
}

int64_t ParsedArgs::get_int(std::string_view name, int64_t fallback, int64_t min, int64_t max) const {
  if (!has(name)) return fallback;
  const int64_t v = parse_number<int64_t>(name, get(name, ""));
  if (v < min || v > max) {
    throw UsageError("--" + std::string(name) + ": " + std::to_string(v) + " is not in [" + std::to_string(min) +
                     ", " + std::to_string(max) + "]");
  }
  return v;
}

uint64_t ParsedArgs::get_u64(std::string_view name, uint64_t fallback) const {
  return has(name) ? parse_number<uint64_t>(name, get(name, "")) : fallback;
}

std::vector<int64_t> ParsedArgs::get_int_list(std::string_view name, std::vector<int64_t> fallback, int64_t min,
                                              int64_t max) const {
  if (!has(name)) return fallback;
  const std::string text = get(name, "");
  std::vector<int64_t> out;
  for (size_t begin = 0; begin <= text.size();) {
    const size_t end = std::min(text.find(',', begin), text.size());
    const int64_t v = parse_number<int64_t>(name, std::string_view(text).substr(begin, end - begin));
    if (v < min || v > max) {
      throw UsageError("--" + std::string(name) + ": " + std::to_string(v) + " is not in [" + std::to_string(min) +
                       ", " + std::to_string(max) + "]");
    }
    out.push_back(v);
    begin = end + 1;
  }
  return out;
}

std::optional<ParsedArgs> parse(const CommandSpec& spec, std::span<const std::string> args) {
  ParsedArgs parsed;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--help" || arg == "-h") {
      std::cout << usage(spec);
      return std::nullopt;
    }
    if (arg.rfind("--", 0) != 0) throw UsageError(std::string(spec.name) + ": unexpected argument '" + arg + "'");
    const size_t eq = arg.find('=');
    const std::string name = arg.substr(2, eq == std::string::npos ? std::string::npos : eq - 2);
    const OptionSpec* option = find_option(spec, name);
    if (!option) throw UsageError(std::string(spec.name) + ": unknown option '--" + name + "'");
    std::string value;
    if (option->value_name.empty()) {
      if (eq != std::string::npos) throw UsageError("--" + name + " takes no value");
    } else if (eq != std::string::npos) {
      value = arg.substr(eq + 1);
    } else if (i + 1 < args.size()) {
      value = args[++i];
    } else {
      throw UsageError("--" + name + " needs a value (" + std::string(option->value_name) + ")");
    }
    parsed.values_[name] = value;
  }
  return parsed;
}

std::string usage(const CommandSpec& spec) {
  constexpr size_t kHelpColumn = 28;
  std::string text = "usage: mxmoe " + std::string(spec.name) + " " + std::string(spec.synopsis) + "\n\n" +
                     std::string(spec.summary) + "\n\noptions:\n";
  for (const auto& o : spec.options) {
    std::string left = "  --";
    left.append(o.name);
    if (!o.value_name.empty()) left.append(" ").append(o.value_name);
    left.resize(std::max<size_t>(left.size() + 2, kHelpColumn), ' ');
    text += left;
    // A help text's later lines start under its first.
    for (const char c : o.help) text += c == '\n' ? "\n" + std::string(kHelpColumn, ' ') : std::string(1, c);
    text += "\n";
  }
  return text + "  --help                    show this help\n";
}

bool has_shape_override(const ParsedArgs& args) {
  for (const auto& o : kShapeOptions) {
    if (args.has(o.name)) return true;
  }
  return false;
}

std::vector<std::string> model_list(const std::string& arg) {
  std::vector<std::string> models;
  if (arg == "all") {
    for (const auto& p : model_presets()) models.emplace_back(p.name);
    return models;
  }
  size_t start = 0;
  for (;;) {
    const size_t comma = arg.find(',', start);
    models.push_back(arg.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    try {
      model_shape(models.back());
    } catch (const Error& e) {
      throw UsageError(std::string("--model: ") + e.what());
    }
    if (comma == std::string::npos) return models;
    start = comma + 1;
  }
}

MoeShape shape_from_args(const ParsedArgs& args) {
  MoeShape shape;
  try {
    shape = model_shape(args.get("model", "gpt-oss-20b"));
  } catch (const Error& e) {
    throw UsageError(std::string("--model: ") + e.what());
  }
  constexpr int64_t kMax = 1 << 20;
  shape.num_experts = static_cast<int>(args.get_int("experts", shape.num_experts, 1, kMax));
  shape.top_k = static_cast<int>(args.get_int("top-k", shape.top_k, 1, kMax));
  shape.hidden = static_cast<int>(args.get_int("hidden", shape.hidden, 1, kMax));
  shape.intermediate = static_cast<int>(args.get_int("intermediate", shape.intermediate, 1, kMax));
  try {
    shape.validate();
  } catch (const Error& e) {
    throw UsageError(e.what());
  }
  return shape;
}

ActivationFormat gpu_activations(const ParsedArgs& args) {
  ActivationFormat format;
  try {
    format = parse_activation_format(args.get("activations", "bf16"));
  } catch (const Error& e) {
    throw UsageError(std::string("--activations: ") + e.what());
  }
  return format;
}

}  // namespace mxmoe::cli
