// The SM clock, board power and clock-limit reasons of the GPU while `mxmoe bench` times a row,
// sampled through NVML (which ships with the driver, loaded at run time). A figure depends on the
// clock the card held: where the layer keeps both the tensor cores and the memory busy, the card
// can reach its power limit and lower its clock, and the same kernel then runs slower than at the
// clock the ceilings were measured at.
#pragma once

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

namespace mxmoe::cli {

struct ClockSample {
  unsigned sm_mhz = 0;
  double power_w = 0;  // NVML's board power, which the driver averages over its own window (about a
                       // second on an H100): it lags regions shorter than that; 0 where not reported
  bool power_capped = false;  // the software power cap is holding the clock down
  bool slowdown = false;      // a thermal, hardware or power-brake slowdown is
};

// What the samples of one timed region say; samples == 0 where NVML is not available.
struct ClockReport {
  int samples = 0;
  unsigned sm_mhz_median = 0, sm_mhz_min = 0;
  double power_w_median = 0, power_w_max = 0;
  double power_capped_fraction = 0, slowdown_fraction = 0;
};
ClockReport summarize_clock_samples(std::vector<ClockSample> samples);

// The current CUDA device's SM and memory clocks as NVML reads them now; 0 where NVML is not available.
struct CurrentClocks {
  unsigned sm_mhz = 0, memory_mhz = 0;
};
CurrentClocks read_current_clocks();

struct NvmlDevice;  // NVML, loaded at run time, and the current CUDA device's handle in it

// Samples the current CUDA device every `interval_us` on a thread of its own between start() and
// stop(); without NVML (no driver, or another vendor's) both are no-ops and stop() reports 0 samples.
class ClockMonitor {
 public:
  explicit ClockMonitor(int interval_us = 1000);
  ~ClockMonitor();
  ClockMonitor(const ClockMonitor&) = delete;
  ClockMonitor& operator=(const ClockMonitor&) = delete;

  bool available() const;
  void start();
  ClockReport stop();

 private:
  std::unique_ptr<NvmlDevice> nvml_;
  int interval_us_;
  std::atomic<bool> running_{false};
  std::thread thread_;
  std::vector<ClockSample> samples_;
};

}  // namespace mxmoe::cli
