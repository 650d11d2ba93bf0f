// NVRTC, NVIDIA's run-time CUDA C++ compiler, loaded with dlopen so that dllm builds without the CUDA
// toolkit and runs where it is absent. compile() turns one generated translation unit into PTX or CUBIN
// for one architecture; a failure throws dllm::Error naming the unit and carrying NVRTC's log (the
// source is kept in the exception object for dumps). Every NVRTC call's result is checked by name.
#pragma once
#include <string>
#include <vector>

#include "common/error.h"

namespace dllm::jit::cuda {

// What NVRTC produced for one translation unit and target.
struct CompiledUnit {
  std::string name;    // the unit's name (appears in errors and dumps)
  std::string target;  // "sm_90" (CUBIN + PTX) or "compute_90" (PTX only)
  std::string ptx;     // always present
  std::string cubin;   // present for sm_XX targets
  std::string log;     // compiler messages (warnings), may be empty
  double seconds = 0;  // wall time of nvrtcCompileProgram
};

// Thrown when NVRTC rejects a unit: what() names the unit and target and quotes the log.
class CompileError : public Error {
 public:
  CompileError(const std::string& msg, std::string source, std::string log)
      : Error(msg), source_(std::move(source)), log_(std::move(log)) {}
  const std::string& source() const { return source_; }
  const std::string& log() const { return log_; }

 private:
  std::string source_, log_;
};

class Nvrtc {
 public:
  // The loaded library, or nullptr when no libnvrtc could be loaded (load_error() says which paths were
  // tried). $DLLM_NVRTC names a library file to use first. Thread-safe; never throws.
  static Nvrtc* get();
  static const std::string& load_error();

  int version() const { return version_; }  // major*1000 + minor*10, like the driver's
  std::string version_string() const;      // "13.0"
  const std::string& library() const { return library_; }
  // Compute capabilities this NVRTC can target (e.g. {75, 80, 86, 87, 89, 90, 100, ...}), ascending.
  const std::vector<int>& supported_archs() const { return archs_; }
  bool supports(int arch) const;

  // Compiles `source` for target "sm_XX" or "compute_XX" with dllm's fixed options plus `extra`.
  // Throws CompileError (NVRTC rejected the source) or Error (an NVRTC call failed).
  CompiledUnit compile(const std::string& source, const std::string& name, const std::string& target,
                       const std::vector<std::string>& extra = {}) const;

 private:
  Nvrtc() = default;
  friend struct NvrtcLoader;

  using Program = struct _nvrtcProgram*;
  void check(int result, const char* call, const std::string& unit) const;

  int (*nvrtcVersion_)(int*, int*) = nullptr;
  const char* (*nvrtcGetErrorString_)(int) = nullptr;
  int (*nvrtcGetNumSupportedArchs_)(int*) = nullptr;
  int (*nvrtcGetSupportedArchs_)(int*) = nullptr;
  int (*nvrtcCreateProgram_)(Program*, const char*, const char*, int, const char* const*, const char* const*) = nullptr;
  int (*nvrtcDestroyProgram_)(Program*) = nullptr;
  int (*nvrtcCompileProgram_)(Program, int, const char* const*) = nullptr;
  int (*nvrtcGetPTXSize_)(Program, size_t*) = nullptr;
  int (*nvrtcGetPTX_)(Program, char*) = nullptr;
  int (*nvrtcGetCUBINSize_)(Program, size_t*) = nullptr;
  int (*nvrtcGetCUBIN_)(Program, char*) = nullptr;
  int (*nvrtcGetProgramLogSize_)(Program, size_t*) = nullptr;
  int (*nvrtcGetProgramLog_)(Program, char*) = nullptr;

  void* handle_ = nullptr;
  std::string library_;
  int version_ = 0;
  std::vector<int> archs_;
};

}  // namespace dllm::jit::cuda
