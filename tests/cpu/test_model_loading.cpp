// The host side of loading a model: file ranges read with pread are the bytes the mapping shows
// (in pieces, by threads at once, across shards), a read past a file's end is one Error line, the layer
// sequence hands layers to its sink in order with one progress report per layer and the right byte
// counts, the streamed safetensors writer holds its layout, and `mxmoe load` refuses bad input.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <numeric>
#include <regex>

#include "common/parallel.hpp"
#include "io/file_ranges.hpp"
#include "mxmoe/device.hpp"
#include "mxmoe/error.hpp"
#include "mxmoe/model_loader.hpp"
#include "mxmoe/safetensors.hpp"
#include "test_support.hpp"

namespace mxmoe {
namespace {

namespace fs = std::filesystem;

// The mapped file a view lies in, or nullptr.
const MoeLayerWeights::MappedFile* file_of(const MoeLayerWeights& w, std::span<const uint8_t> view) {
  for (const auto& f : w.mapped_files) {
    if (view.data() >= f.base && view.data() + view.size() <= f.base + f.bytes) return &f;
  }
  return nullptr;
}

// The checkpoint bytes of one layer's eight MoE tensors.
uint64_t layer_bytes(const MoeShape& s) {
  const uint64_t e = s.num_experts, h = s.hidden, i = s.intermediate, rows1 = s.fc1_rows();
  return 2 * e * h + 2 * e + e * rows1 * h / 2 + e * rows1 * h / 32 + 2 * e * rows1 + e * h * i / 2 + e * h * i / 32 +
         2 * e * h;
}

TEST(FileRanges, PreadInPiecesOfEveryExpertTensorEqualsTheMappedBytes) {
  const fs::path dir = test::scratch_dir();
  const MoeShape shape = test::small_shape(3);
  write_synthetic_checkpoint(dir.string(), shape, CheckpointScheme::kHuggingFace, 3, 5);
  const Checkpoint checkpoint = Checkpoint::open(dir.string());
  std::vector<int> fds;
  for (int layer = 0; layer < 3; ++layer) {
    const LoadedLayer loaded = load_gpt_oss_layer(checkpoint, layer);
    const MoeLayerWeights& w = loaded.weights;
    for (const auto view : {w.fc1_blocks, w.fc1_scales, w.fc2_blocks, w.fc2_scales}) {
      const auto* file = file_of(w, view);
      ASSERT_NE(file, nullptr) << "layer " << layer;
      fds.push_back(file->fd);
      // In pieces of several sizes, read by threads at once, as the staged upload reads them.
      for (size_t piece_bytes : {size_t{7}, size_t{1000}, size_t{4} << 20}) {
        std::vector<uint8_t> read(view.size(), 0xEE);
        const size_t pieces = (view.size() + piece_bytes - 1) / piece_bytes;
        parallel_for(pieces, 3, [&](size_t k) {
          const size_t begin = k * piece_bytes, bytes = std::min(piece_bytes, view.size() - begin);
          read_file_range(file->fd, static_cast<uint64_t>(view.data() - file->base) + begin,
                          std::span(read).subspan(begin, bytes), "test");
        });
        EXPECT_TRUE(std::equal(read.begin(), read.end(), view.begin(), view.end()))
            << "layer " << layer << ", pieces of " << piece_bytes;
      }
    }
  }
  std::sort(fds.begin(), fds.end());
  EXPECT_EQ(std::unique(fds.begin(), fds.end()) - fds.begin(), 3) << "three shards, three files";
}

TEST(FileRanges, AReadPastTheEndIsOneErrorLine) {
  const fs::path dir = test::scratch_dir();
  test::write_file(dir / "ten", "0123456789");
  const int fd = ::open((dir / "ten").c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  std::vector<uint8_t> out(8);
  read_file_range(fd, 2, out, "tensor 'x'");
  EXPECT_EQ(std::string(out.begin(), out.end()), "23456789");
  try {
    read_file_range(fd, 4, out, "tensor 'x'");
    ADD_FAILURE() << "read past the end";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("tensor 'x'"), std::string::npos) << message;
    EXPECT_NE(message.find("ends at byte 10"), std::string::npos) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  }
  prefetch_file_range(fd, 0, 10);  // best effort: nothing to see but that it returns
  ::close(fd);
}

TEST(LayerSequence, CountsTheLayersOfEitherScheme) {
  for (const auto scheme : {CheckpointScheme::kOpenAi, CheckpointScheme::kHuggingFace}) {
    const fs::path dir = test::scratch_dir();
    write_synthetic_checkpoint(dir.string(), test::small_shape(3), scheme, 2, 1);
    EXPECT_EQ(count_moe_layers(Checkpoint::open(dir.string())), 3) << scheme_name(scheme);
  }
}

TEST(LayerSequence, HandsLayersOverInOrderWithOneProgressReportEach) {
  const fs::path dir = test::scratch_dir();
  const MoeShape shape = test::small_shape(4);
  write_synthetic_checkpoint(dir.string(), shape, CheckpointScheme::kOpenAi, 2, 7);
  const Checkpoint checkpoint = Checkpoint::open(dir.string());
  const std::vector<int> layers{3, 0, 2};
  std::vector<int> sunk;
  std::vector<LayerLoadProgress> reports;
  for_each_moe_layer(
      checkpoint, layers, {},
      [&](int layer, const LoadedLayer& loaded) {
        EXPECT_EQ(reports.size(), sunk.size()) << "progress comes after the sink, once";
        sunk.push_back(layer);
        const MoeLayerWeights expected = make_synthetic_layer(shape, layer_seed(7, layer));
        EXPECT_TRUE(std::equal(loaded.weights.fc2_blocks.begin(), loaded.weights.fc2_blocks.end(),
                               expected.fc2_blocks.begin(), expected.fc2_blocks.end()))
            << "layer " << layer;
      },
      [&](const LayerLoadProgress& p) { reports.push_back(p); });
  EXPECT_EQ(sunk, layers);
  ASSERT_EQ(reports.size(), layers.size());
  for (size_t i = 0; i < reports.size(); ++i) {
    EXPECT_EQ(reports[i].layer, layers[i]);
    EXPECT_EQ(reports[i].layers_done, static_cast<int>(i + 1));
    EXPECT_EQ(reports[i].layers_total, 3);
    EXPECT_EQ(reports[i].layer_bytes, layer_bytes(shape));
    EXPECT_EQ(reports[i].bytes_done, (i + 1) * layer_bytes(shape));
    EXPECT_GE(reports[i].layer_seconds, 0);
    EXPECT_GE(reports[i].seconds_done, reports[i].layer_seconds);
  }
}

TEST(LayerSequence, AMissingLayerStopsTheSequenceWithItsError) {
  const fs::path dir = test::scratch_dir();
  write_synthetic_checkpoint(dir.string(), test::small_shape(2), CheckpointScheme::kHuggingFace, 1, 1);
  const Checkpoint checkpoint = Checkpoint::open(dir.string());
  std::vector<int> sunk;
  const std::vector<int> layers{0, 5, 1};
  try {
    for_each_moe_layer(checkpoint, layers, {}, [&](int layer, const LoadedLayer&) { sunk.push_back(layer); });
    ADD_FAILURE() << "layer 5 does not exist";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no MoE tensors for layer 5"), std::string::npos) << e.what();
  }
  EXPECT_EQ(sunk, std::vector<int>{0});
}

TEST(SafetensorsWriter, HoldsItsLayoutAndLeavesNoFileUnfinished) {
  const fs::path dir = test::scratch_dir();
  const std::vector<TensorToWrite> layout{{"a", Dtype::kU8, {3}, {}}, {"b", Dtype::kBF16, {2}, {}}};
  const uint8_t a[3] = {1, 2, 3}, b[4] = {4, 5, 6, 7};
  {
    SafetensorsWriter writer((dir / "x.safetensors").string(), layout);
    EXPECT_THROW(writer.append("b", b), Error);          // out of order
    EXPECT_THROW(writer.append("a", {a, 2}), Error);     // wrong size
    writer.append("a", a);
    EXPECT_THROW(writer.finish(), Error);                // "b" unwritten
  }
  EXPECT_TRUE(fs::is_empty(dir)) << "an unfinished writer removes its temporary file";
  {
    SafetensorsWriter writer((dir / "x.safetensors").string(), layout);
    writer.append("a", a);
    writer.append("b", b);
    writer.finish();
  }
  const auto file = SafetensorsFile::open((dir / "x.safetensors").string());
  ASSERT_NE(file->find("b"), nullptr);
  EXPECT_EQ(file->find("b")->describe(), "[2] BF16");
  EXPECT_TRUE(std::equal(b, b + 4, file->find("b")->bytes.begin(), file->find("b")->bytes.end()));
}

// Without a GPU, `mxmoe load` of a good checkpoint is one error line saying so; with one, it loads
// every layer with a progress line each and a summary.
TEST(CliLoad, LoadsWithProgressOrSaysThereIsNoGpu) {
  const fs::path dir = test::scratch_dir();
  ASSERT_EQ(test::run_cli("make-checkpoint --experts 6 --top-k 2 --hidden 64 --intermediate 96 --layers 3 --shards 2 "
                          "--out " + dir.string()).exit_code, 0);
  const auto r = test::run_cli("load --checkpoint " + dir.string() + " --layers 1-2");
  if (list_gpus().empty()) {
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_EQ(r.err.rfind("mxmoe: error: load: no CUDA GPU is visible", 0), 0u) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  } else {
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.err.find("layer 1 (1/2)"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("layer 2 (2/2)"), std::string::npos) << r.err;
    EXPECT_NE(r.out.find("loaded 2 layers"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("peak host RSS"), std::string::npos) << r.out;
    const auto quiet = test::run_cli("load --quiet --checkpoint " + dir.string());
    EXPECT_EQ(quiet.exit_code, 0) << quiet.err;
    EXPECT_EQ(quiet.err, "");
    EXPECT_NE(quiet.out.find("loaded 3 layers"), std::string::npos) << quiet.out;
  }
  for (const char* layers : {"3", "2-1", "x", "1-", "-1"}) {
    const auto bad = test::run_cli("load --checkpoint " + dir.string() + " --layers " + layers);
    EXPECT_EQ(bad.exit_code, 2) << layers << ": " << bad.err;
  }
  EXPECT_EQ(test::run_cli("load").exit_code, 2);
}

class CliLoadBadCheckpoint : public ::testing::TestWithParam<test::BadCheckpoint> {};

TEST_P(CliLoadBadCheckpoint, ExitsOneWithOneErrorLine) {
  const fs::path dir = test::scratch_dir();
  const fs::path path = GetParam().make(dir);
  const auto r = test::run_cli("load --checkpoint " + path.string());
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_EQ(r.err.rfind("mxmoe: error: ", 0), 0u) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_NE(r.err.find(dir.string()), std::string::npos) << r.err;
  for (const auto& word : GetParam().error_mentions) EXPECT_NE(r.err.find(word), std::string::npos) << r.err;
}

INSTANTIATE_TEST_SUITE_P(Cases, CliLoadBadCheckpoint, ::testing::ValuesIn(test::bad_checkpoints()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace mxmoe
