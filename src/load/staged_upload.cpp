#include "load/staged_upload.hpp"

#include <algorithm>
#include <cstring>
#include <string>

#include "common/parallel.hpp"
#include "device/cuda_check.hpp"

namespace mxmoe {
namespace {

// A host copy split among threads in runs of this size, so that a piece keeps several busy.
constexpr size_t kHostRunBytes = 2u << 20;

}  // namespace

StagedUpload::StagedUpload(cudaStream_t stream, size_t largest_copy, size_t piece_bytes)
    : stream_(stream), piece_bytes_(std::max<size_t>(1, std::min(piece_bytes, largest_copy))) {
  try {
    for (int i = 0; i < kBuffers; ++i) {
      cuda_check(cudaHostAlloc(&pinned_[i], piece_bytes_, cudaHostAllocDefault),
                 "pinned staging buffer (" + std::to_string(piece_bytes_) + " bytes)");
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
    if (pinned_[i]) {
      cudaFreeHost(pinned_[i]);
      pinned_[i] = nullptr;
    }
  }
}

void StagedUpload::copy(void* device, const void* host, size_t bytes, const char* what) {
  auto* to = static_cast<unsigned char*>(device);
  const auto* from = static_cast<const unsigned char*>(host);
  for (size_t done = 0; done < bytes;) {
    const size_t piece = std::min(piece_bytes_, bytes - done);
    const int buffer = next_;
    next_ = (next_ + 1) % kBuffers;
    cuda_check(cudaEventSynchronize(drained_[buffer]), std::string("staging ") + what);
    auto* pinned = static_cast<unsigned char*>(pinned_[buffer]);
    const size_t runs = (piece + kHostRunBytes - 1) / kHostRunBytes;
    parallel_for(runs, 0, [&](size_t run) {
      const size_t begin = run * kHostRunBytes;
      std::memcpy(pinned + begin, from + done + begin, std::min(kHostRunBytes, piece - begin));
    });
    cuda_check(cudaMemcpyAsync(to + done, pinned, piece, cudaMemcpyHostToDevice, stream_),
               std::string("copying ") + what + " to the device");
    cuda_check(cudaEventRecord(drained_[buffer], stream_), std::string("staging ") + what);
    done += piece;
  }
}

}  // namespace mxmoe
