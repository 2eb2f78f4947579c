// The bench's clock and power monitor: its summary of samples, and its behaviour with and without NVML.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "clock_monitor.hpp"

namespace mxmoe::cli {
namespace {

TEST(ClockMonitor, SummarizesMedianMinimumPowerAndCapShare) {
  const ClockReport r = summarize_clock_samples({{1980, 410.0, false, false},
                                                 {1650, 690.0, true, false},
                                                 {1755, 702.5, true, true},
                                                 {1230, 640.0, true, false}});
  EXPECT_EQ(r.samples, 4);
  EXPECT_EQ(r.sm_mhz_median, 1755u);  // the upper median of an even count
  EXPECT_EQ(r.sm_mhz_min, 1230u);
  EXPECT_DOUBLE_EQ(r.power_w_median, 690.0);
  EXPECT_DOUBLE_EQ(r.power_w_max, 702.5);
  EXPECT_DOUBLE_EQ(r.power_capped_fraction, 0.75);
  EXPECT_DOUBLE_EQ(r.slowdown_fraction, 0.25);
}

TEST(ClockMonitor, NoSamplesReportNothing) {
  const ClockReport r = summarize_clock_samples({});
  EXPECT_EQ(r.samples, 0);
  EXPECT_EQ(r.sm_mhz_median, 0u);
  EXPECT_EQ(r.power_capped_fraction, 0.0);
}

TEST(ClockMonitor, SamplesWhereNvmlIsAndIsANoOpWhereNot) {
  ClockMonitor monitor(500);
  monitor.start();
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  const ClockReport r = monitor.stop();
  if (!monitor.available()) {
    EXPECT_EQ(r.samples, 0) << "no NVML here, yet the monitor reported samples";
    return;
  }
  EXPECT_GE(r.samples, 1);
  EXPECT_GT(r.sm_mhz_median, 0u);
  EXPECT_LE(r.sm_mhz_min, r.sm_mhz_median);
  EXPECT_EQ(monitor.stop().samples, 0) << "a second stop has no region to report";
}

TEST(ClockMonitor, CurrentClocksAreReadWhereNvmlIsAndZeroWhereNot) {
  const CurrentClocks clocks = read_current_clocks();
  if (!ClockMonitor().available()) {
    EXPECT_EQ(clocks.sm_mhz, 0u);
    EXPECT_EQ(clocks.memory_mhz, 0u);
    return;
  }
  EXPECT_GT(clocks.sm_mhz, 0u);
  EXPECT_GT(clocks.memory_mhz, 0u);
}

}  // namespace
}  // namespace mxmoe::cli
