// Rules of the source tree that code review would otherwise have to remember: the programs in
// tools/ use the public API (include/mxmoe/), their own files, and src/tools_internal.hpp, and no
// other library internal.
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

}  // namespace
}  // namespace mxmoe
