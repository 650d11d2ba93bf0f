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

// --isa's value (or DLLM_ISA when the flag is empty) as a family this CPU has; usage error for an
// unknown name, runtime error for a family the CPU lacks unless any_cpu (code that is written, never run).
jit::Isa isa_from_flag(const std::string& flag, const char* command, bool any_cpu = false);

}  // namespace dllm::cli
