// The kernel cache: keys, the entry format and its damage checks, cold compile then warm load,
// the ahead-of-time set (and building it twice in a row in one process and in parallel processes),
// rebuilding damaged entries, read-only and unusable directories, and many processes prewarming one
// empty cache at once.
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>

#include "common/parallel.hpp"
#include "jit/aot.hpp"
#include "jit/kernel_cache.hpp"
#include "jit/kernel_sources.hpp"
#include "kernels/family_registry.hpp"
#include "tactics/heuristic.hpp"
#include "test_support.hpp"

namespace mxmoe {
namespace {

namespace fs = std::filesystem;

// A valid tactic outside the ahead-of-time set, so that the cache (not the library) must supply it.
const Tactic kNotBuiltIn = parse_tactic("gemv.r64x8.w4x1.u8.k1");
const Arch& sm90() { return arch_by_name("sm_90a"); }

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(KernelKey, CoversTheBinaryAndNotTheLaunch) {
  Tactic split = kNotBuiltIn;
  split.k_split = 3;
  EXPECT_EQ(kernel_key(kNotBuiltIn, sm90()), kernel_key(split, sm90()));
  EXPECT_NE(kernel_key(kNotBuiltIn, sm90()), kernel_key(kNotBuiltIn, arch_by_name("sm_120a")));
  EXPECT_NE(kernel_key(kNotBuiltIn, sm90()), kernel_key(parse_tactic("gemv.r64x8.w4x1.u4.k1"), sm90()));
  EXPECT_EQ(kernel_key(kNotBuiltIn, sm90()).size(), 32u);
}

TEST(KernelEntry, RoundTripAndEveryDamageIsCaught) {
  KernelBinary b;
  b.key = "0123456789abcdef0123456789abcdef";
  b.tactic = "gemv.r64x8.w4x1.u8.k1";
  b.arch = "sm_90a";
  b.kernel_names = {"fc1_kernel", "fc2_kernel"};
  b.cubin = std::make_shared<const std::vector<uint8_t>>(std::vector<uint8_t>{1, 2, 3, 4, 5, 6, 7, 8});
  b.assembler_warnings = {"FC2: Registers are spilled to local memory, 8 bytes spill stores, 8 bytes spill loads"};
  b.registers = {168, 80};
  const auto bytes = serialize_entry(b);
  std::string problem;
  const auto back = parse_entry(bytes, b.key, &problem);
  ASSERT_TRUE(back) << problem;
  EXPECT_EQ(*back->cubin, *b.cubin);
  EXPECT_EQ(back->kernel_names, b.kernel_names);
  EXPECT_EQ(back->assembler_warnings, b.assembler_warnings);
  EXPECT_EQ(back->registers, b.registers);

  auto damaged = bytes;
  damaged.back() ^= 1;
  EXPECT_FALSE(parse_entry(damaged, b.key, &problem));
  EXPECT_NE(problem.find("checksum"), std::string::npos) << problem;
  EXPECT_FALSE(parse_entry(std::span(bytes).first(bytes.size() - 1), b.key, &problem));
  EXPECT_FALSE(parse_entry(std::span(bytes).first(20), b.key, &problem));
  EXPECT_FALSE(parse_entry(bytes, "ffffffffffffffffffffffffffffffff", &problem));
  EXPECT_FALSE(parse_entry(std::vector<uint8_t>{'M', 'X'}, b.key, &problem));
}

// The three forms ptxas prints (as NVRTC 13.0's log has them), and a line that is no warning.
TEST(AssemblerWarnings, ParsedFromTheLog) {
  const std::string log =
      "ptxas info    : (C7512) Potential Performance Loss: wgmma.mma_async instructions are serialized due to "
      "insufficient register resources for the function '_Z2k1v'\n"
      "ptxas info    : (C7511) Potential Performance Loss: wgmma.mma_async instructions are serialized due to "
      "insufficient register resources for the wgmma pipeline in the function '_Z2k2v'\n"
      "ptxas warning : Registers are spilled to local memory in function '_Z2k2v', 16 bytes spill stores, 24 bytes "
      "spill loads\n"
      "ptxas info    : Used 168 registers, used 1 barriers\n";
  const auto warnings = assembler_warnings(log);
  ASSERT_EQ(warnings.size(), 3u);
  EXPECT_EQ(warnings[0].function, "_Z2k1v");
  EXPECT_EQ(warnings[0].message,
            "(C7512) wgmma.mma_async instructions are serialized due to insufficient register resources");
  EXPECT_EQ(warnings[1].function, "_Z2k2v");
  EXPECT_EQ(warnings[1].message,
            "(C7511) wgmma.mma_async instructions are serialized due to insufficient register resources for the "
            "wgmma pipeline");
  EXPECT_EQ(warnings[2].message, "Registers are spilled to local memory, 16 bytes spill stores, 24 bytes spill loads");
  EXPECT_TRUE(assembler_warnings("ptxas info    : Used 168 registers\n").empty());
  EXPECT_EQ(spill_store_bytes(warnings[2].message), 16);
  EXPECT_EQ(spill_store_bytes(warnings[0].message), 0);
  EXPECT_TRUE(serialises_mma(warnings[0].message));
  EXPECT_FALSE(serialises_mma(warnings[2].message));
  // A form the parser does not know is kept whole; a log without a last newline ends its last line.
  const auto unknown = assembler_warnings("ptxas warning : Registers are spilled to local memory somewhere");
  ASSERT_EQ(unknown.size(), 1u);
  EXPECT_EQ(unknown[0].function, "");
  EXPECT_EQ(unknown[0].message, "ptxas warning : Registers are spilled to local memory somewhere");
}

// The check can fail: a wgmma tile of 160 accumulators a thread, one step past the family's budget
// (expert_wgmma_family.cpp), which the family refuses and ptxas serialises.
TEST(AssemblerWarnings, AnOverBudgetWgmmaTileIsCaught) {
  const CompileResult r = compile_cuda({"#include \"kernels/expert_wgmma.cuh\"\n",
                                        {"&mxmoe::kernels::expert_wgmma_kernel<256, 160, 8, 6, true>"},
                                        "sm_90a"});
  ASSERT_TRUE(r.ok) << r.log;
  EXPECT_EQ(r.registers, std::vector<int>{168});  // 65536 / 384 threads, in steps of 8
  ASSERT_FALSE(r.warnings.empty()) << r.log;
  EXPECT_EQ(r.warnings.front().function, r.lowered_names.at(0));
  EXPECT_NE(r.warnings.front().message.find("serialized"), std::string::npos) << r.warnings.front().message;
}

TEST(KernelCache, ColdCompileThenWarmLoad) {
  const fs::path dir = test::scratch_dir();
  KernelCache cold(dir.string());
  const auto first = cold.get(kNotBuiltIn, sm90());
  EXPECT_EQ(first.origin, KernelCache::Origin::kCompiled);
  EXPECT_EQ(cold.get(kNotBuiltIn, sm90()).origin, KernelCache::Origin::kMemory);
  KernelCache warm(dir.string());  // a new process, as far as the cache can tell
  const auto second = warm.get(kNotBuiltIn, sm90());
  EXPECT_EQ(second.origin, KernelCache::Origin::kDisk);
  EXPECT_EQ(*second.binary.cubin, *first.binary.cubin);
  EXPECT_EQ(second.binary.kernel_names, first.binary.kernel_names);
  const auto listing = warm.list();
  ASSERT_EQ(listing.size(), 1u);
  EXPECT_EQ(listing[0].tactic, "gemv.r64x8.w4x1.u8.k1");
  EXPECT_TRUE(listing[0].problem.empty());
  const std::string log = read_text(dir / "compile.log");
  EXPECT_EQ(std::count(log.begin(), log.end(), '\n'), 1);
}

// Every default tactic of every arch the library's ahead-of-time set was built for (MXMOE_AOT_ARCHS)
// comes from the library, with no compile.
TEST(KernelCache, DefaultTacticsComeFromTheLibrary) {
  const std::string built = "," MXMOE_AOT_ARCHS_BUILT ",";
  if (built == ",,") GTEST_SKIP() << "built with an empty MXMOE_AOT_ARCHS: the library holds no ahead-of-time set";
  ASSERT_GT(ahead_of_time_entries(), 0u);
  const fs::path dir = test::scratch_dir();
  KernelCache cache(dir.string());
  int archs = 0;
  for (const auto& arch : supported_archs()) {
    if (built.find("," + std::string(arch.name) + ",") == std::string::npos) continue;
    ++archs;
    for (const Tactic& t : default_tactics()) {
      if (!t.family->why_invalid(t, arch).empty()) continue;  // not built for an arch it cannot run on
      EXPECT_EQ(cache.get(t, arch).origin, KernelCache::Origin::kAheadOfTime) << arch.name << " " << t.name();
    }
  }
  EXPECT_GT(archs, 0) << "no supported arch in MXMOE_AOT_ARCHS = " MXMOE_AOT_ARCHS_BUILT;
  EXPECT_FALSE(fs::exists(dir / "compile.log"));
}

// A small ahead-of-time set: a GEMV-style tactic whose FC1 spills a word (a warning from the log)
// and a wgmma tactic (whose register counts its family checks against its launch).
const std::vector<std::string> kSmallSet = {"gemv.r128x8.w8x1.u2.k1", "wgmma.r256x32.w8.s7.k1"};

// Each round of compiles gives the same binaries, and in each the same nonzero register counts
// and the same assembler warnings, as `reference`.
void expect_same_binaries(const std::vector<KernelBinary>& binaries, const std::vector<KernelBinary>& reference) {
  ASSERT_EQ(binaries.size(), reference.size());
  for (size_t i = 0; i < binaries.size(); ++i) {
    const KernelBinary& b = binaries[i];
    SCOPED_TRACE(b.tactic);
    EXPECT_EQ(b.key, reference[i].key);
    EXPECT_EQ(*b.cubin, *reference[i].cubin);
    ASSERT_EQ(b.registers.size(), 2u);
    EXPECT_GT(b.registers[0], 0);
    EXPECT_GT(b.registers[1], 0);
    EXPECT_EQ(b.registers, reference[i].registers);
    EXPECT_EQ(b.assembler_warnings, reference[i].assembler_warnings);
  }
}

// One process compiling the set twice in a row, each round on two threads: the second round (which
// a compiler cache of NVRTC's would serve without running ptxas) gives the same counts and warnings.
TEST(AheadOfTimeSet, CompilesTwiceInARowInOneProcess) {
  std::vector<KernelBinary> rounds[2];
  for (auto& round : rounds) {
    round.resize(kSmallSet.size());
    parallel_for(kSmallSet.size(), 2, [&](size_t i) { round[i] = compile_tactic(parse_tactic(kSmallSet[i]), sm90()); });
  }
  EXPECT_FALSE(rounds[0][0].assembler_warnings.empty()) << "the GEMV tactic's FC1 no longer spills";
  expect_same_binaries(rounds[0], rounds[0]);
  expect_same_binaries(rounds[1], rounds[0]);
}

// The entries of a set the generator wrote into `dir`, read through its index (aot_index.cpp) as
// the library reads its own.
std::vector<KernelBinary> generated_entries(const fs::path& dir) {
  const std::string index = read_text(dir / "aot_index.cpp");
  const std::string blob = read_text(dir / "aot_blob.bin");
  const std::regex line(R"re(\{"([0-9a-f]{32})", (\d+), (\d+)\})re");
  std::vector<KernelBinary> entries;
  for (auto it = std::sregex_iterator(index.begin(), index.end(), line); it != std::sregex_iterator(); ++it) {
    const size_t offset = std::stoull((*it)[2].str()), bytes = std::stoull((*it)[3].str());
    EXPECT_LE(offset + bytes, blob.size());
    std::string problem;
    const auto entry = parse_entry({reinterpret_cast<const uint8_t*>(blob.data()) + offset, bytes}, (*it)[1].str(), &problem);
    EXPECT_TRUE(entry) << problem;
    if (entry) entries.push_back(*entry);
  }
  return entries;
}

// The generator as the build runs it, on the small set: two processes into two directories at
// once, then one more; each succeeds and writes the same binaries with the same register counts.
TEST(AheadOfTimeSet, BuildsInParallelProcessesAndAgain) {
  const fs::path dir = test::scratch_dir();
  std::string only;
  for (const std::string& t : kSmallSet) only += (only.empty() ? "" : ",") + t;
  auto generate = [&](const std::string& name) {
    return "(" + std::string(MXMOE_AOT_GEN) + " --only " + only + " " + (dir / name).string() + " sm_90a > " +
           (dir / (name + ".out")).string() + " 2>&1; echo $? > " + (dir / (name + ".rc")).string() + ")";
  };
  ASSERT_EQ(std::system((generate("a") + " & " + generate("b") + " & wait").c_str()), 0);
  ASSERT_EQ(std::system(generate("again").c_str()), 0);
  const std::vector<KernelBinary> reference = generated_entries(dir / "a");
  ASSERT_EQ(reference.size(), kSmallSet.size()) << read_text(dir / "a.out");
  for (const std::string name : {"a", "b", "again"}) {
    SCOPED_TRACE(name);
    EXPECT_EQ(read_text(dir / (name + ".rc")), "0\n") << read_text(dir / (name + ".out"));
    expect_same_binaries(generated_entries(dir / name), reference);
  }
  const auto rejected = std::system((std::string(MXMOE_AOT_GEN) + " --only gemv.no.such " + (dir / "c").string() +
                                     " sm_90a > " + (dir / "c.out").string() + " 2>&1").c_str());
  EXPECT_NE(rejected, 0);
  EXPECT_NE(read_text(dir / "c.out").find("--only gemv.no.such: not in the set"), std::string::npos)
      << read_text(dir / "c.out");
}

void damage_and_expect_rebuild(const std::function<void(const fs::path&)>& damage) {
  const fs::path dir = test::scratch_dir();
  KernelCache(dir.string()).get(kNotBuiltIn, sm90());
  const fs::path entry = dir / "kernels" / (kernel_key(kNotBuiltIn, sm90()) + ".entry");
  ASSERT_TRUE(fs::exists(entry));
  damage(entry);
  testing::internal::CaptureStderr();
  KernelCache cache(dir.string());
  EXPECT_EQ(cache.get(kNotBuiltIn, sm90()).origin, KernelCache::Origin::kCompiled);
  const std::string warnings = testing::internal::GetCapturedStderr();
  EXPECT_NE(warnings.find("mxmoe: warning: kernel cache entry " + entry.string() + " is damaged"), std::string::npos)
      << warnings;
  EXPECT_EQ(std::count(warnings.begin(), warnings.end(), '\n'), 1) << warnings;
  EXPECT_TRUE(KernelCache(dir.string()).list().front().problem.empty()) << "the rebuilt entry is whole";
}

TEST(KernelCache, FlippedByteIsRebuilt) {
  damage_and_expect_rebuild([](const fs::path& entry) {
    std::string bytes = read_text(entry);
    bytes[bytes.size() - 100] ^= 0x40;
    test::write_file(entry, bytes);
  });
}

TEST(KernelCache, TruncatedEntryIsRebuilt) {
  damage_and_expect_rebuild([](const fs::path& entry) { fs::resize_file(entry, fs::file_size(entry) / 2); });
}

// Makes `dir` unwritable even for root (a read-only bind mount, else the immutable attribute, else
// plain permissions); false when none is available here.
bool make_read_only(const fs::path& dir) {
  if (geteuid() != 0) return chmod(dir.c_str(), 0555) == 0;
  if (mount(dir.c_str(), dir.c_str(), nullptr, MS_BIND, nullptr) == 0 &&
      mount(nullptr, dir.c_str(), nullptr, MS_BIND | MS_REMOUNT | MS_RDONLY, nullptr) == 0) {
    return true;
  }
  umount(dir.c_str());
  return std::system(("chattr +i " + dir.string() + " 2>/dev/null").c_str()) == 0;
}

void undo_read_only(const fs::path& dir) {
  umount(dir.c_str());
  std::system(("chattr -i " + dir.string() + " 2>/dev/null").c_str());
  chmod(dir.c_str(), 0755);
}

TEST(KernelCache, ReadOnlyDirectoryStillWorks) {
  const fs::path dir = test::scratch_dir();
  const Tactic other = parse_tactic("gemv.r32x8.w2x1.u8.k1");
  KernelCache(dir.string()).get(other, sm90());  // one entry made while writable
  if (!make_read_only(dir / "kernels")) GTEST_SKIP() << "cannot make a read-only directory on this machine";
  testing::internal::CaptureStderr();
  KernelCache cache(dir.string());
  const auto compiled = cache.get(kNotBuiltIn, sm90());
  const auto stored = cache.get(other, sm90());
  const std::string warnings = testing::internal::GetCapturedStderr();
  undo_read_only(dir / "kernels");
  EXPECT_EQ(compiled.origin, KernelCache::Origin::kCompiled);
  EXPECT_FALSE(compiled.binary.cubin->empty());
  EXPECT_EQ(stored.origin, KernelCache::Origin::kDisk) << "entries already there are still read";
  EXPECT_NE(warnings.find("compiling in memory"), std::string::npos) << warnings;
  EXPECT_FALSE(fs::exists(dir / "kernels" / (kernel_key(kNotBuiltIn, sm90()) + ".entry")));
}

TEST(KernelCache, UnusableDirectoryCompilesInMemory) {
  const fs::path file = test::scratch_dir() / "not-a-directory";
  test::write_file(file, "x");
  testing::internal::CaptureStderr();
  KernelCache cache(file.string());
  EXPECT_EQ(cache.get(kNotBuiltIn, sm90()).origin, KernelCache::Origin::kCompiled);
  const std::string warnings = testing::internal::GetCapturedStderr();
  EXPECT_NE(warnings.find("is not usable"), std::string::npos) << warnings;
}

TEST(KernelCache, EightProcessesPrewarmingOneEmptyCacheCompileEachEntryOnce) {
  const fs::path dir = test::scratch_dir();
  const fs::path cache = dir / "cache";
  std::string script;
  for (int i = 0; i < 8; ++i) {
    const std::string n = std::to_string(i);
    script += "(" + std::string(MXMOE_CLI) + " cache prewarm --arch sm_90a --cache-dir " + cache.string() + " > " +
              (dir / ("out" + n)).string() + " 2>&1; echo $? > " + (dir / ("rc" + n)).string() + ") & ";
  }
  script += "wait";
  ASSERT_EQ(std::system(script.c_str()), 0);
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(read_text(dir / ("rc" + std::to_string(i))), "0\n") << read_text(dir / ("out" + std::to_string(i)));
  }
  // Each tactic the library lacks was compiled exactly once, by whichever process got its lock.
  std::map<std::string, int> compiles;
  std::istringstream log(read_text(cache / "compile.log"));
  for (std::string line; std::getline(log, line);) ++compiles[line.substr(line.find(' ') + 1, 32)];
  const size_t lacking = valid_tactics("sm_90a").size() - default_tactics().size();
  EXPECT_EQ(compiles.size(), lacking);
  for (const auto& [key, n] : compiles) EXPECT_EQ(n, 1) << key;
  const auto entries = KernelCache(cache.string()).list();
  EXPECT_EQ(entries.size(), lacking);
  for (const auto& e : entries) EXPECT_TRUE(e.problem.empty()) << e.file << ": " << e.problem;
}

// A copy of the embedded kernel sources under `dir`, laid out as src/.
void write_kernel_sources(const fs::path& dir) {
  for (const EmbeddedSource& s : embedded_kernel_sources()) {
    fs::create_directories((dir / s.name).parent_path());
    test::write_file(dir / s.name, s.text);
  }
}

TEST(KernelSources, ReadFromADirectoryUnderTheEmbeddedNames) {
  const fs::path dir = test::scratch_dir() / "src";
  write_kernel_sources(dir);
  const std::string edited = "kernels/expert_gemv.cuh";
  test::write_file(dir / edited, "// edited\n");
  const auto files = read_kernel_sources(dir.string());
  ASSERT_EQ(files.size(), embedded_kernel_sources().size());
  for (size_t i = 0; i < files.size(); ++i) {
    const EmbeddedSource& s = embedded_kernel_sources()[i];
    EXPECT_EQ(files[i].name, s.name);
    EXPECT_EQ(files[i].text, s.name == edited ? "// edited\n" : std::string(s.text)) << s.name;
  }
  fs::remove(dir / "route/route_buffers.hpp");
  try {
    read_kernel_sources(dir.string());
    ADD_FAILURE() << "a missing source was not reported";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("lacks route/route_buffers.hpp"), std::string::npos) << e.what();
  }
}

