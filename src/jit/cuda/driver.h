// The CUDA Driver API, loaded at run time with dlopen("libcuda.so.1") so that the same binary runs where
// no NVIDIA driver is installed. Only the few types, constants and entry points dllm uses are declared
// here (no cuda.h needed to build). Every call goes through CU_CHECK, which throws dllm::Error naming the
// entry point and the driver's error name and description, e.g.
//   "CUDA driver call cuMemAlloc failed: CUDA_ERROR_OUT_OF_MEMORY (out of memory)".
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace dllm::jit::cuda {

using CUresult = int;
using CUdevice = int;
using CUdeviceptr = unsigned long long;
using CUcontext = struct CUctx_st*;
using CUmodule = struct CUmod_st*;
using CUfunction = struct CUfunc_st*;
using CUstream = struct CUstream_st*;
using CUevent = struct CUevent_st*;
using CUgraph = struct CUgraph_st*;
using CUgraphExec = struct CUgraphExec_st*;
using CUgraphNode = struct CUgraphNode_st*;
// cuGraphExecUpdate's report (only its result is read).
struct CUgraphExecUpdateResultInfo {
  int result = 0;
  CUgraphNode error_node = nullptr, error_from_node = nullptr;
};

inline constexpr CUresult CUDA_SUCCESS = 0;
inline constexpr CUresult CUDA_ERROR_NO_DEVICE = 100;
inline constexpr int CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16;
inline constexpr int CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75;
inline constexpr int CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76;
inline constexpr int CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = 97;
inline constexpr int CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8;
inline constexpr unsigned CU_STREAM_NON_BLOCKING = 1;
inline constexpr int CU_STREAM_CAPTURE_MODE_RELAXED = 2;
inline constexpr unsigned CU_EVENT_DISABLE_TIMING = 2;

// The loaded library: one process-wide instance, resolved once.
class Driver {
 public:
  // The driver, or nullptr when libcuda.so.1 cannot be loaded or lacks an entry point
  // (load_error() then says why). Thread-safe; never throws.
  static Driver* get();
  static const std::string& load_error();

  // Throws dllm::Error("CUDA driver call <call> failed: <NAME> (<description>)") unless r is success.
  void check(CUresult r, const char* call) const;
  // "CUDA_ERROR_OUT_OF_MEMORY (out of memory)" for a result code.
  std::string describe(CUresult r) const;

  // --- entry points (names are the exported symbols, _v2 where the header maps to one) ---
  CUresult (*cuInit)(unsigned) = nullptr;
  CUresult (*cuDriverGetVersion)(int*) = nullptr;
  CUresult (*cuGetErrorName)(CUresult, const char**) = nullptr;
  CUresult (*cuGetErrorString)(CUresult, const char**) = nullptr;
  CUresult (*cuDeviceGetCount)(int*) = nullptr;
  CUresult (*cuDeviceGet)(CUdevice*, int) = nullptr;
  CUresult (*cuDeviceGetName)(char*, int, CUdevice) = nullptr;
  CUresult (*cuDeviceGetAttribute)(int*, int, CUdevice) = nullptr;
  CUresult (*cuDeviceTotalMem)(size_t*, CUdevice) = nullptr;
  CUresult (*cuDevicePrimaryCtxRetain)(CUcontext*, CUdevice) = nullptr;
  CUresult (*cuDevicePrimaryCtxRelease)(CUdevice) = nullptr;
  CUresult (*cuCtxSetCurrent)(CUcontext) = nullptr;
  CUresult (*cuCtxSynchronize)() = nullptr;
  CUresult (*cuMemGetInfo)(size_t*, size_t*) = nullptr;
  CUresult (*cuMemAlloc)(CUdeviceptr*, size_t) = nullptr;
  CUresult (*cuMemFree)(CUdeviceptr) = nullptr;
  CUresult (*cuMemHostAlloc)(void**, size_t, unsigned) = nullptr;
  CUresult (*cuMemFreeHost)(void*) = nullptr;
  CUresult (*cuMemcpyHtoD)(CUdeviceptr, const void*, size_t) = nullptr;
  CUresult (*cuMemcpyDtoH)(void*, CUdeviceptr, size_t) = nullptr;
  CUresult (*cuMemcpyHtoDAsync)(CUdeviceptr, const void*, size_t, CUstream) = nullptr;
  CUresult (*cuMemcpyDtoHAsync)(void*, CUdeviceptr, size_t, CUstream) = nullptr;
  CUresult (*cuMemcpyDtoDAsync)(CUdeviceptr, CUdeviceptr, size_t, CUstream) = nullptr;
  CUresult (*cuMemsetD8Async)(CUdeviceptr, unsigned char, size_t, CUstream) = nullptr;
  CUresult (*cuModuleLoadData)(CUmodule*, const void*) = nullptr;
  CUresult (*cuModuleUnload)(CUmodule) = nullptr;
  CUresult (*cuModuleGetFunction)(CUfunction*, CUmodule, const char*) = nullptr;
  CUresult (*cuFuncSetAttribute)(CUfunction, int, int) = nullptr;
  CUresult (*cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                             CUstream, void**, void**) = nullptr;
  CUresult (*cuStreamCreate)(CUstream*, unsigned) = nullptr;
  CUresult (*cuStreamDestroy)(CUstream) = nullptr;
  CUresult (*cuStreamSynchronize)(CUstream) = nullptr;
  CUresult (*cuEventCreate)(CUevent*, unsigned) = nullptr;
  CUresult (*cuEventDestroy)(CUevent) = nullptr;
  CUresult (*cuEventRecord)(CUevent, CUstream) = nullptr;
  CUresult (*cuEventSynchronize)(CUevent) = nullptr;
  CUresult (*cuEventElapsedTime)(float*, CUevent, CUevent) = nullptr;
  // CUDA Graphs (stream capture). Optional: a driver without them leaves these null and graphs() false.
  CUresult (*cuStreamBeginCapture)(CUstream, int) = nullptr;  // cuStreamBeginCapture_v2 (with a mode)
  CUresult (*cuStreamEndCapture)(CUstream, CUgraph*) = nullptr;
  CUresult (*cuGraphInstantiateWithFlags)(CUgraphExec*, CUgraph, unsigned long long) = nullptr;
  CUresult (*cuGraphExecUpdate)(CUgraphExec, CUgraph, CUgraphExecUpdateResultInfo*) = nullptr;  // _v2
  CUresult (*cuGraphLaunch)(CUgraphExec, CUstream) = nullptr;
  CUresult (*cuGraphDestroy)(CUgraph) = nullptr;
  CUresult (*cuGraphExecDestroy)(CUgraphExec) = nullptr;
  bool graphs() const {
    return cuStreamBeginCapture && cuStreamEndCapture && cuGraphInstantiateWithFlags && cuGraphExecUpdate &&
           cuGraphLaunch && cuGraphDestroy && cuGraphExecDestroy;
  }

 private:
  Driver() = default;
  void* handle_ = nullptr;
  friend struct DriverLoader;
};

// CU_CHECK(drv, cuMemAlloc, &ptr, bytes): calls the entry point and throws on failure, naming it.
#define CU_CHECK(drv, fn, ...) (drv).check((drv).fn(__VA_ARGS__), #fn)

// One NVIDIA device as the driver reports it.
struct DeviceInfo {
  int ordinal = 0;
  std::string name;
  int cc_major = 0, cc_minor = 0;  // compute capability
  int sm_count = 0;
  size_t total_bytes = 0;
  size_t free_bytes = 0;           // free device memory when probed (0 when it could not be read)
  int arch() const { return cc_major * 10 + cc_minor; }  // 86 for compute capability 8.6
};

// "12.4" from a driver/runtime version integer such as 12040.
std::string cuda_version_string(int v);

}  // namespace dllm::jit::cuda
