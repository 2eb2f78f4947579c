#include "common/atomic_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "mxmoe/error.hpp"

namespace mxmoe {

AtomicFileWriter::AtomicFileWriter(const std::string& path)
    : path_(path), tmp_(path + ".tmp." + std::to_string(getpid()) + ".XXXXXX") {
  fd_ = mkstemp(tmp_.data());
  if (fd_ < 0) throw Error(path + ": cannot create a temporary file: " + std::strerror(errno));
}

AtomicFileWriter::~AtomicFileWriter() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(tmp_.c_str());
  }
}

void AtomicFileWriter::fail(const char* what) {
  const int err = errno;
  ::close(fd_);
  fd_ = -1;
  ::unlink(tmp_.c_str());
  throw Error(path_ + ": " + what + ": " + std::strerror(err));
}

void AtomicFileWriter::write(std::span<const uint8_t> piece) {
  if (fd_ < 0) throw Error(path_ + ": write after the file was committed or failed");
  size_t done = 0;
  while (done < piece.size()) {
    const ssize_t n = ::write(fd_, piece.data() + done, piece.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail("write failed");
    done += static_cast<size_t>(n);
  }
}

void AtomicFileWriter::commit() {
  if (fd_ < 0) throw Error(path_ + ": commit after the file was committed or failed");
  if (::fchmod(fd_, 0644) != 0 || ::fsync(fd_) != 0) fail("cannot flush");
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) {
    const int err = errno;
    ::unlink(tmp_.c_str());
    throw Error(path_ + ": close failed: " + std::strerror(err));
  }
  if (std::rename(tmp_.c_str(), path_.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp_.c_str());
    throw Error(path_ + ": cannot rename into place: " + std::strerror(err));
  }
}

void write_file_atomically(const std::string& path, std::span<const std::span<const uint8_t>> pieces) {
  AtomicFileWriter file(path);
  for (auto piece : pieces) file.write(piece);
  file.commit();
}

}  // namespace mxmoe
