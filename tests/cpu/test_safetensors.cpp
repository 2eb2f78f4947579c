#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "mxmoe/error.hpp"
#include "mxmoe/safetensors.hpp"
#include "test_support.hpp"

namespace mxmoe {
namespace {

namespace fs = std::filesystem;

TEST(Safetensors, RoundTripsTensorsAndMetadata) {
  const fs::path path = test::scratch_dir() / "t.safetensors";
  const std::vector<uint8_t> a{1, 2, 3, 4, 5, 6};
  const std::vector<uint8_t> b{9, 8, 7, 6};  // two bf16 values
  const std::vector<TensorToWrite> tensors{{"alpha", Dtype::kU8, {2, 3}, a}, {"beta", Dtype::kBF16, {2}, b},
                                           {"empty", Dtype::kF32, {0, 5}, {}}};
  write_safetensors(path.string(), tensors, {{"format", "pt"}});

  const auto file = SafetensorsFile::open(path.string());
  ASSERT_EQ(file->tensors().size(), 3u);
  const TensorInfo* alpha = file->find("alpha");
  ASSERT_NE(alpha, nullptr);
  EXPECT_EQ(alpha->dtype, Dtype::kU8);
  EXPECT_EQ(alpha->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(std::vector<uint8_t>(alpha->bytes.begin(), alpha->bytes.end()), a);
  const TensorInfo* beta = file->find("beta");
  ASSERT_NE(beta, nullptr);
  EXPECT_EQ(beta->describe(), "[2] BF16");
  EXPECT_EQ(std::vector<uint8_t>(beta->bytes.begin(), beta->bytes.end()), b);
  EXPECT_EQ(file->find("empty")->bytes.size(), 0u);
  EXPECT_EQ(file->find("gamma"), nullptr);
  EXPECT_EQ(file->metadata().at("format"), "pt");
}

TEST(Safetensors, HeaderIsPaddedToEightBytesAndLeavesNoTemporaryFiles) {
  const fs::path dir = test::scratch_dir();
  const std::vector<uint8_t> a{1, 2, 3};
  write_safetensors((dir / "t.safetensors").string(), std::vector<TensorToWrite>{{"x", Dtype::kU8, {3}, a}});
  const auto file = SafetensorsFile::open((dir / "t.safetensors").string());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(file->find("x")->bytes.data()) % 8, 0u);
  EXPECT_EQ(std::distance(fs::directory_iterator(dir), fs::directory_iterator()), 1);
}

TEST(Safetensors, WriterRejectsByteCountThatDisagreesWithShape) {
  const fs::path dir = test::scratch_dir();
  const std::vector<uint8_t> a{1, 2, 3};
  EXPECT_THROW(write_safetensors((dir / "t.safetensors").string(), std::vector<TensorToWrite>{{"x", Dtype::kBF16, {3}, a}}),
               Error);
  EXPECT_FALSE(fs::exists(dir / "t.safetensors"));
}

TEST(Safetensors, ReaderAcceptsTrailingSpacesInHeader) {
  const fs::path path = test::scratch_dir() / "t.safetensors";
  test::write_file(path, test::safetensors_bytes(R"({"x":{"dtype":"I16","shape":[2],"data_offsets":[0,4]}}    )", "abcd"));
  EXPECT_EQ(SafetensorsFile::open(path.string())->find("x")->shape, (std::vector<int64_t>{2}));
}

struct MalformedHeader {
  const char* name;
  std::string header;
  std::string data;
  std::string mentions;
};

void PrintTo(const MalformedHeader& c, std::ostream* os) { *os << c.name; }

class SafetensorsMalformed : public ::testing::TestWithParam<MalformedHeader> {};

TEST_P(SafetensorsMalformed, FailsWithOneClearError) {
  const fs::path path = test::scratch_dir() / "bad.safetensors";
  test::write_file(path, test::safetensors_bytes(GetParam().header, GetParam().data));
  try {
    SafetensorsFile::open(path.string());
    FAIL() << "no error for " << GetParam().name;
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_EQ(message.rfind(path.string() + ": ", 0), 0u) << message;
    EXPECT_NE(message.find(GetParam().mentions), std::string::npos) << message;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cases, SafetensorsMalformed,
    ::testing::Values(
        MalformedHeader{"missing_dtype", R"({"x":{"shape":[2],"data_offsets":[0,2]}})", "ab", "tensor 'x': missing dtype"},
        MalformedHeader{"missing_shape", R"({"x":{"dtype":"U8","data_offsets":[0,2]}})", "ab", "tensor 'x': missing shape"},
        MalformedHeader{"negative_dim", R"({"x":{"dtype":"U8","shape":[-2],"data_offsets":[0,2]}})", "ab",
                        "is not a list of sizes"},
        MalformedHeader{"float_dim", R"({"x":{"dtype":"U8","shape":[2.0],"data_offsets":[0,2]}})", "ab",
                        "is not a list of sizes"},
        MalformedHeader{"huge_shape", R"({"x":{"dtype":"U8","shape":[4294967296,4294967296],"data_offsets":[0,2]}})",
                        "ab", "too large"},
        MalformedHeader{"offsets_not_pair", R"({"x":{"dtype":"U8","shape":[2],"data_offsets":[0]}})", "ab",
                        "data_offsets must be [begin, end]"},
        MalformedHeader{"offsets_reversed", R"({"x":{"dtype":"U8","shape":[2],"data_offsets":[2,0]}})", "ab",
                        "out of range"},
        MalformedHeader{"offsets_past_data", R"({"x":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})", "ab",
                        "out of range"},
        MalformedHeader{"size_mismatch", R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", "abcd",
                        "needs 8"},
        MalformedHeader{"overlap",
                        R"({"x":{"dtype":"U8","shape":[3],"data_offsets":[0,3]},"y":{"dtype":"U8","shape":[2],"data_offsets":[2,4]}})",
                        "abcd", "overlap"},
        MalformedHeader{"entry_not_object", R"({"x":[1,2]})", "", "not an object"},
        MalformedHeader{"metadata_not_object", R"({"__metadata__":[1]})", "", "__metadata__ is not an object"},
        MalformedHeader{"metadata_value_not_string", R"({"__metadata__":{"a":1}})", "", "not a string"}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(Safetensors, MissingFileAndDirectoryAreErrors) {
  const fs::path dir = test::scratch_dir();
  EXPECT_THROW(SafetensorsFile::open((dir / "nope.safetensors").string()), Error);
  EXPECT_THROW(SafetensorsFile::open(dir.string()), Error);
}

}  // namespace
}  // namespace mxmoe
