#include "jit/kernel_sources.hpp"

#include <cstdlib>

#include "common/read_file.hpp"
#include "common/warnings.hpp"
#include "mxmoe/error.hpp"

namespace mxmoe {

std::vector<SourceFile> read_kernel_sources(const std::string& dir) {
  std::vector<SourceFile> files;
  for (const EmbeddedSource& s : embedded_kernel_sources()) {
    const std::string path = dir + "/" + s.name;
    std::optional<std::string> text = read_file(path);
    if (!text) throw Error(std::string(kKernelSourceDirVariable) + "=" + dir + " lacks " + s.name + " (" + path + ")");
    files.push_back({s.name, std::move(*text)});
  }
  return files;
}

std::span<const EmbeddedSource> kernel_sources() {
  struct Override {
    std::vector<SourceFile> files;
    std::vector<EmbeddedSource> views;
  };
  static const Override* const from_dir = []() -> const Override* {
    const char* dir = std::getenv(kKernelSourceDirVariable);
    if (!dir || !*dir) return nullptr;
    auto* o = new Override{read_kernel_sources(dir), {}};
    for (const SourceFile& f : o->files) o->views.push_back({f.name.c_str(), f.text.c_str()});
    warn_once(std::string("compiling kernels from ") + dir + " (" + kKernelSourceDirVariable +
              "), not the library's own sources; its ahead-of-time kernels are not used");
    return o;
  }();
  if (from_dir) return from_dir->views;
  return embedded_kernel_sources();
}

}  // namespace mxmoe
