#include "common/atomic_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "mxmoe/error.hpp"

namespace mxmoe {

void write_file_atomically(const std::string& path, std::span<const std::span<const uint8_t>> pieces) {
  std::string tmp = path + ".tmp." + std::to_string(getpid()) + ".XXXXXX";
  const int fd = mkstemp(tmp.data());
  if (fd < 0) throw Error(path + ": cannot create a temporary file: " + std::strerror(errno));
  auto fail = [&](const char* what) {
    const int err = errno;
    ::close(fd);
    ::unlink(tmp.c_str());
    throw Error(path + ": " + what + ": " + std::strerror(err));
  };
  for (auto piece : pieces) {
    size_t done = 0;
    while (done < piece.size()) {
      const ssize_t n = ::write(fd, piece.data() + done, piece.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) fail("write failed");
      done += static_cast<size_t>(n);
    }
  }
  if (::fchmod(fd, 0644) != 0 || ::fsync(fd) != 0) fail("cannot flush");
  if (::close(fd) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    throw Error(path + ": close failed: " + std::strerror(err));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    throw Error(path + ": cannot rename into place: " + std::strerror(err));
  }
}

}  // namespace mxmoe
