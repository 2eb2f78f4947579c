// The buckets of prepared launches (runner/launch_plan.hpp), with stand-in plans and launches: every
// count up to 64 its own, past that runs of one plan cut after each power of two, each made for its
// largest count, and every count finding the bucket that holds it.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "runner/launch_plan.hpp"

namespace mxmoe {
namespace {

// Stand-in plans told apart by their FC1 tile rows; a launch records its plan and the count it was
// made for in tile_offsets_index.
LayerPlan plan_with(int id) {
  LayerPlan p;
  p.fc1.tile_rows = id;
  return p;
}

TEST(LaunchTable, BucketsAndLookups) {
  // Plan 1 up to 100 tokens, plan 2 up to 700, plan 3 past that.
  auto plan_of = [](int t) { return plan_with(t <= 100 ? 1 : t <= 700 ? 2 : 3); };
  std::vector<int> made_for;
  auto make = [&](const LayerPlan& p, int t) {
    made_for.push_back(t);
    LayerLaunch l;
    l.plan = p;
    l.tile_offsets_index[0] = t;
    return l;
  };
  LaunchTable table;
  table.build(1000, plan_of, make);
  EXPECT_EQ(table.max_tokens(), 1000);
  std::vector<int> expected;
  for (int t = 1; t <= 64; ++t) expected.push_back(t);
  for (int t : {100, 128, 256, 512, 700, 1000}) expected.push_back(t);
  EXPECT_EQ(made_for, expected);
  EXPECT_EQ(table.buckets(), expected.size());
  for (int t = 1; t <= 1000; ++t) {
    const LayerLaunch& l = table.find(t);
    const int last = *std::lower_bound(expected.begin(), expected.end(), t);
    ASSERT_EQ(l.tile_offsets_index[0], last) << "T = " << t;
    ASSERT_EQ(l.plan, plan_of(t)) << "T = " << t;
  }
}

TEST(LaunchTable, RebuildingReplacesTheBuckets) {
  auto make = [](const LayerPlan& p, int t) {
    LayerLaunch l;
    l.plan = p;
    l.tile_offsets_index[0] = t;
    return l;
  };
  LaunchTable table;
  table.build(10, [](int) { return plan_with(1); }, make);
  EXPECT_EQ(table.buckets(), 10u);
  table.build(200, [](int) { return plan_with(1); }, make);
  EXPECT_EQ(table.max_tokens(), 200);
  EXPECT_EQ(table.buckets(), 64u + 2u);  // 65-128, 129-200
  EXPECT_EQ(table.find(129).tile_offsets_index[0], 200);
}

}  // namespace
}  // namespace mxmoe
