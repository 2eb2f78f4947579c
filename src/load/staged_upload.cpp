#include "load/staged_upload.hpp"

#include <algorithm>
#include <cstring>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/parallel.hpp"
#include "device/cuda_check.hpp"
#include "io/file_ranges.hpp"

namespace mxmoe {

StagedUpload::StagedUpload(cudaStream_t stream, size_t largest_copy, size_t piece_bytes)
    : stream_(stream), piece_bytes_(std::max<size_t>(1, std::min(piece_bytes, largest_copy))) {
  try {
    cuda_check(cudaHostAlloc(&pinned_, kBuffers * piece_bytes_, cudaHostAllocDefault),
               "pinned staging buffers (" + std::to_string(kBuffers * piece_bytes_) + " bytes)");
    for (int i = 0; i < kBuffers; ++i) {
      cuda_check(cudaEventCreateWithFlags(&drained_[i], cudaEventDisableTiming), "staging event");
    }
  } catch (...) {
    release();
    throw;
  }
}

StagedUpload::~StagedUpload() { release(); }

void StagedUpload::release() {
  for (int i = 0; i < kBuffers; ++i) {
    if (drained_[i]) {
      cudaEventSynchronize(drained_[i]);
      cudaEventDestroy(drained_[i]);
      drained_[i] = nullptr;
    }
  }
  if (pinned_) {
    cudaFreeHost(pinned_);
    pinned_ = nullptr;
  }
}

void StagedUpload::copy(void* device, HostSource source, size_t bytes, const char* what) {
  const size_t pieces = (bytes + piece_bytes_ - 1) / piece_bytes_;
  if (pieces == 0) return;
  int current_device = 0;
  cuda_check(cudaGetDevice(&current_device), "cudaGetDevice");
  const uint64_t first = pieces_;
  pieces_ += pieces;
  std::atomic<size_t> next{0};
  std::exception_ptr error;
  std::mutex error_mutex;

  auto fill_and_enqueue = [&](size_t k, int b) {
    const size_t done = k * piece_bytes_, piece = std::min(piece_bytes_, bytes - done);
    cuda_check(cudaEventSynchronize(drained_[b]), std::string("staging ") + what);
    auto* pinned = static_cast<unsigned char*>(pinned_) + b * piece_bytes_;
    const HostSource from = source.advanced(done);
    if (from.fd >= 0) {
      read_file_range(from.fd, from.offset, {pinned, piece}, what);
    } else {
      std::memcpy(pinned, from.address, piece);
    }
    cuda_check(cudaMemcpyAsync(static_cast<unsigned char*>(device) + done, pinned, piece, cudaMemcpyHostToDevice,
                               stream_),
               std::string("copying ") + what + " to the device");
    cuda_check(cudaEventRecord(drained_[b], stream_), std::string("staging ") + what);
  };
  // Pieces are taken in order, so the one a piece waits for (its buffer's previous use) was taken
  // before it by a worker that waits only on earlier pieces: every wait ends. A piece after a
  // failure is skipped but still counted, so that no worker waits on it.
  auto worker = [&] {
    const cudaError_t set = cudaSetDevice(current_device);
    for (size_t k = next++; k < pieces; k = next++) {
      const uint64_t g = first + k;
      const int b = static_cast<int>(g % kBuffers);
      const uint64_t use = g / kBuffers;
      for (uint64_t seen = uses_[b].load(); seen != use; seen = uses_[b].load()) uses_[b].wait(seen);
      try {
        bool failed;
        {
          std::lock_guard lock(error_mutex);
          failed = error != nullptr;
        }
        if (!failed) {
          cuda_check(set, "cudaSetDevice on a staging thread");
          fill_and_enqueue(k, b);
        }
      } catch (...) {
        std::lock_guard lock(error_mutex);
        if (!error) error = std::current_exception();
      }
      uses_[b].store(use + 1);
      uses_[b].notify_all();
    }
  };
  const size_t workers = std::min<size_t>({static_cast<size_t>(default_thread_count()), kBuffers, pieces});
  {
    std::vector<std::jthread> threads;
    for (size_t w = 1; w < workers; ++w) threads.emplace_back(worker);
    worker();
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace mxmoe
