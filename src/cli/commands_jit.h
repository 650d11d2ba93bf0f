// Entry points of the JIT-facing commands, which parse their own flags (cxxopts):
//   dllm bench peak [--threads N] [--isa F] [--json]
//   dllm bench gemm --type Q4_K|Q6_K|Q8_0 --n N --k K --rows M[,M...] [--threads N] [--isa F] [--warm]
//                   [--min-seconds S] [--json]
//   dllm kernels --model PATH --out DIR [--isa F] [--rows N]
// `args` are the words after the command name. Results go to stdout, diagnostics to stderr; usage errors
// are thrown as dllm::usage_error (exit 2), everything else as dllm::Error (exit 1).
#pragma once
#include <string>
#include <vector>

#include "jit/cpu_features.h"

namespace dllm::cli {

int cmd_bench(const std::vector<std::string>& args);    // cmd_bench.cpp
int cmd_kernels(const std::vector<std::string>& args);  // cmd_kernels.cpp

std::string bench_usage();
std::string kernels_usage();

// The kernel families' names in jit::kAllIsas' order, for help texts and errors: "portable, avx2, avx-vnni,
// avx512-vnni or amx"; generated_only: the families with generated kernels (all but portable).
std::string isa_list(bool generated_only = false);

// --isa's value (or DLLM_ISA when the flag is empty) as a family this CPU has; usage error naming the
// accepted families (isa_list) for an unknown name, and for portable when generated_only (`kernels`: it has
// no generated kernels); runtime error for a family the CPU lacks unless any_cpu (code that is written,
// never run).
jit::Isa isa_from_flag(const std::string& flag, const char* command, bool any_cpu = false,
                       bool generated_only = false);

}  // namespace dllm::cli
