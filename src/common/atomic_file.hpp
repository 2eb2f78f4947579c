// Whole-file writes that readers never see half done: the bytes go to a temporary file in the
// target's directory, which is flushed and then renamed over the target. On any failure the
// temporary file is removed and an Error names the path and the system's reason.
#pragma once

#include <cstdint>
#include <span>
#include <string>

namespace mxmoe {

void write_file_atomically(const std::string& path, std::span<const std::span<const uint8_t>> pieces);

// The same, a piece at a time: write() appends to the temporary file, commit() flushes it and renames
// it into place; destroyed uncommitted, it removes the temporary file.
class AtomicFileWriter {
 public:
  explicit AtomicFileWriter(const std::string& path);
  ~AtomicFileWriter();
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

  void write(std::span<const uint8_t> piece);
  void commit();

 private:
  [[noreturn]] void fail(const char* what);

  std::string path_, tmp_;
  int fd_ = -1;
};

}  // namespace mxmoe
