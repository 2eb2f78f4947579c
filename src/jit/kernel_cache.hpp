// The kernel cache: a tactic's binary for an arch comes from (in order) this process's memory, the
// ahead-of-time set built into the library, the on-disk cache, or NVRTC (and is then stored).
//
// Directory: $MXMOE_CACHE_DIR, else $XDG_CACHE_HOME/mxmoe, else ~/.cache/mxmoe; entries are
// kernels/<key>.entry (format in kernel_binary.hpp), each written whole to a temporary file and
// renamed into place. Many processes asking for the same missing entry compile it once: the first
// takes kernels/<key>.lock (flock) and compiles, the others wait on the lock and then load what it
// wrote. A damaged entry is reported once and rebuilt. A directory that cannot be created, locked
// or written (read-only, full) makes the cache compile in memory, with a warning, never an error.
// Every compile appends one line to compile.log.
#pragma once

#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "jit/kernel_binary.hpp"

namespace mxmoe {

class KernelCache {
 public:
  explicit KernelCache(std::string dir);
  static std::string default_dir();

  const std::string& dir() const { return dir_; }

  enum class Origin { kMemory, kAheadOfTime, kDisk, kCompiled };
  struct Result {
    KernelBinary binary;
    Origin origin;
  };
  Result get(const Tactic& tactic, const Arch& arch);

  struct Listing {
    std::string file;
    std::string key, tactic, arch;
    size_t bytes = 0;
    double age_seconds = 0.0;
    std::string problem;  // non-empty for a damaged entry
    std::vector<std::string> assembler_warnings;
  };
  std::vector<Listing> list() const;
  size_t clear() const;  // removes every entry, lock and log; returns the entries removed

 private:
  std::string entry_path(const std::string& key) const;
  Result remember(KernelBinary binary, Origin origin);

  std::string dir_;
  std::mutex mutex_;
  std::map<std::string, KernelBinary> memory_;
};

// The process-wide cache at KernelCache::default_dir(), created on first use.
KernelCache& default_kernel_cache();

}  // namespace mxmoe
