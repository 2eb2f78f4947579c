#include "io/file_ranges.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "mxmoe/error.hpp"

namespace mxmoe {

void read_file_range(int fd, uint64_t offset, std::span<uint8_t> out, const char* what) {
  for (size_t done = 0; done < out.size();) {
    const ssize_t n = ::pread(fd, out.data() + done, out.size() - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw Error(std::string(what) + ": read failed at file byte " + std::to_string(offset + done) + ": " +
                           std::strerror(errno));
    if (n == 0) {
      throw Error(std::string(what) + ": the file ends at byte " + std::to_string(offset + done) + ", before the " +
                  std::to_string(out.size()) + " bytes at " + std::to_string(offset) + " (truncated since it was opened?)");
    }
    done += static_cast<size_t>(n);
  }
}

void prefetch_file_range(int fd, uint64_t offset, uint64_t bytes) {
  if (bytes > 0) ::posix_fadvise(fd, static_cast<off_t>(offset), static_cast<off_t>(bytes), POSIX_FADV_WILLNEED);
}

}  // namespace mxmoe
