// CPU detection against /proc/cpuinfo, the kernel-family order, and the DLLM_ISA cap's errors.
#include <gtest/gtest.h>

#include <fstream>
#include <set>
#include <sstream>

#include "jit/cpu_features.h"
#include "common/error.h"

using namespace dllm::jit;

namespace {

// The "flags" line of the first processor in /proc/cpuinfo; empty when unavailable.
std::set<std::string> proc_cpuinfo_flags() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("flags", 0) != 0) continue;
    std::set<std::string> out;
    std::istringstream ss(line.substr(line.find(':') + 1));
    std::string w;
    while (ss >> w) out.insert(w);
    return out;
  }
  return {};
}

CpuFeatures fake_avx2_only() {
  CpuFeatures f;
  f.vendor = "FakeVendor";
  f.brand = "Fake AVX2 CPU";
  f.avx = f.avx2 = f.fma = f.f16c = true;
  return f;
}

}  // namespace

TEST(CpuFeatures, MatchesProcCpuinfo) {
  const std::set<std::string> flags = proc_cpuinfo_flags();
  if (flags.empty()) GTEST_SKIP() << "no /proc/cpuinfo";
  const CpuFeatures& f = cpu_features();
  // The kernel only lists a flag when the OS enables it too, so both sides mean "usable".
  EXPECT_EQ(f.avx2, flags.count("avx2") == 1);
  EXPECT_EQ(f.fma, flags.count("fma") == 1);
  EXPECT_EQ(f.f16c, flags.count("f16c") == 1);
  EXPECT_EQ(f.avx512f, flags.count("avx512f") == 1);
  EXPECT_EQ(f.avx512bw, flags.count("avx512bw") == 1);
  EXPECT_EQ(f.avx512vl, flags.count("avx512vl") == 1);
  EXPECT_EQ(f.avx512_vnni, flags.count("avx512_vnni") == 1);
  EXPECT_EQ(f.avx512_bf16, flags.count("avx512_bf16") == 1);
  EXPECT_EQ(f.avx_vnni, flags.count("avx_vnni") == 1);
  EXPECT_EQ(f.amx_int8, flags.count("amx_int8") == 1);
  EXPECT_EQ(f.hybrid, flags.count("hybrid") == 1);
  EXPECT_GE(f.logical_cpus, 1);
  EXPECT_FALSE(f.vendor.empty());
}

TEST(CpuFeatures, FamiliesAreOrderedAndBestIsSupported) {
  const CpuFeatures& f = cpu_features();
  EXPECT_TRUE(f.supports(Isa::Portable));
  EXPECT_TRUE(f.supports(f.best()));
  const std::vector<Isa> sup = f.supported();
  ASSERT_FALSE(sup.empty());
  EXPECT_EQ(sup.front(), Isa::Portable);
  // best() is the last supported family (amx included where the OS grants the tile state).
  EXPECT_EQ(sup.back(), f.best());
  if (f.supports(Isa::Amx)) {
    EXPECT_TRUE(f.supports(Isa::Avx512Vnni));
  }
  // Each family needs what the one below needs.
  if (f.supports(Isa::Avx512Vnni) || f.supports(Isa::AvxVnni)) {
    EXPECT_TRUE(f.supports(Isa::Avx2));
  }

  const CpuFeatures fake = fake_avx2_only();
  EXPECT_EQ(fake.best(), Isa::Avx2);
  EXPECT_FALSE(fake.supports(Isa::AvxVnni));
  EXPECT_FALSE(fake.supports(Isa::Avx512Vnni));
  CpuFeatures no_f16c = fake;
  no_f16c.f16c = false;
  EXPECT_EQ(no_f16c.best(), Isa::Portable);
}

TEST(CpuFeatures, IsaNamesRoundTrip) {
  for (Isa isa : kAllIsas) {
    EXPECT_EQ(parse_isa(isa_name(isa)), isa);
    EXPECT_EQ(parse_isa(isa_short_name(isa)), isa);
  }
  EXPECT_EQ(parse_isa("avx512"), std::nullopt);
  EXPECT_EQ(parse_isa(""), std::nullopt);
}

TEST(CpuFeatures, CapSelectsLowerFamilies) {
  const CpuFeatures fake = fake_avx2_only();
  EXPECT_EQ(select_isa(fake, nullptr), Isa::Avx2);
  EXPECT_EQ(select_isa(fake, ""), Isa::Avx2);
  EXPECT_EQ(select_isa(fake, "portable"), Isa::Portable);
  EXPECT_EQ(select_isa(fake, "avx2"), Isa::Avx2);
  for (Isa isa : cpu_features().supported()) EXPECT_EQ(select_isa(cpu_features(), isa_name(isa)), isa);
}

TEST(CpuFeatures, CapRefusesMissingFamilyWithClearError) {
  const CpuFeatures fake = fake_avx2_only();
  try {
    select_isa(fake, "avx512-vnni");
    FAIL() << "expected an error";
  } catch (const dllm::Error& e) {
    EXPECT_EQ(e.exit_code(), 1);
    const std::string msg = e.what();
    EXPECT_NE(msg.find("DLLM_ISA=avx512-vnni"), std::string::npos) << msg;
    EXPECT_NE(msg.find("lacks avx512-vnni"), std::string::npos) << msg;
    EXPECT_NE(msg.find("up to avx2"), std::string::npos) << msg;
  }
  try {
    select_isa(fake, "sse9");
    FAIL() << "expected an error";
  } catch (const dllm::Error& e) {
    EXPECT_EQ(e.exit_code(), 2);
    EXPECT_NE(std::string(e.what()).find("DLLM_ISA=sse9 is not a kernel family"), std::string::npos);
  }
}

TEST(CpuFeatures, SummaryNamesChosenFamily) {
  const CpuFeatures fake = fake_avx2_only();
  const std::string s = cpu_summary(fake, Isa::Portable);
  EXPECT_NE(s.find("Fake AVX2 CPU"), std::string::npos);
  EXPECT_NE(s.find("instruction sets: avx avx2 fma f16c"), std::string::npos) << s;
  EXPECT_NE(s.find("kernel family: portable (capped by DLLM_ISA; best is avx2)"), std::string::npos) << s;
  // A CPU with AMX: amx is the default only where the OS granted the tile state, and the summary says what
  // its matrices run where.
  CpuFeatures spr = fake;
  spr.avx512f = spr.avx512bw = spr.avx512vl = spr.avx512_vnni = true;
  spr.amx_tile = spr.amx_int8 = true;
  EXPECT_EQ(spr.best(), Isa::Avx512Vnni);
  spr.amx_permitted = true;
  EXPECT_EQ(spr.best(), Isa::Amx);
  const std::string amx = cpu_summary(spr, spr.best());
  EXPECT_NE(amx.find("kernel families: portable avx2 avx512-vnni amx\n"), std::string::npos) << amx;
  EXPECT_NE(amx.find("kernel family: amx\n"), std::string::npos) << amx;
  EXPECT_NE(amx.find(std::string("amx: ") + kAmxRule + "\n"), std::string::npos) << amx;
  EXPECT_EQ(cpu_summary(spr, Isa::Avx512Vnni).find("amx: "), std::string::npos);
  const std::string real = cpu_summary(cpu_features(), cpu_features().best());
  EXPECT_NE(real.find(std::string("kernel family: ") + isa_name(cpu_features().best()) + "\n"), std::string::npos);
}
