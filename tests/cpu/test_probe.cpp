// The PTX probe against the installed NVRTC: every probe assembles for some target, the facts the
// kernels' target choice rests on hold (docs/arch-targets.md), and `mxmoe probe` reports like the
// other commands.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "common/parallel.hpp"
#include "probe/ptx_probe.hpp"
#include "mxmoe/error.hpp"
#include "test_support.hpp"

namespace mxmoe {
namespace {

const std::vector<std::string> kTargets = {"sm_90a", "sm_100a", "sm_100f", "sm_120a", "sm_120f", "sm_121a", "sm_121f"};

// Outcomes compiled on first use and kept for the process. ctest runs each test in a process of its
// own, so each test compiles only the cells it looks at, spread over the cores.
class Outcomes {
 public:
  static Outcomes& get() {
    static Outcomes outcomes;
    return outcomes;
  }
  void compile(const std::vector<std::string>& probes, const std::vector<std::string>& targets) {
    std::vector<Key> missing;
    for (const auto& p : probes) {
      for (const auto& t : targets) {
        if (!cells_.count({p, t})) missing.push_back({p, t});
      }
    }
    std::vector<ProbeOutcome> outcomes(missing.size());
    parallel_for(missing.size(), 0, [&](size_t i) {
      outcomes[i] = run_probe(ptx_probe_by_name(missing[i].first), missing[i].second);
    });
    for (size_t i = 0; i < missing.size(); ++i) cells_[missing[i]] = outcomes[i];
  }
  const ProbeOutcome& at(std::string_view probe, const std::string& target) {
    compile({std::string(probe)}, {target});
    return cells_.at({std::string(probe), target});
  }
  bool accepted(std::string_view probe, const std::string& target) { return at(probe, target).accepted; }