// --default-set: prewarm goes through the heuristic's tactics of the family and no other.
TEST(KernelCacheCommand, DefaultSetPrewarmsTheHeuristicsTacticsOnly) {
  const fs::path base = test::scratch_dir();
  const auto prewarm = test::run_cli("cache prewarm --arch sm_90a --family sk --default-set --cache-dir " + base.string());
  ASSERT_EQ(prewarm.exit_code, 0) << prewarm.err;
  std::set<std::string> expected, listed;
  const std::vector<Tactic> defaults = default_tactics();
  for (const Tactic& t : valid_tactics("sm_90a")) {
    if (t.family == &gemv_streamk_family() && std::find(defaults.begin(), defaults.end(), t) != defaults.end()) expected.insert(t.name());
  }
  std::istringstream lines(prewarm.out);
  for (std::string arch, tactic; lines >> arch >> tactic && arch == "sm_90a";) {
    listed.insert(tactic);
    lines.ignore(1 << 20, '\n');
  }
  ASSERT_FALSE(expected.empty());
  EXPECT_EQ(listed, expected) << prewarm.out;
}

// Through the command, as on a GPU machine: the kernels compile from the directory (a broken
// header fails the compile), the ahead-of-time set is not used for them, and a directory that
// lacks a source is one error line.
TEST(KernelSources, TheCommandCompilesFromMxmoeKernelSourceDir) {
  const fs::path base = test::scratch_dir();
  const fs::path sources = base / "src";
  write_kernel_sources(sources);
  const std::string header = (sources / "kernels/expert_gemv_streamk.cuh").string();
  std::ofstream(header, std::ios::app) << "// an experiment\n";
  setenv(kKernelSourceDirVariable, sources.c_str(), 1);
  const auto prewarm = test::run_cli("cache prewarm --arch sm_90a --family sk --cache-dir " + (base / "a").string());
  EXPECT_EQ(prewarm.exit_code, 0) << prewarm.err;
  EXPECT_NE(prewarm.err.find("compiling kernels from " + sources.string()), std::string::npos) << prewarm.err;
  EXPECT_EQ(prewarm.out.find("built in"), std::string::npos) << "the ahead-of-time kernels were used:\n" << prewarm.out;

  std::ofstream(header, std::ios::app) << "#error an experiment that does not compile\n";
  const auto broken = test::run_cli("cache prewarm --arch sm_90a --family sk --cache-dir " + (base / "b").string());
  EXPECT_EQ(broken.exit_code, 1) << broken.out;
  EXPECT_NE(broken.err.find("an experiment that does not compile"), std::string::npos) << broken.err;

  setenv(kKernelSourceDirVariable, (base / "empty").c_str(), 1);
  const auto missing = test::run_cli("cache prewarm --arch sm_90a --family sk --cache-dir " + (base / "c").string());
  unsetenv(kKernelSourceDirVariable);
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_NE(missing.err.find("lacks "), std::string::npos) << missing.err;
}

}  // namespace
}  // namespace mxmoe
