// Loading libcuda.so.1 with dlopen and resolving the Driver API entry points dllm uses (driver.h).
// A missing library or symbol is not an error here: Driver::get() returns nullptr and load_error() says
// why, so that device selection can fall back to the CPU or report "no GPU found".
#include "jit/cuda/driver.h"

#include <dlfcn.h>

#include <initializer_list>
#include <mutex>
#include <type_traits>

#include "common/error.h"

namespace dllm::jit::cuda {

struct DriverLoader {
  Driver driver;
  Driver* loaded = nullptr;
  std::string error;

  // Resolves the first of `names` that the library exports into `fn`; records an error when none does.
  template <class F>
  bool resolve(F& fn, std::initializer_list<const char*> names) {
    for (const char* n : names) {
      if (void* p = dlsym(driver.handle_, n)) {
        fn = reinterpret_cast<F>(p);
        return true;
      }
    }
    error = std::string("libcuda.so.1 has no entry point ") + *names.begin();
    return false;
  }

  void load() {
    driver.handle_ = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!driver.handle_) {
      const char* e = dlerror();
      error = std::string("cannot load libcuda.so.1 (the NVIDIA driver): ") + (e ? e : "unknown reason");
      return;
    }
    Driver& d = driver;
    const bool ok =
        resolve(d.cuInit, {"cuInit"}) && resolve(d.cuDriverGetVersion, {"cuDriverGetVersion"}) &&
        resolve(d.cuGetErrorName, {"cuGetErrorName"}) && resolve(d.cuGetErrorString, {"cuGetErrorString"}) &&
        resolve(d.cuDeviceGetCount, {"cuDeviceGetCount"}) && resolve(d.cuDeviceGet, {"cuDeviceGet"}) &&
        resolve(d.cuDeviceGetName, {"cuDeviceGetName"}) &&
        resolve(d.cuDeviceGetAttribute, {"cuDeviceGetAttribute"}) &&
        resolve(d.cuDeviceTotalMem, {"cuDeviceTotalMem_v2"}) &&
        resolve(d.cuDevicePrimaryCtxRetain, {"cuDevicePrimaryCtxRetain"}) &&
        resolve(d.cuDevicePrimaryCtxRelease, {"cuDevicePrimaryCtxRelease_v2", "cuDevicePrimaryCtxRelease"}) &&
        resolve(d.cuCtxSetCurrent, {"cuCtxSetCurrent"}) && resolve(d.cuCtxSynchronize, {"cuCtxSynchronize"}) &&
        resolve(d.cuMemGetInfo, {"cuMemGetInfo_v2"}) && resolve(d.cuMemAlloc, {"cuMemAlloc_v2"}) &&
        resolve(d.cuMemFree, {"cuMemFree_v2"}) && resolve(d.cuMemHostAlloc, {"cuMemHostAlloc"}) &&
        resolve(d.cuMemFreeHost, {"cuMemFreeHost"}) && resolve(d.cuMemcpyHtoD, {"cuMemcpyHtoD_v2"}) &&
        resolve(d.cuMemcpyDtoH, {"cuMemcpyDtoH_v2"}) && resolve(d.cuMemcpyHtoDAsync, {"cuMemcpyHtoDAsync_v2"}) &&
        resolve(d.cuMemcpyDtoHAsync, {"cuMemcpyDtoHAsync_v2"}) &&
        resolve(d.cuMemcpyDtoDAsync, {"cuMemcpyDtoDAsync_v2"}) &&
        resolve(d.cuMemsetD8Async, {"cuMemsetD8Async"}) && resolve(d.cuModuleLoadData, {"cuModuleLoadData"}) &&
        resolve(d.cuModuleUnload, {"cuModuleUnload"}) && resolve(d.cuModuleGetFunction, {"cuModuleGetFunction"}) &&
        resolve(d.cuFuncSetAttribute, {"cuFuncSetAttribute"}) && resolve(d.cuLaunchKernel, {"cuLaunchKernel"}) &&
        resolve(d.cuStreamCreate, {"cuStreamCreate"}) &&
        resolve(d.cuStreamDestroy, {"cuStreamDestroy_v2", "cuStreamDestroy"}) &&
        resolve(d.cuStreamSynchronize, {"cuStreamSynchronize"}) && resolve(d.cuEventCreate, {"cuEventCreate"}) &&
        resolve(d.cuEventDestroy, {"cuEventDestroy_v2", "cuEventDestroy"}) &&
        resolve(d.cuEventRecord, {"cuEventRecord"}) && resolve(d.cuEventSynchronize, {"cuEventSynchronize"}) &&
        resolve(d.cuEventElapsedTime, {"cuEventElapsedTime_v2", "cuEventElapsedTime"});
    if (!ok) return;
    // Optional entry points (CUDA 12 drivers have them all): found or left null.
    const auto optional = [&](auto& fn, const char* name) {
      if (void* p = dlsym(driver.handle_, name)) fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(p);
    };
    optional(d.cuStreamBeginCapture, "cuStreamBeginCapture_v2");
    optional(d.cuStreamEndCapture, "cuStreamEndCapture");
    optional(d.cuGraphInstantiateWithFlags, "cuGraphInstantiateWithFlags");
    optional(d.cuGraphExecUpdate, "cuGraphExecUpdate_v2");
    optional(d.cuGraphLaunch, "cuGraphLaunch");
    optional(d.cuGraphDestroy, "cuGraphDestroy");
    optional(d.cuGraphExecDestroy, "cuGraphExecDestroy");
    const CUresult r = d.cuInit(0);
    if (r != CUDA_SUCCESS) {
      error = "cuInit failed: " + d.describe(r);
      return;
    }
    loaded = &driver;
  }
};

namespace {
DriverLoader& loader() {
  static DriverLoader l;
  static std::once_flag once;
  std::call_once(once, [] { l.load(); });
  return l;
}
}  // namespace

Driver* Driver::get() { return loader().loaded; }
const std::string& Driver::load_error() { return loader().error; }

std::string Driver::describe(CUresult r) const {
  const char* name = nullptr;
  const char* text = nullptr;
  if (cuGetErrorName) cuGetErrorName(r, &name);
  if (cuGetErrorString) cuGetErrorString(r, &text);
  std::string s = name ? name : "CUDA error " + std::to_string(r);
  if (text) s += std::string(" (") + text + ")";
  return s;
}

void Driver::check(CUresult r, const char* call) const {
  if (r == CUDA_SUCCESS) return;
  throw Error(std::string("CUDA driver call ") + call + " failed: " + describe(r));
}

std::string cuda_version_string(int v) { return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10); }

}  // namespace dllm::jit::cuda