 private:
  using Key = std::pair<std::string, std::string>;
  std::map<Key, ProbeOutcome> cells_;
};

std::vector<std::string> all_probes() {
  std::vector<std::string> names;
  for (const auto& p : ptx_probes()) names.emplace_back(p.name);
  return names;
}

std::vector<std::string> probes_of_group(std::string_view group) {
  std::vector<std::string> names;
  for (const auto& p : ptx_probes()) {
    if (p.group == group) names.emplace_back(p.name);
  }
  return names;
}

TEST(Probe, TableIsWellFormed) {
  std::set<std::string_view> names;
  for (const auto& p : ptx_probes()) {
    EXPECT_TRUE(names.insert(p.name).second) << "duplicate probe " << p.name;
    EXPECT_FALSE(p.group.empty()) << p.name;
    EXPECT_FALSE(p.needs.empty()) << p.name;
    EXPECT_NE(p.source.find("extern \"C\" __global__"), std::string_view::npos) << p.name;
    EXPECT_NE(p.source.find("asm volatile("), std::string_view::npos) << p.name;
    EXPECT_EQ(p.source.find('$'), std::string_view::npos) << p.name << ": placeholder left in the source";
  }
  EXPECT_THROW(ptx_probe_by_name("mma.nonexistent"), Error);
}

// A probe no target accepts is a broken snippet, not a finding; one arch-specific target of each
// generation covers the table.
TEST(Probe, EveryProbeIsAcceptedBySomeTarget) {
  Outcomes& m = Outcomes::get();
  const std::vector<std::string> generations = {"sm_90a", "sm_100a", "sm_120a"};
  m.compile(all_probes(), generations);
  for (const auto& p : ptx_probes()) {
    const bool any =
        std::any_of(generations.begin(), generations.end(), [&](const auto& t) { return m.accepted(p.name, t); });
    EXPECT_TRUE(any) << p.name << " is rejected everywhere, e.g. on sm_120a: " << m.at(p.name, "sm_120a").message;
    for (const auto& t : generations) {
      const ProbeOutcome& o = m.at(p.name, t);
      EXPECT_EQ(o.accepted, o.message.empty()) << p.name << " @ " << t << ": " << o.message;
    }
  }
}

TEST(Probe, HopperAndBlackwellFacts) {
  Outcomes& m = Outcomes::get();
  m.compile({"mma.m16n8k16.bf16", "cp.async.cg.16", "wgmma.m64n16k16.bf16"}, {"sm_90a", "sm_100a", "sm_120a"});
  m.compile(probes_of_group("tcgen05"), {"sm_90a", "sm_100a", "sm_120a"});
  for (const char* target : {"sm_90a", "sm_120a"}) {
    EXPECT_TRUE(m.accepted("mma.m16n8k16.bf16", target)) << target;
    EXPECT_TRUE(m.accepted("cp.async.cg.16", target)) << target;
  }
  EXPECT_TRUE(m.accepted("wgmma.m64n16k16.bf16", "sm_90a"));
  EXPECT_FALSE(m.accepted("wgmma.m64n16k16.bf16", "sm_120a"));
  EXPECT_FALSE(m.accepted("wgmma.m64n16k16.bf16", "sm_100a"));
  for (const auto& name : probes_of_group("tcgen05")) {
    EXPECT_TRUE(m.accepted(name, "sm_100a")) << name << ": " << m.at(name, "sm_100a").message;
    EXPECT_FALSE(m.accepted(name, "sm_90a")) << name;
    EXPECT_FALSE(m.accepted(name, "sm_120a")) << name;
  }
}

// setmaxnreg is not Hopper-only: NVRTC 13.0 assembles it for every arch- and family-specific target
// from sm_90a on (as the PTX ISA lists), and refuses it only where neither suffix is given.
TEST(Probe, SetmaxnregNeedsAnArchOrFamilyTarget) {
  Outcomes& m = Outcomes::get();
  m.compile(probes_of_group("setmaxnreg"), kTargets);
  for (const auto& name : probes_of_group("setmaxnreg")) {
    for (const auto& target : kTargets) EXPECT_TRUE(m.accepted(name, target)) << name << " @ " << target;
    const ProbeOutcome plain = run_probe(ptx_probe_by_name(name), "sm_90");
    EXPECT_FALSE(plain.accepted) << name;
    EXPECT_NE(plain.message.find("sm_90"), std::string::npos) << plain.message;
  }
}

TEST(Probe, RejectionsSayWhy) {
  Outcomes& m = Outcomes::get();
  const std::string& message = m.at("wgmma.m64n16k16.bf16", "sm_120a").message;
  EXPECT_NE(message.find("wgmma"), std::string::npos) << message;
  EXPECT_NE(message.find("sm_120a"), std::string::npos) << message;
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;

  const ProbeOutcome unknown = run_probe(ptx_probes()[0], "sm_999");
  EXPECT_FALSE(unknown.accepted);
  EXPECT_FALSE(unknown.message.empty());
}

// The warp-level block-scaled MMA and the FP4 ldmatrix are sm_12x instructions that the family
// targets accept exactly as the arch-specific ones do (the opposite of what older toolchains were
// reported to do), and that sm_100 does not have at all: its block-scaled MMA is tcgen05.
TEST(Probe, BlockScaledMmaOnSm12xFamilyAndArchTargetsAlike) {
  Outcomes& m = Outcomes::get();
  std::vector<std::string> sm12x_only = probes_of_group("mma.block_scale");
  ASSERT_GE(sm12x_only.size(), 4u);
  sm12x_only.push_back("mma.f8f6f4.m16n8k32.e2m1");
  m.compile(sm12x_only, kTargets);
  m.compile(probes_of_group("ldmatrix"), kTargets);
  for (const auto& name : sm12x_only) {
    for (const char* target : {"sm_120a", "sm_120f", "sm_121a", "sm_121f"}) {
      EXPECT_TRUE(m.accepted(name, target)) << name << " @ " << target << ": " << m.at(name, target).message;
    }
    for (const char* target : {"sm_90a", "sm_100a", "sm_100f"}) EXPECT_FALSE(m.accepted(name, target)) << name;
  }
  for (const char* name : {"ldmatrix.m8n16.x4.b8x16.b4x16_p64", "ldmatrix.m16n16.x1.trans.b8x16.b4x16_p64"}) {
    for (const char* target : {"sm_100a", "sm_100f", "sm_120a", "sm_120f", "sm_121a", "sm_121f"}) {
      EXPECT_TRUE(m.accepted(name, target)) << name << " @ " << target << ": " << m.at(name, target).message;
    }
    EXPECT_FALSE(m.accepted(name, "sm_90a")) << name;
  }
  EXPECT_TRUE(m.accepted("tcgen05.mma.mxf4.block_scale.block32", "sm_100f"));
}

// docs/arch-targets.md picks the family targets because, for every instruction mxmoe may use, the
// family target accepts what the arch-specific one does; a toolchain where that stops holding must
// send us back to the table.
TEST(Probe, FamilyTargetsAcceptWhatArchTargetsAccept) {
  Outcomes& m = Outcomes::get();
  m.compile(all_probes(), {"sm_100a", "sm_100f", "sm_120a", "sm_120f", "sm_121a", "sm_121f"});
  const std::pair<const char*, const char*> pairs[] = {
      {"sm_100a", "sm_100f"}, {"sm_120a", "sm_120f"}, {"sm_121a", "sm_121f"}};
  for (const auto& p : ptx_probes()) {
    for (const auto& [arch, family] : pairs) {
      EXPECT_EQ(m.accepted(p.name, arch), m.accepted(p.name, family))
          << p.name << ": " << arch << " says '" << m.at(p.name, arch).message << "', " << family << " says '"
          << m.at(p.name, family).message << "'";
    }
  }
}

TEST(Probe, CommandLine) {
  const auto help = test::run_cli("probe --help");
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_NE(help.out.find("--target LIST"), std::string::npos) << help.out;

  const auto one = test::run_cli("probe --target sm_120f");
  ASSERT_EQ(one.exit_code, 0) << one.err;
  EXPECT_NE(one.out.find("sm_120f"), std::string::npos) << one.out;
  EXPECT_NE(one.out.find("wgmma.m64n16k16.bf16 @ sm_120f: "), std::string::npos) << one.out;
  for (const auto& p : ptx_probes()) EXPECT_NE(one.out.find(std::string(p.name) + " "), std::string::npos) << p.name;

  for (const char* args : {"probe --target sm_999", "probe --arch sm_80", "probe --target sm_120f,", "probe --bogus"}) {
    const auto r = test::run_cli(args);
    EXPECT_EQ(r.exit_code, 2) << args << ": " << r.err;
    EXPECT_EQ(r.err.rfind("mxmoe: error: ", 0), 0u) << args << ": " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << args << ": " << r.err;
  }
}

}  // namespace
}  // namespace mxmoe
