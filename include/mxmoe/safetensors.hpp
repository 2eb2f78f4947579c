// safetensors files: an 8-byte little-endian header length N, N bytes of JSON
// ({name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {str: str}}), then the
// data, addressed by offsets relative to its start. Files are memory-mapped and stay open, so that a
// large tensor can also be read with pread (file_offset), which takes no page faults in this process
// and maps nothing into it; nothing is read past what the header validly describes.
//
// Every problem is an Error that begins with the file's path and names the tensor and what was
// expected: a file shorter than 8 bytes, a header length past the end, JSON that does not parse or
// is not an object, an entry without a valid dtype, shape or data_offsets, offsets past the data or
// overlapping another tensor's, a byte count that disagrees with dtype x shape.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace mxmoe {

// kF8E8M0: an MX scale, 2^(e - 127) (DeepSeek-V4's expert scales; torch.float8_e8m0fnu).
enum class Dtype { kBool, kU8, kI8, kF8E4M3, kF8E5M2, kF8E8M0, kI16, kU16, kF16, kBF16, kI32, kU32, kF32, kI64, kU64, kF64 };

std::string_view dtype_name(Dtype dtype);  // the safetensors spelling: "U8", "BF16", ...
size_t dtype_size(Dtype dtype);

struct TensorInfo {
  std::string name;
  Dtype dtype = Dtype::kU8;
  std::vector<int64_t> shape;
  std::span<const uint8_t> bytes;  // into the mapping (empty for the writer's own use)

  std::string describe() const;  // "[32, 5760, 90] U8"
};

class SafetensorsFile {
 public:
  // Throws Error("PATH: ...") for anything malformed.
  static std::shared_ptr<const SafetensorsFile> open(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const TensorInfo* find(std::string_view name) const;
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // The open file (read-only) and its whole mapping, valid while this object lives.
  int fd() const { return fd_; }
  std::span<const uint8_t> mapping() const { return {mapping_, mapping_bytes_}; }

 private:
  SafetensorsFile() = default;
  std::string path_;
  int fd_ = -1;
  const uint8_t* mapping_ = nullptr;
  size_t mapping_bytes_ = 0;
  std::vector<TensorInfo> tensors_;  // sorted by name
  std::map<std::string, std::string> metadata_;
};

struct TensorToWrite {
  std::string name;
  Dtype dtype;
  std::vector<int64_t> shape;
  std::span<const uint8_t> bytes;
};

// Writes atomically: a temporary file in the same directory, renamed into place once complete, so a
// reader never sees a half-written file. Throws Error on a size mismatch or an I/O failure.
void write_safetensors(const std::string& path, std::span<const TensorToWrite> tensors,
                       const std::map<std::string, std::string>& metadata = {});

class AtomicFileWriter;

// The same file written a tensor at a time, for files larger than the memory at hand: the header
// comes from `layout` (names, dtypes and shapes; bytes unused), then append() takes each tensor's
// bytes in layout order, and finish() renames the file into place. A writer destroyed unfinished
// removes its temporary file. Throws Error for a tensor out of order or of the wrong size.
class SafetensorsWriter {
 public:
  SafetensorsWriter(const std::string& path, std::span<const TensorToWrite> layout,
                    const std::map<std::string, std::string>& metadata = {});
  ~SafetensorsWriter();
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

  void append(const std::string& name, std::span<const uint8_t> bytes);
  void finish();

 private:
  struct Pending {
    std::string name;
    uint64_t bytes;
  };
  std::string path_;
  std::vector<Pending> layout_;
  size_t next_ = 0;
  std::unique_ptr<AtomicFileWriter> file_;
};

}  // namespace mxmoe
