#include "clock_monitor.hpp"

#include <cuda_runtime.h>
#include <dlfcn.h>

#include <algorithm>
#include <chrono>

namespace mxmoe::cli {

// The few NVML entry points the monitor calls, by the C ABI of nvml.h (enums as int, handles as
// pointers). Clock-event reason bits: nvmlClocksEventReasonSwPowerCap = 0x4; hardware slowdown
// 0x8, software thermal 0x20, hardware thermal 0x40, power brake 0x80.
struct NvmlDevice {
  using Init = int (*)();
  using HandleByBusId = int (*)(const char*, void**);
  using Clock = int (*)(void*, int, unsigned*);
  using Power = int (*)(void*, unsigned*);
  using Reasons = int (*)(void*, unsigned long long*);
  static constexpr int kClockSm = 1, kClockMemory = 2;  // NVML_CLOCK_SM, NVML_CLOCK_MEM
  static constexpr unsigned long long kPowerCap = 0x4, kSlowdown = 0x8 | 0x20 | 0x40 | 0x80;

  void* library = nullptr;
  Init shutdown = nullptr;
  Clock clock = nullptr;
  Power power = nullptr;
  Reasons reasons = nullptr;
  void* device = nullptr;

  ~NvmlDevice() {
    if (shutdown) shutdown();
    if (library) dlclose(library);
  }
  ClockSample sample() const {
    ClockSample s;
    clock(device, kClockSm, &s.sm_mhz);
    unsigned milliwatts = 0;
    if (power && power(device, &milliwatts) == 0) s.power_w = milliwatts * 1e-3;
    unsigned long long bits = 0;
    if (reasons && reasons(device, &bits) == 0) {
      s.power_capped = (bits & kPowerCap) != 0;
      s.slowdown = (bits & kSlowdown) != 0;
    }
    return s;
  }
};

namespace {

// NVML for the current CUDA device, found by its PCI bus id (NVML's indices need not be CUDA's),
// or null where anything is missing.
std::unique_ptr<NvmlDevice> open_nvml() {
  auto n = std::make_unique<NvmlDevice>();
  n->library = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!n->library) return nullptr;
  auto symbol = [&](const char* name) { return dlsym(n->library, name); };
  auto init = reinterpret_cast<NvmlDevice::Init>(symbol("nvmlInit_v2"));
  auto by_bus_id = reinterpret_cast<NvmlDevice::HandleByBusId>(symbol("nvmlDeviceGetHandleByPciBusId_v2"));
  n->clock = reinterpret_cast<NvmlDevice::Clock>(symbol("nvmlDeviceGetClockInfo"));
  n->power = reinterpret_cast<NvmlDevice::Power>(symbol("nvmlDeviceGetPowerUsage"));
  n->reasons = reinterpret_cast<NvmlDevice::Reasons>(symbol("nvmlDeviceGetCurrentClocksEventReasons"));
  if (!n->reasons) n->reasons = reinterpret_cast<NvmlDevice::Reasons>(symbol("nvmlDeviceGetCurrentClocksThrottleReasons"));
  auto shutdown = reinterpret_cast<NvmlDevice::Init>(symbol("nvmlShutdown"));
  if (!init || !by_bus_id || !n->clock || !shutdown || init() != 0) return nullptr;
  n->shutdown = shutdown;
  int device = 0;
  char bus_id[32] = {};
  if (cudaGetDevice(&device) != cudaSuccess || cudaDeviceGetPCIBusId(bus_id, sizeof(bus_id), device) != cudaSuccess ||
      by_bus_id(bus_id, &n->device) != 0) {
    cudaGetLastError();
    return nullptr;
  }
  unsigned mhz = 0;
  if (n->clock(n->device, NvmlDevice::kClockSm, &mhz) != 0) return nullptr;
  return n;
}

}  // namespace

CurrentClocks read_current_clocks() {
  CurrentClocks c;
  if (const auto nvml = open_nvml()) {
    nvml->clock(nvml->device, NvmlDevice::kClockSm, &c.sm_mhz);
    nvml->clock(nvml->device, NvmlDevice::kClockMemory, &c.memory_mhz);
  }
  return c;
}

ClockReport summarize_clock_samples(std::vector<ClockSample> samples) {
  ClockReport r;
  r.samples = static_cast<int>(samples.size());
  if (samples.empty()) return r;
  std::vector<unsigned> mhz;
  std::vector<double> watts;
  int capped = 0, slowdown = 0;
  for (const ClockSample& s : samples) {
    mhz.push_back(s.sm_mhz);
    watts.push_back(s.power_w);
    capped += s.power_capped ? 1 : 0;
    slowdown += s.slowdown ? 1 : 0;
  }
  std::sort(mhz.begin(), mhz.end());
  std::sort(watts.begin(), watts.end());
  r.sm_mhz_median = mhz[mhz.size() / 2];
  r.sm_mhz_min = mhz.front();
  r.power_w_median = watts[watts.size() / 2];
  r.power_w_max = watts.back();
  r.power_capped_fraction = static_cast<double>(capped) / r.samples;
  r.slowdown_fraction = static_cast<double>(slowdown) / r.samples;
  return r;
}

ClockMonitor::ClockMonitor(int interval_us) : nvml_(open_nvml()), interval_us_(interval_us) {}

ClockMonitor::~ClockMonitor() {
  if (running_) stop();
}

bool ClockMonitor::available() const { return nvml_ != nullptr; }

void ClockMonitor::start() {
  if (!nvml_ || running_) return;
  samples_.clear();
  running_ = true;
  thread_ = std::thread([this] {
    while (running_) {
      samples_.push_back(nvml_->sample());
      std::this_thread::sleep_for(std::chrono::microseconds(interval_us_));
    }
  });
}

ClockReport ClockMonitor::stop() {
  if (!running_) return summarize_clock_samples({});
  running_ = false;
  thread_.join();
  if (samples_.empty()) samples_.push_back(nvml_->sample());  // a region shorter than the thread's start
  return summarize_clock_samples(samples_);
}

}  // namespace mxmoe::cli
