#include "runner/block_scaled_check.hpp"

#include <cmath>
#include <cstdio>
#include <map>
#include <mutex>
#include <set>
#include <tuple>

#include "common/random.hpp"
#include "common/warnings.hpp"
#include "device/cuda_check.hpp"
#include "device/current_device.hpp"
#include "format/mxfp4_records.hpp"
#include "format/mxfp8_rows.hpp"
#include "kernels/block_scaled_family.hpp"
#include "kernels/family_registry.hpp"
#include "mxmoe/bf16.hpp"
#include "mxmoe/mx_format.hpp"
#include "runner/expert_modules.hpp"

namespace mxmoe {
namespace {

constexpr int kCheckK = 288;

// What a check is kept by: the device, the tactic, and the kernels' step (a fault build is another
// variant of the family).
using CheckKey = std::tuple<int, std::string, std::string>;

struct CheckState {
  std::mutex mutex;
  std::map<CheckKey, BlockScaledCheckResult> results;
  std::vector<CheckKey> order;
  std::set<std::pair<int, std::string>> dropped;  // (device, step)
};
CheckState& check_state() {
  static CheckState state;
  return state;
}

int current_device() {
  int device = 0;
  cuda_check(cudaGetDevice(&device), "cudaGetDevice");
  return device;
}

std::string describe_current_device() {
  cudaDeviceProp prop{};
  cuda_check(cudaGetDeviceProperties(&prop, current_device()), "cudaGetDeviceProperties");
  return std::string(prop.name) + " (" + std::string(current_device_arch().arch->name) + ")";
}

template <typename T>
DeviceBuffer to_device(const std::vector<T>& host, const char* what) {
  DeviceBuffer buffer(std::max<size_t>(1, host.size()) * sizeof(T), std::string("block-scaled check: ") + what);
  cuda_check(cudaMemcpy(buffer.get(), host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice),
             std::string("block-scaled check: copying ") + what);
  return buffer;
}

// The check's problem on the host: FC2 of one expert with `rows` rows, K = kCheckK, `tokens` tokens.
struct Problem {
  MoeShape shape;  // one expert, top-1: FC2 rows = hidden, K = intermediate
  int tokens;
  std::vector<uint8_t> records, mxfp8_rows;
  std::vector<float> bias;
  std::vector<Bf16> bf16_rows;  // the MXFP8 tokens' exact values
};

Problem make_problem(int rows, int tokens) {
  Problem p{MoeShape{1, 1, rows, kCheckK, 1}, tokens, {}, {}, {}, {}};
  SplitMix64 rng(0x6d786d6f65ull);
  const RecordGeometry g{1, rows, kCheckK};
  std::vector<uint8_t> blocks(static_cast<size_t>(rows) * kCheckK / 2), scales(static_cast<size_t>(rows) * kCheckK / kMxBlock);
  for (auto& b : blocks) b = static_cast<uint8_t>(rng.next());
  for (auto& s : scales) s = static_cast<uint8_t>(kE8m0Bias - 9 + static_cast<int>(rng.below(17)));
  p.records = pack_records(g, RowOrder::kIdentity, blocks, scales);
  p.bias.resize(rows);
  for (auto& b : p.bias) b = static_cast<float>(rng.normal());

  std::vector<float> x(static_cast<size_t>(tokens) * kCheckK);
  for (size_t block = 0; block < x.size() / kMxBlock; ++block) {
    const double magnitude = std::ldexp(1.0, static_cast<int>(rng.below(13)) - 6);
    for (int i = 0; i < kMxBlock; ++i) x[block * kMxBlock + i] = static_cast<float>(magnitude * rng.normal());
  }
  std::vector<uint8_t> codes(x.size()), token_scales(x.size() / kMxBlock);
  quantize_mxfp8(x, codes, token_scales);
  p.mxfp8_rows = pack_mxfp8_rows(codes, token_scales, tokens, kCheckK);
  dequantize_mxfp8(codes, token_scales, x);
  for (float v : x) p.bf16_rows.push_back(float_to_bf16(v));
  return p;
}

// FC2 of `t` on the problem (its input in the form the family takes): the fp32 outputs
// [tokens, rows].
std::vector<float> run_fc2(const Tactic& t, const Problem& p, cudaStream_t stream) {
  const KernelFamily& family = *t.family;
  const bool mxfp8 = family.activations() == ActivationFormat::kMxfp8;
  const int rows = p.shape.hidden, e = p.shape.num_experts;
  std::vector<int> offsets{0, p.tokens}, active{0, 1}, tile_offsets, sorted_pairs(p.tokens);
  for (int i = 0; i < kernels::kTileSizeCount; ++i) {
    tile_offsets.push_back(0);
    tile_offsets.push_back((p.tokens + kernels::tile_size(i) - 1) / kernels::tile_size(i));
  }
  for (int r = 0; r < p.tokens; ++r) sorted_pairs[r] = r;
  const int tile_index = kernels::tile_size_index(t.tile_tokens);

  const DeviceBuffer records = to_device(p.records, "records"), bias = to_device(p.bias, "bias");
  const DeviceBuffer input = mxfp8 ? to_device(p.mxfp8_rows, "MXFP8 rows") : to_device(p.bf16_rows, "bf16 rows");
  const DeviceBuffer d_offsets = to_device(offsets, "offsets"), d_active = to_device(active, "active experts");
  const DeviceBuffer d_tiles = to_device(tile_offsets, "tile offsets"), d_pairs = to_device(sorted_pairs, "pairs");
  const size_t outputs = static_cast<size_t>(p.tokens) * rows;
  DeviceBuffer out(outputs * 4, "block-scaled check: outputs");

  kernels::LayerArgs args{};
  args.fc2 = {.records = static_cast<const unsigned char*>(records.get()),
              .bias = static_cast<const float*>(bias.get()),
              .input = input.get(),
              .sorted_pairs = static_cast<const int*>(d_pairs.get()),
              .top_k = 1,
              .rows = rows,
              .k = kCheckK,
              .k_tiles = (kCheckK + 63) / 64,
              .staged_rows = 0,
              .num_experts = e,
              .expert_offsets = static_cast<const int*>(d_offsets.get()),
              .active_experts = static_cast<const int*>(d_active.get()),
              .tile_offsets = static_cast<const int*>(d_tiles.get()) + tile_index * (e + 1),
              .output = out.get(),
              .epilogue = {.fc2 = {.split_stride = static_cast<long long>(outputs), .output_bf16 = 0}},
              .routes_itself = 0,
              .num_tokens = p.tokens,
              .route = {},
              .stream_partials = nullptr,
              .stream_flags = nullptr};
  const StageShape stage{p.shape, Stage::kFc2};
  const void* kernel = expert_kernels(t).fc2;
  const ExpertLaunch launch{.stage = Stage::kFc2,
                            .tactic = t,
                            .kernel = kernel,
                            .geometry = family.geometry(t, stage, p.tokens, false, kernel),
                            .what = "block-scaled check: FC2 " + t.name() + " launch"};
  family.launch(launch, args, stream);
  cuda_check(cudaStreamSynchronize(stream), "block-scaled check: " + t.name());
  std::vector<float> host(outputs);
  cuda_check(cudaMemcpy(host.data(), out.get(), outputs * 4, cudaMemcpyDeviceToHost), "block-scaled check: results");
  return host;
}

BlockScaledCheckResult run_check(const Tactic& t) {
  const Tactic reference = block_scaled_check_reference();
  const Problem p = make_problem(t.tile_rows, t.tile_tokens - 3);
  cudaStream_t stream;
  cuda_check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "block-scaled check: cudaStreamCreate");
  std::vector<float> got, expected;
  try {
    got = run_fc2(t, p, stream);
    expected = run_fc2(reference, p, stream);
  } catch (...) {
    cudaStreamDestroy(stream);
    throw;
  }
  cudaStreamDestroy(stream);
  const BlockScaledVerdict verdict = judge_block_scaled_check(got, expected);
  return {describe_current_device(), t.binary().name(), reference.name(), verdict.rel_difference, verdict.passed};
}

}  // namespace

