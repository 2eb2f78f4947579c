// Reading byte ranges of open files without mapping them: pread straight into the caller's buffer
// (the kernel copies from its page cache, so this process takes no page faults and keeps none of
// the file resident; several threads may read one file at once), and asking the kernel to read a
// range ahead into the page cache.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace mxmoe {

// Fills `out` with the file's bytes [offset, offset + out.size()), retrying short reads. Throws
// Error naming `what` when the file ends first or the read fails.
void read_file_range(int fd, uint64_t offset, std::span<uint8_t> out, const char* what);

// Asks the kernel to read [offset, offset + bytes) into the page cache (posix_fadvise WILLNEED);
// blocks while it queues the reads, so callers that want overlap call it on their own thread. Best
// effort: never throws.
void prefetch_file_range(int fd, uint64_t offset, uint64_t bytes);

}  // namespace mxmoe
