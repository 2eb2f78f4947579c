// The tuned-plan table: store and load, bucket lookup, and the files it must ignore (with a
// warning) rather than trust: another mxmoe version, a malformed file, a tactic not valid here.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "tactics/tuned_plans.hpp"
#include "test_support.hpp"

namespace mxmoe {
namespace {

const Arch& sm90() { return arch_by_name("sm_90a"); }
const MoeShape k20b = model_shape("gpt-oss-20b");
const MoeShape k120b = model_shape("gpt-oss-120b");

std::map<int, TunedEntry> entries() {
  return {{1, {{parse_tactic("gemv.r64x8.w4x1.u8.k1"), parse_tactic("gemv.r128x8.w8x1.u4.k4")}, 45.6, 50.1}},
          {64, {{parse_tactic("mma.r128x16.w4x1.s4.k1"), parse_tactic("mma.r128x16.w4x1.s4.k2")}, 271.0, 273.6}}};
}

TEST(TunedPlans, StoreThenLoadKeepsEachShapeApart) {
  const std::string dir = test::scratch_dir().string();
  TunedPlans::store(dir, "NVIDIA H100 80GB HBM3", sm90(), k20b, entries());
  auto other = entries();
  other.erase(64);
  TunedPlans::store(dir, "NVIDIA H100 80GB HBM3", sm90(), k120b, other);
  const TunedPlans a = TunedPlans::load(dir, "NVIDIA H100 80GB HBM3", sm90(), k20b);
  ASSERT_EQ(a.entries().size(), 2u);
  EXPECT_EQ(a.entries().at(1).plan.fc2.name(), "gemv.r128x8.w8x1.u4.k4");
  EXPECT_DOUBLE_EQ(a.entries().at(64).heuristic_us, 273.6);
  EXPECT_EQ(TunedPlans::load(dir, "NVIDIA H100 80GB HBM3", sm90(), k120b).entries().size(), 1u);
  EXPECT_TRUE(TunedPlans::load(dir, "NVIDIA H200", sm90(), k20b).entries().empty()) << "another device's file";
}

TEST(TunedPlans, BucketLookup) {
  const std::string dir = test::scratch_dir().string();
  TunedPlans::store(dir, "gpu", sm90(), k20b, entries());
  const TunedPlans t = TunedPlans::load(dir, "gpu", sm90(), k20b);
  EXPECT_EQ(t.find(1)->fc1.name(), "gemv.r64x8.w4x1.u8.k1");
  EXPECT_EQ(t.find(2)->fc1.name(), "mma.r128x16.w4x1.s4.k1");   // smallest bucket >= 2 is 64
  EXPECT_EQ(t.find(64)->fc1.name(), "mma.r128x16.w4x1.s4.k1");
  EXPECT_FALSE(t.find(65)) << "past the largest bucket the heuristic decides";
  EXPECT_FALSE(TunedPlans().find(1));
}

// A shape's MXFP8-activation plans are stored and found apart from its bf16 ones: storing either
// keeps the other, and a group whose plans are not its format's is ignored entry by entry.
TEST(TunedPlans, Mxfp8PlansAreStoredApart) {
  const std::string dir = test::scratch_dir().string();
  const Tactic bs = parse_tactic("bsmma.r128x32.w4x1.s4.k1");
  const std::map<int, TunedEntry> mxfp8{{256, {{bs, bs, ActivationFormat::kMxfp8}, 500.0, 510.0}}};
  TunedPlans::store(dir, "gpu", sm90(), k20b, entries());
  TunedPlans::store(dir, "gpu", sm90(), k20b, mxfp8, ActivationFormat::kMxfp8);
  TunedPlans::store(dir, "gpu", sm90(), k20b, entries());  // replaces the bf16 group only
  const TunedPlans t = TunedPlans::load(dir, "gpu", sm90(), k20b);
  EXPECT_EQ(t.entries().size(), 2u);
  ASSERT_EQ(t.entries(ActivationFormat::kMxfp8).size(), 1u);
  EXPECT_EQ(*t.find(200, ActivationFormat::kMxfp8), (LayerPlan{bs, bs, ActivationFormat::kMxfp8}));
  EXPECT_FALSE(t.find(300, ActivationFormat::kMxfp8));
  EXPECT_EQ(t.find(2)->fc1.name(), "mma.r128x16.w4x1.s4.k1");
  EXPECT_EQ(t.find(2)->activations, ActivationFormat::kBf16);

  // A bf16 tactic in the MXFP8 group is not a plan there.
  std::ifstream in(TunedPlans::path(dir, "gpu", sm90()));
  nlohmann::json table = nlohmann::json::parse(in);
  for (auto& group : table["shapes"]) {
    if (group.value("activations", "") == "mxfp8") group["plans"][0]["fc1"] = "mma.r128x32.w4x1.s4.k1";
  }
  test::write_file(TunedPlans::path(dir, "gpu", sm90()), table.dump());
  testing::internal::CaptureStderr();
  const TunedPlans edited = TunedPlans::load(dir, "gpu", sm90(), k20b);
  const std::string warnings = testing::internal::GetCapturedStderr();
  EXPECT_TRUE(edited.entries(ActivationFormat::kMxfp8).empty());
  EXPECT_EQ(edited.entries().size(), 2u);
  EXPECT_NE(warnings.find("T = 256 with MXFP8 activations"), std::string::npos) << warnings;
}

void rewrite(const std::string& path, const std::function<void(nlohmann::json&)>& edit) {
  std::ifstream in(path);
  nlohmann::json table = nlohmann::json::parse(in);
  edit(table);
  test::write_file(path, table.dump());
}

std::string load_warnings(const std::string& dir, size_t expected_entries) {
  testing::internal::CaptureStderr();
  EXPECT_EQ(TunedPlans::load(dir, "gpu", sm90(), k20b).entries().size(), expected_entries);
  return testing::internal::GetCapturedStderr();
}

TEST(TunedPlans, StaleMalformedOrInvalidIsIgnoredWithAWarning) {
  const std::string dir = test::scratch_dir().string();
  const std::string path = TunedPlans::path(dir, "gpu", sm90());
  TunedPlans::store(dir, "gpu", sm90(), k20b, entries());

  rewrite(path, [](nlohmann::json& t) { t["shapes"][0]["plans"][1]["fc1"] = "mma.r256x128.w4x2.s3.k1"; });
  EXPECT_NE(load_warnings(dir, 1).find("ignoring the plan for T = 64"), std::string::npos);

  rewrite(path, [](nlohmann::json& t) { t["mxmoe_version"] = "0.0.1"; });
  EXPECT_NE(load_warnings(dir, 0).find("was made by mxmoe 0.0.1"), std::string::npos);

  test::write_file(path, "{\"format\": \"mxmoe-tuned 1\", \"shapes\": [");
  EXPECT_NE(load_warnings(dir, 0).find("is malformed"), std::string::npos);

  // A malformed table is replaced whole by the next store.
  TunedPlans::store(dir, "gpu", sm90(), k20b, entries());
  EXPECT_EQ(TunedPlans::load(dir, "gpu", sm90(), k20b).entries().size(), 2u);
}

}  // namespace
}  // namespace mxmoe
