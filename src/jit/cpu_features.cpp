// CPU detection with cpuid/xgetbv, the DLLM_ISA cap, and the summary `doctor` prints.
#include "jit/cpu_features.h"

#include <cpuid.h>
#include <pthread.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "common/error.h"

namespace dllm::jit {

namespace {

struct Regs {
  uint32_t a = 0, b = 0, c = 0, d = 0;
};

Regs cpuid(uint32_t leaf, uint32_t sub = 0) {
  Regs r;
  __cpuid_count(leaf, sub, r.a, r.b, r.c, r.d);
  return r;
}

uint64_t xgetbv0() {
  uint32_t lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (static_cast<uint64_t>(hi) << 32) | lo;
}

bool bit(uint32_t v, int n) { return (v >> n) & 1u; }

// Core type of the CPU the calling thread runs on (leaf 0x1A EAX[31:24]): 0x40 Core, 0x20 Atom.
uint32_t core_type_here() { return cpuid(0x1A).a >> 24; }

// Counts performance / efficiency cores among the CPUs this process may use, by briefly pinning a thread
// to each one and asking cpuid there.
void count_hybrid_cores(CpuFeatures& f) {
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0) return;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (!CPU_ISSET(cpu, &allowed)) continue;
    uint32_t type = 0;
    std::thread t([&] {
      cpu_set_t one;
      CPU_ZERO(&one);
      CPU_SET(cpu, &one);
      if (pthread_setaffinity_np(pthread_self(), sizeof(one), &one) == 0) type = core_type_here();
    });
    t.join();
    if (type == 0x40) ++f.performance_cores;
    if (type == 0x20) ++f.efficiency_cores;
  }
}

}  // namespace

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::Portable: return "portable";
    case Isa::Avx2: return "avx2";
    case Isa::AvxVnni: return "avx-vnni";
    case Isa::Avx512Vnni: return "avx512-vnni";
    case Isa::Amx: return "amx";
  }
  return "?";
}

const char* isa_short_name(Isa isa) {
  switch (isa) {
    case Isa::Portable: return "ref";
    case Isa::Avx2: return "avx2";
    case Isa::AvxVnni: return "avxvnni";
    case Isa::Avx512Vnni: return "avx512vnni";
    case Isa::Amx: return "amx";
  }
  return "?";
}

std::optional<Isa> parse_isa(std::string_view s) {
  for (Isa isa : kAllIsas)
    if (s == isa_name(isa) || s == isa_short_name(isa)) return isa;
  return std::nullopt;
}

bool CpuFeatures::supports(Isa isa) const {
  switch (isa) {
    case Isa::Portable: return true;
    case Isa::Avx2: return avx2 && fma && f16c;
    case Isa::AvxVnni: return supports(Isa::Avx2) && avx_vnni;
    case Isa::Avx512Vnni: return supports(Isa::Avx2) && avx512f && avx512bw && avx512vl && avx512_vnni;
    case Isa::Amx: return supports(Isa::Avx512Vnni) && amx_tile && amx_int8 && amx_permitted;
  }
  return false;
}

Isa CpuFeatures::best() const {
  Isa b = Isa::Portable;
  for (Isa isa : kAllIsas)
    if (supports(isa)) b = isa;
  return b;
}

std::vector<Isa> CpuFeatures::supported() const {
  std::vector<Isa> v;
  for (Isa isa : kAllIsas)
    if (supports(isa)) v.push_back(isa);
  return v;
}

std::vector<std::string> CpuFeatures::flags() const {
  const std::pair<bool, const char*> all[] = {
      {sse42, "sse4.2"},        {avx, "avx"},           {avx2, "avx2"},
      {fma, "fma"},             {f16c, "f16c"},         {bmi2, "bmi2"},
      {avx_vnni, "avx-vnni"},   {avx_vnni_int8, "avx-vnni-int8"},
      {avx512f, "avx512f"},     {avx512bw, "avx512bw"}, {avx512vl, "avx512vl"},
      {avx512dq, "avx512dq"},   {avx512_vnni, "avx512-vnni"}, {avx512_bf16, "avx512-bf16"},
      {avx512_fp16, "avx512-fp16"}, {amx_tile, "amx-tile"}, {amx_int8, "amx-int8"},
      {amx_bf16, "amx-bf16"},
  };
  std::vector<std::string> out;
  for (const auto& [on, name] : all)
    if (on) out.emplace_back(name);
  return out;
}

