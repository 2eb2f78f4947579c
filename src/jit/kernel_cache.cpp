#include "jit/kernel_cache.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "common/atomic_file.hpp"
#include "common/read_file.hpp"
#include "common/warnings.hpp"
#include "jit/aot.hpp"
#include "mxmoe/error.hpp"

namespace mxmoe {
namespace {

namespace fs = std::filesystem;

// flock() on a lock file beside the entry; released when the descriptor closes.
class FileLock {
 public:
  explicit FileLock(const std::string& path) : fd_(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644)) {
    if (fd_ < 0) {
      error_ = std::strerror(errno);
      return;
    }
    while (flock(fd_, LOCK_EX) != 0) {
      if (errno != EINTR) {
        error_ = std::strerror(errno);
        ::close(fd_);
        fd_ = -1;
        return;
      }
    }
  }
  ~FileLock() {
    if (fd_ >= 0) ::close(fd_);
  }
  bool held() const { return fd_ >= 0; }
  const std::string& error() const { return error_; }

 private:
  int fd_;
  std::string error_;
};

std::optional<std::vector<uint8_t>> read_bytes(const std::string& path) {
  const std::optional<std::string> text = read_file(path);
  if (!text) return std::nullopt;
  return std::vector<uint8_t>(text->begin(), text->end());
}

// The entry at `path` if it is whole and undamaged; `damage` says why not when it exists.
std::optional<KernelBinary> read_entry(const std::string& path, const std::string& key, std::string* damage) {
  damage->clear();
  const auto bytes = read_bytes(path);
  if (!bytes) return std::nullopt;
  return parse_entry(*bytes, key, damage);
}

void append_compile_log(const std::string& dir, const KernelBinary& b) {
  const std::string line = std::to_string(b.created_unix) + " " + b.key + " " + b.tactic + " " + b.arch + " " +
                           std::to_string(b.compile_seconds) + "s pid=" + std::to_string(getpid()) + "\n";
  const int fd = ::open((dir + "/compile.log").c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return;
  // One write of a short line with O_APPEND: lines of concurrent processes do not interleave.
  [[maybe_unused]] const ssize_t written = ::write(fd, line.data(), line.size());
  ::close(fd);
}

}  // namespace

KernelCache::KernelCache(std::string dir) : dir_(std::move(dir)) {}

std::string KernelCache::default_dir() {
  if (const char* dir = std::getenv("MXMOE_CACHE_DIR"); dir && *dir) return dir;
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg) return std::string(xdg) + "/mxmoe";
  if (const char* home = std::getenv("HOME"); home && *home) return std::string(home) + "/.cache/mxmoe";
  return "/tmp/mxmoe-cache-" + std::to_string(getuid());
}

std::string KernelCache::entry_path(const std::string& key) const { return dir_ + "/kernels/" + key + ".entry"; }

KernelCache::Result KernelCache::remember(KernelBinary binary, Origin origin) {
  std::lock_guard lock(mutex_);
  const auto [it, inserted] = memory_.try_emplace(binary.key, std::move(binary));
  return {it->second, inserted ? origin : Origin::kMemory};
}

KernelCache::Result KernelCache::get(const Tactic& tactic, const Arch& arch) {
  const std::string key = kernel_key(tactic, arch);
  {
    std::lock_guard lock(mutex_);
    if (const auto it = memory_.find(key); it != memory_.end()) return {it->second, Origin::kMemory};
  }
  if (auto aot = find_ahead_of_time(key)) return remember(std::move(*aot), Origin::kAheadOfTime);

  const std::string kernels_dir = dir_ + "/kernels", path = entry_path(key);
  std::error_code ec;
  fs::create_directories(kernels_dir, ec);
  if (ec) {
    warn_once("kernel cache directory " + kernels_dir + " is not usable (" + ec.message() + "); compiling in memory");
    return remember(compile_tactic(tactic, arch), Origin::kCompiled);
  }
  std::string damage;
  if (auto entry = read_entry(path, key, &damage)) return remember(std::move(*entry), Origin::kDisk);
  if (!damage.empty()) warn_once("kernel cache entry " + path + " is damaged (" + damage + "); rebuilding it");

  const FileLock lock(dir_ + "/kernels/" + key + ".lock");
  if (!lock.held()) {
    warn_once("cannot lock entries in " + kernels_dir + " (" + lock.error() + "); compiling in memory");
    return remember(compile_tactic(tactic, arch), Origin::kCompiled);
  }
  if (auto entry = read_entry(path, key, &damage)) return remember(std::move(*entry), Origin::kDisk);  // built while we waited
  KernelBinary binary = compile_tactic(tactic, arch);
  try {
    const std::vector<uint8_t> bytes = serialize_entry(binary);
    const std::span<const uint8_t> piece(bytes);
    write_file_atomically(path, std::span(&piece, 1));
    append_compile_log(dir_, binary);
  } catch (const Error& e) {
    warn_once(std::string("cannot store a kernel in the cache (") + e.what() + "); keeping it in memory");
  }
  return remember(std::move(binary), Origin::kCompiled);
}

std::vector<KernelCache::Listing> KernelCache::list() const {
  std::vector<Listing> listing;
  std::error_code ec;
  for (const auto& file : fs::directory_iterator(dir_ + "/kernels", ec)) {
    if (file.path().extension() != ".entry") continue;
    Listing l;
    l.file = file.path().string();
    l.bytes = file.file_size(ec);
    const auto age = fs::file_time_type::clock::now() - file.last_write_time(ec);
    l.age_seconds = std::chrono::duration<double>(age).count();
    const auto bytes = read_bytes(l.file);
    if (auto b = bytes ? parse_entry(*bytes, "", &l.problem) : std::nullopt) {
      l.key = b->key;
      l.tactic = b->tactic;
      l.arch = b->arch;
      l.assembler_warnings = b->assembler_warnings;
    } else if (!bytes) {
      l.problem = "unreadable";
    }
    listing.push_back(std::move(l));
  }
  return listing;
}

size_t KernelCache::clear() const {
  size_t entries = 0;
  std::error_code ec;
  for (const auto& file : fs::directory_iterator(dir_ + "/kernels", ec)) {
    entries += file.path().extension() == ".entry";
    fs::remove(file.path(), ec);
  }
  fs::remove(dir_ + "/compile.log", ec);
  return entries;
}

KernelCache& default_kernel_cache() {
  static KernelCache cache(KernelCache::default_dir());
  return cache;
}

}  // namespace mxmoe
