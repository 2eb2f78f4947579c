// Whole-model loading on the GPU: the staged upload moves every byte from a file and from memory,
// through many more pieces than it has buffers, in copies that start and end mid-piece; load_model
// of a sharded checkpoint gives, layer by layer, runners whose forward is bit for bit that of a
// runner built from the layer's weights read through the mapping (no file reads) and from the
// synthetic weights the checkpoint was written from; a layer of many staging pieces (gpt-oss-20b's)
// reads from the file as it reads through memory. The timing test prints a gpt-oss-120b layer's load
// from a warm checkpoint by pread and through a fresh mapping, and the process's resident memory
// after each, and holds the default (pread) to the 0.35 s target.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <filesystem>
#include <string>
#include <vector>

#include "common/random.hpp"
#include "gpu_test_support.hpp"
#include "load/staged_upload.hpp"
#include "mxmoe/error.hpp"
#include "mxmoe/model_loader.hpp"

namespace mxmoe {
namespace {

using namespace test;  // NOLINT: the shared GPU test helpers
namespace fs = std::filesystem;

fs::path fresh_dir(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("mxmoe_" + name + "_" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

void expect_same_outputs(const MoeRunner& got, const MoeRunner& expected, const std::string& what) {
  const MoeShape& s = expected.shape();
  EXPECT_EQ(got.device_bytes(), expected.device_bytes()) << what;
  for (int tokens : {1, 9, 200}) {
    const std::vector<Bf16> x = make_activations(tokens, s.hidden, 500 + tokens);
    const std::vector<float> logits = random_logits(tokens, s.num_experts, 600 + tokens);
    for (const std::vector<float>* given : {static_cast<const std::vector<float>*>(nullptr), &logits}) {
      const GpuResult a = run_gpu(got, x, tokens, given, nullptr);
      const GpuResult b = run_gpu(expected, x, tokens, given, nullptr);
      EXPECT_TRUE(std::equal(a.out.begin(), a.out.end(), b.out.begin(), b.out.end(),
                             [](Bf16 p, Bf16 q) { return p.bits == q.bits; }))
          << what << " T=" << tokens << (given ? " given logits" : " router");
    }
  }
}

// The layer's weights with the file reads turned off: the load copies through the mapping.
MoeLayerWeights through_the_mapping(MoeLayerWeights w) {
  w.mapped_files.clear();
  return w;
}

TEST(GpuStagedUpload, EveryByteArrivesFromAFileAndFromMemory) {
  MXMOE_REQUIRE_GPU();
  const fs::path dir = fresh_dir("staged_upload");
  std::vector<uint8_t> bytes(3'000'017);
  SplitMix64 rng(4);
  for (auto& b : bytes) b = static_cast<uint8_t>(rng.next());
  {
    FILE* f = std::fopen((dir / "bytes").c_str(), "wb");
    ASSERT_NE(f, nullptr);
    ASSERT_EQ(std::fwrite(bytes.data(), 1, bytes.size(), f), bytes.size());
    std::fclose(f);
  }
  const int fd = ::open((dir / "bytes").c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  cudaStream_t stream = nullptr;
  MXMOE_CUDA_OK(cudaStreamCreate(&stream));
  {
    DeviceArray<uint8_t> from_file(bytes.size()), from_memory(bytes.size());
    from_file.fill_bytes(0);
    from_memory.fill_bytes(0);
    StagedUpload upload(stream, bytes.size(), 4099);  // ~730 pieces over 16 buffers
    // Three copies each, splitting the bytes off a piece boundary.
    for (const auto& [begin, end] : {std::pair<size_t, size_t>{0, 1'000'003}, {1'000'003, 1'000'010},
                                    {1'000'010, bytes.size()}}) {
      upload.copy(from_file.get() + begin, HostSource{nullptr, fd, begin}, end - begin, "file bytes");
      upload.copy(from_memory.get() + begin, HostSource{bytes.data() + begin}, end - begin, "memory bytes");
    }
    MXMOE_CUDA_OK(cudaStreamSynchronize(stream));
    EXPECT_TRUE(from_file.to_host() == bytes);
    EXPECT_TRUE(from_memory.to_host() == bytes);
    EXPECT_THROW(upload.copy(from_file.get(), HostSource{nullptr, fd, bytes.size() - 10}, 20, "past the end"), Error);
  }
  MXMOE_CUDA_OK(cudaStreamDestroy(stream));
  ::close(fd);
  fs::remove_all(dir);
}

TEST(GpuModelLoad, EveryLayerForwardsAsARunnerOfItsWeights) {
  MXMOE_REQUIRE_GPU();
  const fs::path dir = fresh_dir("model_load");
  const MoeShape shape{5, 3, 96, 160, 3};
  constexpr uint64_t kSeed = 21;
  write_synthetic_checkpoint(dir.string(), shape, CheckpointScheme::kOpenAi, 2, kSeed);
  const Checkpoint checkpoint = Checkpoint::open(dir.string());

  ModelLoadOptions options;
  std::vector<int> progress_layers;
  options.progress = [&](const LayerLoadProgress& p) { progress_layers.push_back(p.layer); };
  const std::vector<MoeRunner> all = load_model(checkpoint, options);
  ASSERT_EQ(all.size(), 3u);
  EXPECT_EQ(progress_layers, (std::vector<int>{0, 1, 2}));
  for (int layer = 0; layer < 3; ++layer) {
    const LoadedLayer loaded = load_gpt_oss_layer(checkpoint, layer);
    ASSERT_FALSE(loaded.weights.mapped_files.empty());
    const std::string what = "layer " + std::to_string(layer);
    expect_same_outputs(all[layer], MoeRunner(through_the_mapping(loaded.weights)), what + " vs the mapping");
    expect_same_outputs(all[layer], MoeRunner(make_synthetic_layer(shape, layer_seed(kSeed, layer))),
                        what + " vs the synthetic weights");
  }

  options.layers = {2, 0};
  const std::vector<MoeRunner> some = load_model(checkpoint, options);
  ASSERT_EQ(some.size(), 2u);
  expect_same_outputs(some[0], all[2], "layers {2, 0}: layer 2");
  expect_same_outputs(some[1], all[0], "layers {2, 0}: layer 0");
  fs::remove_all(dir);
}

TEST(GpuModelLoad, ALayerOfManyStagingPiecesReadsFromTheFileAsThroughMemory) {
  MXMOE_REQUIRE_GPU();
  const fs::path dir = fresh_dir("model_load_20b");
  MoeShape shape = model_shape("gpt-oss-20b");
  shape.num_layers = 1;
  write_synthetic_checkpoint(dir.string(), shape, CheckpointScheme::kHuggingFace, 1, 3);
  const Checkpoint checkpoint = Checkpoint::open(dir.string());
  const LoadedLayer loaded = load_gpt_oss_layer(checkpoint, 0);
  expect_same_outputs(MoeRunner(loaded.weights), MoeRunner(through_the_mapping(loaded.weights)), "gpt-oss-20b");
  fs::remove_all(dir);
}

// Resident memory of this process now, in GB (/proc/self/statm: pages).
double resident_gb() {
  std::ifstream statm("/proc/self/statm");
  size_t total = 0, resident = 0;
  statm >> total >> resident;
  return static_cast<double>(resident) * static_cast<double>(sysconf(_SC_PAGESIZE)) / 1e9;
}

TEST(GpuModelLoadTiming, A120bLayerFromAWarmCheckpointByPreadAndThroughTheMapping) {
  MXMOE_REQUIRE_GPU();
  const fs::path dir = fresh_dir("model_load_120b");
  MoeShape shape = model_shape("gpt-oss-120b");
  shape.num_layers = 1;
  write_synthetic_checkpoint(dir.string(), shape, CheckpointScheme::kOpenAi, 1, 8);  // leaves it in the page cache
  const MoeRunner warm_up(make_synthetic_layer(MoeShape{5, 3, 96, 160, 1}, 1));     // context, modules
  const double gb = static_cast<double>(fs::file_size(dir / "model.safetensors")) / 1e9;
  double best_pread = 1e9, best_mapping = 1e9;
  for (int rep = 0; rep < 3; ++rep) {
    for (const bool by_pread : {true, false}) {
      // A fresh mapping each time: a mapping already touched takes no faults.
      const auto start = std::chrono::steady_clock::now();
      const Checkpoint checkpoint = Checkpoint::open(dir.string());
      const LoadedLayer loaded = load_gpt_oss_layer(checkpoint, 0);
      const MoeRunner runner(by_pread ? loaded.weights : through_the_mapping(loaded.weights));
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      std::printf("gpt-oss-120b layer (%.2f GB) %s: %.3f s, %.2f GB/s; resident %.2f GB\n", gb,
                  by_pread ? "by pread" : "through the mapping", s, gb / s, resident_gb());
      (by_pread ? best_pread : best_mapping) = std::min(by_pread ? best_pread : best_mapping, s);
    }
  }
  EXPECT_LT(best_pread, 0.35) << "the 5 GB/s target (issue 44); through the mapping: " << best_mapping << " s";
  fs::remove_all(dir);
}

}  // namespace
}  // namespace mxmoe