bool block_scaled_check_applies(BlockScaledCheck mode, const Arch& arch) {
  return mode == BlockScaledCheck::kAlways || arch.major == 12;
}

BlockScaledVerdict judge_block_scaled_check(std::span<const float> got, std::span<const float> expected) {
  BlockScaledVerdict v;
  if (got.size() != expected.size() || got.empty()) {
    v.rel_difference = INFINITY;
    return v;
  }
  double difference = 0.0, norm = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i])) {
      v.rel_difference = INFINITY;
      return v;
    }
    const double d = static_cast<double>(got[i]) - expected[i];
    difference += d * d;
    norm += static_cast<double>(expected[i]) * expected[i];
  }
  v.rel_difference = norm > 0.0 ? std::sqrt(difference / norm) : (difference > 0.0 ? INFINITY : 0.0);
  v.passed = v.rel_difference <= kBlockScaledCheckTolerance;
  return v;
}

Tactic block_scaled_check_reference() { return parse_tactic("mma.r128x32.w4x1.s4.k1"); }

BlockScaledCheckResult check_block_scaled_tactic(const Tactic& t) {
  const int device = current_device();
  const std::string step = block_scaled_step();
  const CheckKey key{device, t.binary().name(), step};
  CheckState& state = check_state();
  std::lock_guard lock(state.mutex);
  if (const auto it = state.results.find(key); it != state.results.end()) return it->second;
  const BlockScaledCheckResult result = run_check(t.binary());
  state.results.emplace(key, result);
  state.order.push_back(key);
  if (!result.passed) {
    state.dropped.insert({device, step});
    char figures[64];
    std::snprintf(figures, sizeof(figures), "relative difference %.3g over one FC2 tile, bound %.0e",
                  result.rel_difference, kBlockScaledCheckTolerance);
    warn_once("the block-scaled tactic " + result.tactic + " disagrees with " + result.reference + " on " +
              result.device + " (" + figures +
              "): MXFP8-activation plans fall back to bf16 activations on this device; please report it "
              "(docs/block-scaled.md)");
  }
  return result;
}

bool block_scaled_family_dropped() {
  CheckState& state = check_state();
  std::lock_guard lock(state.mutex);
  return state.dropped.count({current_device(), block_scaled_step()}) != 0;
}

std::vector<BlockScaledCheckResult> block_scaled_checks_on_device() {
  const CheckKey device_and_step{current_device(), "", block_scaled_step()};
  CheckState& state = check_state();
  std::lock_guard lock(state.mutex);
  std::vector<BlockScaledCheckResult> results;
  for (const CheckKey& key : state.order) {
    if (std::get<0>(key) == std::get<0>(device_and_step) && std::get<2>(key) == std::get<2>(device_and_step)) {
      results.push_back(state.results.at(key));
    }
  }
  return results;
}

}  // namespace mxmoe
