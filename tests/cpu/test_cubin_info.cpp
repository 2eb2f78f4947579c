// The register counts read from a cubin's ELF (jit/cubin_info.hpp): for a GEMV-style and a wgmma
// tactic the same as ptxas reports in the verbose log of the same compile, and a clear error for a
// truncated or damaged cubin.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <map>
#include <regex>

#include "jit/cubin_info.hpp"
#include "jit/kernel_binary.hpp"
#include "mxmoe/error.hpp"

namespace mxmoe {
namespace {

// The registers ptxas reports for `function` in a --verbose log, 0 where it has none:
//   ptxas info    : Compiling entry function '<function>' for 'sm_90a'
//   ...
//   ptxas info    : Used 168 registers, used 1 barriers
int logged_registers(const std::string& log, const std::string& function) {
  const std::string entry = "Compiling entry function '" + function + "'";
  const size_t at = log.find(entry);
  if (at == std::string::npos) return 0;
  const size_t next = log.find("Compiling entry function '", at + entry.size());
  const std::string section = log.substr(at, next == std::string::npos ? std::string::npos : next - at);
  std::smatch m;
  return std::regex_search(section, m, std::regex(R"(Used (\d+) registers)")) ? std::stoi(m[1].str()) : 0;
}

class CubinRegistersOfATactic : public testing::TestWithParam<std::string> {};

TEST_P(CubinRegistersOfATactic, AreWhatPtxasReportsForTheSameCompile) {
  CompileRequest request = compile_request(parse_tactic(GetParam()), arch_by_name("sm_90a"));
  request.extra_options = {"--ptxas-options=--verbose"};
  const CompileResult r = compile_cuda(request);
  ASSERT_TRUE(r.ok) << r.log;
  const std::map<std::string, int> from_elf = cubin_registers(r.cubin);
  ASSERT_EQ(r.lowered_names.size(), 2u);
  ASSERT_EQ(r.registers.size(), 2u);
  for (size_t k = 0; k < 2; ++k) {
    const int logged = logged_registers(r.log, r.lowered_names[k]);
    ASSERT_GT(logged, 0) << r.log;
    ASSERT_TRUE(from_elf.contains(r.lowered_names[k])) << r.lowered_names[k];
    EXPECT_EQ(from_elf.at(r.lowered_names[k]), logged) << r.lowered_names[k];
    EXPECT_EQ(r.registers[k], logged) << r.lowered_names[k];
  }
}

INSTANTIATE_TEST_SUITE_P(GemvAndWgmma, CubinRegistersOfATactic,
                         testing::Values("gemv.r128x8.w8x1.u2.k1", "wgmma.r256x32.w8.s7.k1"),
                         [](const auto& info) {
                           std::string name = info.param;
                           std::replace(name.begin(), name.end(), '.', '_');
                           return name;
                         });

// A one-kernel cubin (extern "C": its symbol is `k`) to damage.
std::vector<uint8_t> small_cubin() {
  const CompileResult r = compile_cuda({"extern \"C\" __global__ void k(int* x) { x[threadIdx.x] += 1; }", {}, "sm_90a"});
  EXPECT_TRUE(r.ok) << r.log;
  return r.cubin;
}

// The message of the Error that reading `cubin` throws ("" where it throws none).
std::string error_reading(const std::vector<uint8_t>& cubin) {
  try {
    cubin_registers(cubin);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Where the cubin's EIATTR_REGCOUNT attribute begins (format EIFMT_SVAL, 8 bytes of value).
size_t register_count_attribute(const std::vector<uint8_t>& cubin) {
  const std::vector<uint8_t> header{0x04, 0x2f, 0x08, 0x00};
  const auto at = std::search(cubin.begin(), cubin.end(), header.begin(), header.end());
  EXPECT_NE(at, cubin.end());
  return static_cast<size_t>(at - cubin.begin());
}

TEST(CubinRegisters, ReadFromAWholeCubin) {
  const auto registers = cubin_registers(small_cubin());
  ASSERT_EQ(registers.size(), 1u);
  EXPECT_GT(registers.at("k"), 0);
  EXPECT_LE(registers.at("k"), 255);
}

TEST(CubinRegisters, ATruncatedCubinIsAnError) {
  const std::vector<uint8_t> cubin = small_cubin();
  for (const size_t size : {size_t{0}, size_t{4}, size_t{63}, size_t{64}, cubin.size() / 2, cubin.size() - 1}) {
    const std::string error = error_reading(std::vector<uint8_t>(cubin.begin(), cubin.begin() + static_cast<long>(size)));
    EXPECT_TRUE(error.starts_with("malformed cubin: ")) << size << " of " << cubin.size() << " bytes: " << error;
  }
}

TEST(CubinRegisters, ADamagedCubinIsAnErrorThatSaysWhat) {
  const std::vector<uint8_t> cubin = small_cubin();
  auto damaged = [&](const std::function<void(std::vector<uint8_t>&)>& damage) {
    std::vector<uint8_t> copy = cubin;
    damage(copy);
    return error_reading(copy);
  };
  EXPECT_NE(damaged([](auto& c) { c[1] = 'X'; }).find("not an ELF file"), std::string::npos);
  EXPECT_NE(damaged([](auto& c) { c[4] = 1; }).find("not a little-endian ELF64"), std::string::npos);
  EXPECT_NE(damaged([](auto& c) { c[0x12] = 62; }).find("not CUDA's"), std::string::npos);
  EXPECT_NE(damaged([](auto& c) { c[0x2f] = 0x7f; }).find("section header"), std::string::npos);  // e_shoff
  const size_t attribute = register_count_attribute(cubin);
  EXPECT_NE(damaged([&](auto& c) { std::fill_n(c.begin() + attribute + 4, 4, 0xff); }).find("symbol 4294967295 of"),
            std::string::npos);
  EXPECT_NE(damaged([&](auto& c) { c[attribute + 2] = c[attribute + 3] = 0xff; }).find("runs past the end"),
            std::string::npos);
  EXPECT_NE(damaged([&](auto& c) { c[attribute + 2] = 4; }).find("a register count of an unknown form"),
            std::string::npos);
}

}  // namespace
}  // namespace mxmoe
