// Host bytes to the device through pinned buffers. Worker threads each take the next piece of a copy,
// fill a pinned buffer with it and enqueue its copy to the device, so that while the copy engine
// moves some pieces out the threads fill the next ones: the transfer runs at the slower of the host
// read and PCIe instead of their sum, and a pinned source lets the copy engine run at full rate. A
// piece comes from memory (memcpy: a vector, NumPy, or a mapping, whose cold pages each cost a
// fault) or from a file (pread: the kernel copies from its page cache into the pinned buffer, with no
// faults and nothing of the file left resident in this process).
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace mxmoe {

// Where an upload's bytes are: at `address`, or, where `fd` >= 0, in that file from `offset`.
struct HostSource {
  const void* address = nullptr;
  int fd = -1;
  uint64_t offset = 0;

  HostSource advanced(size_t bytes) const {
    return fd >= 0 ? HostSource{nullptr, fd, offset + bytes} : HostSource{static_cast<const char*>(address) + bytes};
  }
};

class StagedUpload {
 public:
  static constexpr size_t kPieceBytes = 4u << 20;
  static constexpr int kBuffers = 16;  // also the most worker threads a copy uses

  // Pinned buffers of min(piece_bytes, largest_copy) bytes each; copies go on `stream`.
  StagedUpload(cudaStream_t stream, size_t largest_copy, size_t piece_bytes = kPieceBytes);
  ~StagedUpload();  // waits for the copies in flight, then frees the pinned buffers
  StagedUpload(const StagedUpload&) = delete;
  StagedUpload& operator=(const StagedUpload&) = delete;

  // Enqueues the copy of `bytes` from `source` to `device`. Returns once the source has been read;
  // the device side is complete in stream order. Throws Error naming `what` when a read or CUDA fails.
  void copy(void* device, HostSource source, size_t bytes, const char* what);

 private:
  void release();

  cudaStream_t stream_;
  size_t piece_bytes_;
  void* pinned_ = nullptr;  // kBuffers buffers of piece_bytes_, one allocation
  cudaEvent_t drained_[kBuffers] = {};  // the last copy enqueued out of each buffer is complete
  // Piece g of this upload's life goes through buffer g % kBuffers as its use g / kBuffers; uses_[b]
  // counts the uses of buffer b enqueued so far, so a piece waits for its buffer's previous use.
  std::atomic<uint64_t> uses_[kBuffers] = {};
  uint64_t pieces_ = 0;  // pieces of the copies so far
};

}  // namespace mxmoe