CpuFeatures detect_cpu_features() {
  CpuFeatures f;
  const Regs r0 = cpuid(0);
  const uint32_t max_leaf = r0.a;
  char vendor[13] = {};
  std::memcpy(vendor + 0, &r0.b, 4);
  std::memcpy(vendor + 4, &r0.d, 4);
  std::memcpy(vendor + 8, &r0.c, 4);
  f.vendor = vendor;

  if (cpuid(0x80000000).a >= 0x80000004) {
    char brand[49] = {};
    for (uint32_t i = 0; i < 3; ++i) {
      const Regs r = cpuid(0x80000002 + i);
      std::memcpy(brand + 16 * i + 0, &r.a, 4);
      std::memcpy(brand + 16 * i + 4, &r.b, 4);
      std::memcpy(brand + 16 * i + 8, &r.c, 4);
      std::memcpy(brand + 16 * i + 12, &r.d, 4);
    }
    std::string b = brand;
    const size_t first = b.find_first_not_of(' ');
    f.brand = first == std::string::npos ? "" : b.substr(first, b.find_last_not_of(' ') - first + 1);
  }

  const Regs r1 = cpuid(1);
  const uint32_t base_family = (r1.a >> 8) & 0xF, ext_family = (r1.a >> 20) & 0xFF;
  const uint32_t base_model = (r1.a >> 4) & 0xF, ext_model = (r1.a >> 16) & 0xF;
  f.family = static_cast<int>(base_family == 0xF ? base_family + ext_family : base_family);
  f.model = static_cast<int>((base_family == 0x6 || base_family == 0xF) ? (ext_model << 4) + base_model : base_model);
  f.stepping = static_cast<int>(r1.a & 0xF);

  // The OS must save the vector state: XMM|YMM (bits 1, 2) for AVX; opmask|ZMM_Hi256|Hi16_ZMM (5-7)
  // for AVX-512; XTILECFG|XTILEDATA (17, 18) for AMX.
  const bool osxsave = bit(r1.c, 27);
  const uint64_t xcr0 = osxsave ? xgetbv0() : 0;
  const bool os_avx = (xcr0 & 0x6) == 0x6;
  const bool os_avx512 = os_avx && (xcr0 & 0xE0) == 0xE0;
  const bool os_amx = (xcr0 & 0x60000) == 0x60000;

  f.sse42 = bit(r1.c, 20);
  f.avx = os_avx && bit(r1.c, 28);
  f.fma = f.avx && bit(r1.c, 12);
  f.f16c = f.avx && bit(r1.c, 29);
  if (max_leaf >= 7) {
    const Regs r7 = cpuid(7, 0);
    const Regs r71 = r7.a >= 1 ? cpuid(7, 1) : Regs{};
    f.avx2 = f.avx && bit(r7.b, 5);
    f.bmi2 = bit(r7.b, 8);
    f.avx512f = os_avx512 && bit(r7.b, 16);
    f.avx512dq = f.avx512f && bit(r7.b, 17);
    f.avx512bw = f.avx512f && bit(r7.b, 30);
    f.avx512vl = f.avx512f && bit(r7.b, 31);
    f.avx512_vnni = f.avx512f && bit(r7.c, 11);
    f.avx512_fp16 = f.avx512f && bit(r7.d, 23);
    f.avx512_bf16 = f.avx512f && bit(r71.a, 5);
    f.avx_vnni = f.avx2 && bit(r71.a, 4);
    f.avx_vnni_int8 = f.avx2 && bit(r71.d, 4);
    f.amx_bf16 = os_amx && bit(r7.d, 22);
    f.amx_tile = os_amx && bit(r7.d, 24);
    f.amx_int8 = os_amx && bit(r7.d, 25);
    f.hybrid = bit(r7.d, 15);
  }
  // Linux hands out the AMX tile data state only on request (once per process, for all its threads).
  if (f.amx_tile && f.amx_int8) {
    constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    f.amx_permitted = syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  }
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  f.logical_cpus = sched_getaffinity(0, sizeof(allowed), &allowed) == 0 ? CPU_COUNT(&allowed) : 1;
  if (f.logical_cpus < 1) f.logical_cpus = 1;
  if (f.hybrid && max_leaf >= 0x1A) count_hybrid_cores(f);
  return f;
}

const CpuFeatures& cpu_features() {
  static const CpuFeatures f = detect_cpu_features();
  return f;
}

Isa select_isa(const CpuFeatures& cpu, const char* cap) {
  if (cap == nullptr || *cap == '\0') return cpu.best();
  const std::optional<Isa> isa = parse_isa(cap);
  if (!isa)
    throw usage_error(std::string("DLLM_ISA=") + cap +
                      " is not a kernel family; use portable, avx2, avx-vnni, avx512-vnni or amx");
  if (!cpu.supports(*isa))
    throw Error(std::string("DLLM_ISA=") + cap + ": this CPU (" + (cpu.brand.empty() ? cpu.vendor : cpu.brand) +
                ") lacks " + isa_name(*isa) + "; it supports up to " + isa_name(cpu.best()));
  return *isa;
}

Isa default_isa() { return select_isa(cpu_features(), std::getenv("DLLM_ISA")); }

std::string cpu_summary(const CpuFeatures& cpu, Isa chosen) {
  std::string s = "cpu: " + (cpu.brand.empty() ? std::string("unknown") : cpu.brand) + " (" + cpu.vendor +
                  ", family " + std::to_string(cpu.family) + " model " + std::to_string(cpu.model) + "), " +
                  std::to_string(cpu.logical_cpus) + " logical CPUs\n";
  s += "instruction sets:";
  for (const std::string& fl : cpu.flags()) s += " " + fl;
  s += "\n";
  if (cpu.amx_tile && cpu.amx_int8 && !cpu.amx_permitted)
    s += "amx: present, but the OS did not grant the tile state (arch_prctl ARCH_REQ_XCOMP_PERM)\n";
  if (cpu.hybrid)
    s += "hybrid: " + std::to_string(cpu.performance_cores) + " performance + " +
         std::to_string(cpu.efficiency_cores) + " efficiency cores\n";
  s += "kernel families:";
  for (Isa isa : cpu.supported()) s += std::string(" ") + isa_name(isa);
  s += std::string("\nkernel family: ") + isa_name(chosen);
  if (chosen != cpu.best()) s += std::string(" (capped by DLLM_ISA; best is ") + isa_name(cpu.best()) + ")";
  s += "\n";
  if (chosen == Isa::Amx) s += std::string("amx: ") + kAmxRule + "\n";
  return s;
}

}  // namespace dllm::jit
