// mxmoe make-checkpoint: a synthetic MXFP4 checkpoint (gpt-oss or DeepSeek-V4 layers) in any naming scheme, for tests and
// for users without the real weights.
#include <cstdio>

#include "cli.hpp"
#include "commands.hpp"
#include "mxmoe/checkpoint.hpp"
#include "mxmoe/error.hpp"

namespace mxmoe::cli {
namespace {

constexpr OptionSpec kOptions[] = {
    kModelOption,
    kShapeOptions[0],
    kShapeOptions[1],
    kShapeOptions[2],
    kShapeOptions[3],
    {"layers", "N", "layers to write (default 2)"},
    {"out", "DIR", "output directory (created if missing)"},
    {"scheme", "NAMES",
     "tensor naming: openai (block.N.mlp.*) or hf (model.layers.N.mlp.*) for gpt-oss layers,\n"
     "deepseek (layers.N.ffn.*) or deepseek-hf (model.layers.N.mlp.*) for DeepSeek-V4 layers\n"
     "(default hf or deepseek-hf)"},
    {"shards", "S", "split the layers over S files with a model.safetensors.index.json (default 1)"},
    {"seed", "S", "seed of the weights (default 0); 'mxmoe run --seed S' without a checkpoint sees the same"},
};

constexpr CommandSpec kSpec{
    "make-checkpoint", "--out DIR [--model M] [--layers N] [--scheme NAMES] [--shards S] [--seed S]",
    "Writes a synthetic MXFP4 checkpoint of the model's layers: each layer's router, FC1 and FC2 tensors with the shapes and\n"
    "dtypes of the real checkpoints, plus a config.json. Use the shape overrides for small test checkpoints.",
    kOptions};

}  // namespace

int make_checkpoint_command(std::span<const std::string> args) {
  const auto parsed = parse(kSpec, args);
  if (!parsed) return 0;
  if (!parsed->has("out")) throw UsageError("make-checkpoint: --out DIR is required");
  MoeShape shape = shape_from_args(*parsed);
  shape.num_layers = static_cast<int>(parsed->get_int("layers", 2, 1, 1024));
  const int shards = static_cast<int>(parsed->get_int("shards", 1, 1, shape.num_layers));
  CheckpointScheme scheme;
  try {
    scheme = parse_scheme(parsed->get(
        "scheme", shape.spec.gate_up == GateUpLayout::kConcatenated ? "deepseek-hf" : "hf"));
  } catch (const Error& e) {
    throw UsageError(std::string("--scheme: ") + e.what());
  }
  const std::string dir = parsed->get("out", "");
  write_synthetic_checkpoint(dir, shape, scheme, shards, parsed->get_u64("seed", 0));
  std::printf("wrote %s: %d layer%s of %s, %s scheme, %d file%s, %.1f MB of expert weights per layer\n", dir.c_str(),
              shape.num_layers, shape.num_layers == 1 ? "" : "s", shape.describe().c_str(),
              std::string(scheme_name(scheme)).c_str(), shards, shards == 1 ? "" : "s", static_cast<double>(shape.expert_bytes()) * shape.num_experts / 1e6);
  return 0;
}

}  // namespace mxmoe::cli
