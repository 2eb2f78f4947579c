// Rules of the source tree that code review would otherwise have to remember: the programs in
// tools/ use the public API (include/mxmoe/), their own files, and src/tools_internal.hpp, and no
// other library internal; format/ and device/ sit below the kernels and include none of their
// headers (the layouts they share are format/record_layout.hpp).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <string>

namespace mxmoe {
namespace {

namespace fs = std::filesystem;

TEST(Layout, ToolsIncludeOnlyThePublicApiAndToolsInternal) {
  const fs::path root = MXMOE_SOURCE_DIR;
  const std::regex include("^#include \"([^\"]+)\"");
  int files = 0;
  for (const auto& entry : fs::recursive_directory_iterator(root / "tools")) {
    const std::string ext = entry.path().extension().string();
    if (ext != ".cpp" && ext != ".hpp" && ext != ".cu") continue;
    ++files;
    std::ifstream in(entry.path());
    int line_number = 0;
    for (std::string line; std::getline(in, line);) {
      ++line_number;
      std::smatch m;
      if (!std::regex_search(line, m, include)) continue;
      const std::string header = m[1].str();
      const bool allowed = header.rfind("mxmoe/", 0) == 0 || header == "tools_internal.hpp" ||
                           fs::exists(entry.path().parent_path() / header);
      EXPECT_TRUE(allowed) << entry.path().string() << ":" << line_number << " includes \"" << header
                           << "\"; tools reach the library's internals through src/tools_internal.hpp";
    }
  }
  EXPECT_GE(files, 10);
}

TEST(Layout, FormatAndDeviceIncludeNoKernelHeader) {
  const fs::path root = MXMOE_SOURCE_DIR;
  const std::regex include("^#include \"kernels/([^\"]+)\"");
  int files = 0;
  for (const char* dir : {"src/format", "src/device"}) {
    for (const auto& entry : fs::directory_iterator(root / dir)) {
      ++files;
      std::ifstream in(entry.path());
      int line_number = 0;
      for (std::string line; std::getline(in, line);) {
        ++line_number;
        EXPECT_FALSE(std::regex_search(line, include))
            << entry.path().string() << ":" << line_number << ": " << line << "; the kernels build on format/ and device/, not the reverse";
      }
    }
  }
  EXPECT_GE(files, 10);
}

}  // namespace
}  // namespace mxmoe
