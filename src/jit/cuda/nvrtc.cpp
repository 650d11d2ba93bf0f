// Loading libnvrtc with dlopen (nvrtc.h) and compiling generated CUDA C++ with it. The library is looked
// up as $DLLM_NVRTC, then by soname (libnvrtc.so, libnvrtc.so.13, .12, .11.2) through the loader's path,
// then under $CUDA_PATH/lib64 and /usr/local/cuda/lib64.
#include "jit/cuda/nvrtc.h"

#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <mutex>

namespace dllm::jit::cuda {

struct NvrtcLoader {
  Nvrtc nv;
  Nvrtc* loaded = nullptr;
  std::string error;

  template <class F>
  bool sym(F& fn, const char* name) {
    void* p = dlsym(nv.handle_, name);
    if (!p) {
      error = nv.library_ + " has no entry point " + name;
      return false;
    }
    fn = reinterpret_cast<F>(p);
    return true;
  }

  void load() {
    std::vector<std::string> candidates;
    if (const char* env = std::getenv("DLLM_NVRTC"); env && *env) candidates.emplace_back(env);
    for (const char* so : {"libnvrtc.so", "libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so.11.2"}) {
      candidates.emplace_back(so);
    }
    for (std::string dir : {std::string(std::getenv("CUDA_PATH") ? std::getenv("CUDA_PATH") : ""),
                            std::string("/usr/local/cuda")}) {
      if (dir.empty()) continue;
      for (const char* so : {"/lib64/libnvrtc.so", "/lib64/libnvrtc.so.13", "/lib64/libnvrtc.so.12"}) {
        candidates.push_back(dir + so);
      }
    }
    std::string tried;
    for (const std::string& c : candidates) {
      nv.handle_ = dlopen(c.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (nv.handle_) {
        nv.library_ = c;
        break;
      }
      tried += (tried.empty() ? "" : ", ") + c;
    }
    if (!nv.handle_) {
      error = "cannot load NVRTC (the CUDA run-time compiler); tried " + tried;
      return;
    }
    const bool ok = sym(nv.nvrtcVersion_, "nvrtcVersion") && sym(nv.nvrtcGetErrorString_, "nvrtcGetErrorString") &&
                    sym(nv.nvrtcGetNumSupportedArchs_, "nvrtcGetNumSupportedArchs") &&
                    sym(nv.nvrtcGetSupportedArchs_, "nvrtcGetSupportedArchs") &&
                    sym(nv.nvrtcCreateProgram_, "nvrtcCreateProgram") &&
                    sym(nv.nvrtcDestroyProgram_, "nvrtcDestroyProgram") &&
                    sym(nv.nvrtcCompileProgram_, "nvrtcCompileProgram") && sym(nv.nvrtcGetPTXSize_, "nvrtcGetPTXSize") &&
                    sym(nv.nvrtcGetPTX_, "nvrtcGetPTX") && sym(nv.nvrtcGetCUBINSize_, "nvrtcGetCUBINSize") &&
                    sym(nv.nvrtcGetCUBIN_, "nvrtcGetCUBIN") &&
                    sym(nv.nvrtcGetProgramLogSize_, "nvrtcGetProgramLogSize") &&
                    sym(nv.nvrtcGetProgramLog_, "nvrtcGetProgramLog");
    if (!ok) return;
    int major = 0, minor = 0;
    if (nv.nvrtcVersion_(&major, &minor) != 0) {
      error = nv.library_ + ": nvrtcVersion failed";
      return;
    }
    nv.version_ = major * 1000 + minor * 10;
    int n = 0;
    if (nv.nvrtcGetNumSupportedArchs_(&n) != 0 || n <= 0) {
      error = nv.library_ + ": nvrtcGetNumSupportedArchs failed";
      return;
    }
    nv.archs_.resize(static_cast<size_t>(n));
    if (nv.nvrtcGetSupportedArchs_(nv.archs_.data()) != 0) {
      error = nv.library_ + ": nvrtcGetSupportedArchs failed";
      return;
    }
    std::sort(nv.archs_.begin(), nv.archs_.end());
    loaded = &nv;
  }
};

namespace {
NvrtcLoader& loader() {
  static NvrtcLoader l;
  static std::once_flag once;
  std::call_once(once, [] { l.load(); });
  return l;
}
}  // namespace

Nvrtc* Nvrtc::get() { return loader().loaded; }
const std::string& Nvrtc::load_error() { return loader().error; }

std::string Nvrtc::version_string() const {
  return std::to_string(version_ / 1000) + "." + std::to_string(version_ % 1000 / 10);
}

bool Nvrtc::supports(int arch) const { return std::find(archs_.begin(), archs_.end(), arch) != archs_.end(); }

void Nvrtc::check(int result, const char* call, const std::string& unit) const {
  if (result == 0) return;
  const char* text = nvrtcGetErrorString_ ? nvrtcGetErrorString_(result) : nullptr;
  throw Error(std::string("NVRTC call ") + call + " failed for " + unit + ": " +
              (text ? text : "NVRTC error " + std::to_string(result)));
}

CompiledUnit Nvrtc::compile(const std::string& source, const std::string& name, const std::string& target,
                            const std::vector<std::string>& extra) const {
  const bool real = target.rfind("sm_", 0) == 0;
  if (!real && target.rfind("compute_", 0) != 0) {
    throw Error("internal error: NVRTC target must be sm_XX or compute_XX, got " + target);
  }
  CompiledUnit out;
  out.name = name;
  out.target = target;
  Program prog = nullptr;
  check(nvrtcCreateProgram_(&prog, source.c_str(), (name + ".cu").c_str(), 0, nullptr, nullptr), "nvrtcCreateProgram",
        name);
  // The program is destroyed on every path out of here.
  struct Guard {
    const Nvrtc* nv;
    Program* p;
    ~Guard() { nv->nvrtcDestroyProgram_(p); }
  } guard{this, &prog};

  std::vector<std::string> opts = {"--gpu-architecture=" + target, "-std=c++17", "--device-as-default-execution-space"};
  opts.insert(opts.end(), extra.begin(), extra.end());
  std::vector<const char*> argv;
  for (const std::string& o : opts) argv.push_back(o.c_str());

  const auto t0 = std::chrono::steady_clock::now();
  const int rc = nvrtcCompileProgram_(prog, static_cast<int>(argv.size()), argv.data());
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  size_t log_size = 0;
  check(nvrtcGetProgramLogSize_(prog, &log_size), "nvrtcGetProgramLogSize", name);
  if (log_size > 1) {
    out.log.resize(log_size);
    check(nvrtcGetProgramLog_(prog, out.log.data()), "nvrtcGetProgramLog", name);
    out.log.resize(log_size - 1);  // drop the terminating NUL
  }
  if (rc != 0) {
    const char* text = nvrtcGetErrorString_(rc);
    throw CompileError("NVRTC could not compile kernel unit " + name + " for " + target + " (" +
                           (text ? text : "error") + "):\n" + out.log,
                       source, out.log);
  }
  size_t n = 0;
  check(nvrtcGetPTXSize_(prog, &n), "nvrtcGetPTXSize", name);
  out.ptx.resize(n);
  check(nvrtcGetPTX_(prog, out.ptx.data()), "nvrtcGetPTX", name);
  while (!out.ptx.empty() && out.ptx.back() == '\0') out.ptx.pop_back();
  if (real) {
    check(nvrtcGetCUBINSize_(prog, &n), "nvrtcGetCUBINSize", name);
    out.cubin.resize(n);
    check(nvrtcGetCUBIN_(prog, out.cubin.data()), "nvrtcGetCUBIN", name);
  }
  return out;
}

}  // namespace dllm::jit::cuda
