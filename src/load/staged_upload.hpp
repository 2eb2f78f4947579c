// Host memory (pageable: a vector, or a memory-mapped checkpoint) to the device through pinned
// buffers. The host copies piece i + 1 into one buffer (in parallel, so that a cold mapping's page
// faults are taken by several threads) while the copy engine moves piece i out of the other: the
// transfer runs at the slower of the host read and PCIe instead of their sum, and a pinned source
// lets the copy engine run at full rate.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

namespace mxmoe {

class StagedUpload {
 public:
  static constexpr size_t kPieceBytes = 16u << 20;

  // Pinned buffers of min(piece_bytes, largest_copy) bytes each; copies go on `stream`.
  StagedUpload(cudaStream_t stream, size_t largest_copy, size_t piece_bytes = kPieceBytes);
  ~StagedUpload();  // waits for the copies in flight, then frees the pinned buffers
  StagedUpload(const StagedUpload&) = delete;
  StagedUpload& operator=(const StagedUpload&) = delete;

  // Enqueues the copy of `bytes` at `host` to `device`. Returns once `host` has been read; the
  // device side is complete in stream order. Throws Error naming `what` when CUDA fails.
  void copy(void* device, const void* host, size_t bytes, const char* what);

 private:
  void release();

  static constexpr int kBuffers = 2;
  cudaStream_t stream_;
  size_t piece_bytes_;
  void* pinned_[kBuffers] = {};
  cudaEvent_t drained_[kBuffers] = {};  // the copy out of each buffer is complete
  int next_ = 0;
};

}  // namespace mxmoe
