// What the CPU can do (cpuid + xgetbv), as a capability set, and which kernel family runs on it.
// The family can be capped with DLLM_ISA=portable|avx2|avx-vnni|avx512-vnni so that one modern machine
// exercises every code path; asking for a family the CPU lacks is an error, never a silent fallback.
#pragma once
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dllm::jit {

// Kernel families, ordered from least to most capable. Each needs everything the previous one needs.
enum class Isa {
  Portable = 0,    // plain C++ (the reference twin), no JIT
  Avx2 = 1,        // AVX2 + FMA + F16C: vpmaddubsw + vpmaddwd, ymm, 8 weight rows per vector
  AvxVnni = 2,     // AVX2 + AVX-VNNI (VEX vpdpbusd), ymm, 8 weight rows per vector
  Avx512Vnni = 3,  // AVX-512 F/BW/VL + AVX512-VNNI (EVEX vpdpbusd), zmm, 16 weight rows per vector
  Amx = 4,         // Avx512Vnni + AMX-INT8 tiles (tdpbssd/tdpbsud, 16 activation rows x 16 weight rows per
                   // tile) for the products, AVX-512 for the scales; needs the OS's permission (Linux
                   // arch_prctl), asked for once at detection. The default where granted: its matrices
                   // run AMX kernels where they measured faster and avx512-vnni ones elsewhere
                   // (matrix_family, gemm_desc.h; docs/benchmarks.md)
};
inline constexpr Isa kAllIsas[] = {Isa::Portable, Isa::Avx2, Isa::AvxVnni, Isa::Avx512Vnni, Isa::Amx};

// True for the families whose code uses 512-bit registers (all of AVX-512 is available to them).
inline constexpr bool isa_has_avx512(Isa isa) { return isa == Isa::Avx512Vnni || isa == Isa::Amx; }

// What the amx family runs where (matrix_family in gemm_desc.h), for doctor and --verbose.
inline constexpr const char* kAmxRule =
    "AMX tiles for Q4_K, Q5_K, Q6_K and Q8_0 (Q4_K's and Q5_K's remainders of up to 8 rows past the last full 16 "
    "on avx512-vnni kernels); avx512-vnni kernels for Q5_0";

const char* isa_name(Isa isa);                    // "portable", "avx2", "avx-vnni", "avx512-vnni", "amx"
const char* isa_short_name(Isa isa);              // as kernel names spell it: "ref", "avx2", "avxvnni", "avx512vnni", "amx"
std::optional<Isa> parse_isa(std::string_view s);  // accepts isa_name() spellings (and "avx512vnni", "avxvnni")

struct CpuFeatures {
  std::string vendor;  // "GenuineIntel", "AuthenticAMD", ...
  std::string brand;   // the processor brand string
  int family = 0, model = 0, stepping = 0;

  // Instruction sets: set only when the CPU reports them AND the OS saves the registers they use.
  bool sse42 = false, avx = false, avx2 = false, fma = false, f16c = false, bmi2 = false;
  bool avx_vnni = false, avx_vnni_int8 = false;
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512dq = false;
  bool avx512_vnni = false, avx512_bf16 = false, avx512_fp16 = false;
  bool amx_tile = false, amx_int8 = false, amx_bf16 = false;  // CPU + XCR0
  bool amx_permitted = false;  // the OS granted this process the AMX tile data state (Linux arch_prctl)

  // Hybrid parts (Intel P/E cores): cpuid 7.EDX[15] and the core type of each CPU we may run on (leaf 0x1A).
  bool hybrid = false;
  int performance_cores = 0, efficiency_cores = 0;  // 0/0 when not hybrid or not reported
  int logical_cpus = 1;                              // CPUs this process may use

  bool supports(Isa isa) const;
  Isa best() const;                  // the default: the most capable supported family
  std::vector<Isa> supported() const;  // every supported family, Portable first
  std::vector<std::string> flags() const;  // names of the instruction sets found ("avx2", "avx512-vnni", ...)
};

// Detected once per process (thread-safe).
const CpuFeatures& cpu_features();
// Runs the detection now (no caching).
CpuFeatures detect_cpu_features();

// The family to use: the best one, capped by `cap` (DLLM_ISA's value; null or "" = no cap).
// Throws a usage dllm::Error for an unknown name and a dllm::Error when the CPU lacks that family.
// DLLM_ISA=portable|avx2|avx-vnni|avx512-vnni|amx.
Isa select_isa(const CpuFeatures& cpu, const char* cap);
// select_isa(cpu_features(), getenv("DLLM_ISA")).
Isa default_isa();

// A few lines for `doctor` and `--verbose`: CPU, instruction sets, hybrid layout, chosen family.
std::string cpu_summary(const CpuFeatures& cpu, Isa chosen);

}  // namespace dllm::jit
