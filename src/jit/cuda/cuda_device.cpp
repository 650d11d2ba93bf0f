// The Driver API implementation of Device (cuda_device.h).
#include "jit/cuda/cuda_device.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "jit/cuda/disk_cache.h"
#include "jit/cuda/nvrtc.h"
#include "common/error.h"

namespace dllm::jit::cuda {

namespace {

std::string gib(size_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f GiB", static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0));
  return buf;
}

std::string mib(size_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
  return buf;
}

}  // namespace

std::unique_ptr<CudaDevice> CudaDevice::open(int ordinal) {
  Driver* d = Driver::get();
  if (!d) {
    throw Error("no GPU found: the GPU backend needs an NVIDIA GPU with compute capability 8.0 or newer "
                "(run with --device cpu)");
  }
  int count = 0;
  CU_CHECK(*d, cuDeviceGetCount, &count);
  if (ordinal < 0 || ordinal >= count) {
    throw Error("no GPU found: the GPU backend needs an NVIDIA GPU with compute capability 8.0 or newer "
                "(run with --device cpu)");
  }
  DeviceInfo info;
  info.ordinal = ordinal;
  CUdevice dev = 0;
  CU_CHECK(*d, cuDeviceGet, &dev, ordinal);
  char name[256] = {};
  CU_CHECK(*d, cuDeviceGetName, name, static_cast<int>(sizeof name - 1), dev);
  info.name = name;
  CU_CHECK(*d, cuDeviceGetAttribute, &info.cc_major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev);
  CU_CHECK(*d, cuDeviceGetAttribute, &info.cc_minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev);
  CU_CHECK(*d, cuDeviceGetAttribute, &info.sm_count, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev);
  CU_CHECK(*d, cuDeviceTotalMem, &info.total_bytes, dev);
  std::unique_ptr<CudaDevice> cd(new CudaDevice(*d, info));
  cd->dev_ = dev;
  CU_CHECK(*d, cuDevicePrimaryCtxRetain, &cd->ctx_, dev);
  cd->bind();
  size_t free_b = 0, total_b = 0;
  CU_CHECK(*d, cuMemGetInfo, &free_b, &total_b);
  cd->info_.free_bytes = free_b;
  CU_CHECK(*d, cuDriverGetVersion, &cd->driver_version_);

  Nvrtc* nv = Nvrtc::get();
  if (!nv) {
    throw Error("the GPU backend needs NVRTC (libnvrtc.so from the CUDA toolkit, or set DLLM_NVRTC): " +
                Nvrtc::load_error() + " (run with --device cpu)");
  }
  const int arch = info.arch();
  if (nv->supports(arch)) {
    cd->target_ = "sm_" + std::to_string(arch);
  } else {
    int best = 0;
    for (int a : nv->supported_archs()) {
      if (a <= arch) best = a;
    }
    if (best == 0) {
      throw Error("NVRTC " + nv->version_string() + " cannot compile for compute capability " +
                  std::to_string(info.cc_major) + "." + std::to_string(info.cc_minor) + " (run with --device cpu)");
    }
    cd->target_ = "compute_" + std::to_string(best);
  }
  const char* dbg = std::getenv("DLLM_GPU_DEBUG");
  cd->debug_sync_ = dbg && *dbg && std::string(dbg) != "0";
  CU_CHECK(*d, cuStreamCreate, &cd->stream_, CU_STREAM_NON_BLOCKING);
  CU_CHECK(*d, cuEventCreate, &cd->done_, CU_EVENT_DISABLE_TIMING);
  cd->graphs_ = d->graphs() && !cd->debug_sync_;  // a graph's kernels cannot be synchronised one by one
  return cd;
}

CudaDevice::CudaDevice(Driver& d, DeviceInfo info)
    : d_(d),
      info_(std::move(info)),
      staging_(StagingArena::Hooks{[this](size_t bytes) {
                                     void* p = nullptr;
                                     CU_CHECK(d_, cuMemHostAlloc, &p, bytes, 0);
                                     return p;
                                   },
                                   [this](void* p) { d_.cuMemFreeHost(p); }, [this] { idle(); }}) {}

CudaDevice::~CudaDevice() {
  if (!ctx_) return;
  d_.cuCtxSetCurrent(ctx_);
  if (capturing_) {  // an exception left a capture open: end it and drop its graph
    CUgraph g = nullptr;
    if (d_.cuStreamEndCapture(stream_, &g) == CUDA_SUCCESS && g) d_.cuGraphDestroy(g);
  }
  d_.cuCtxSynchronize();
  for (auto& e : graphs_cache_.entries()) d_.cuGraphExecDestroy(e.exec);
  for (DevAddr p : deferred_free_) d_.cuMemFree(p);
  staging_.clear();
  if (down_.p) d_.cuMemFreeHost(down_.p);
  if (done_) d_.cuEventDestroy(done_);
  for (CUevent e : marks_) d_.cuEventDestroy(e);
  if (stream_) d_.cuStreamDestroy(stream_);
  for (CUmodule m : modules_) d_.cuModuleUnload(m);
  d_.cuDevicePrimaryCtxRelease(dev_);
}

void CudaDevice::bind() const { CU_CHECK(d_, cuCtxSetCurrent, ctx_); }

std::string CudaDevice::describe() const {
  return info_.name + " (sm_" + std::to_string(info_.arch()) + ", " + std::to_string(info_.sm_count) + " SMs, " +
         gib(info_.total_bytes) + ", driver CUDA " + cuda_version_string(driver_version_) + ")";
}

DevAddr CudaDevice::alloc(size_t bytes) {
  bind();
  CUdeviceptr p = 0;
  const CUresult r = d_.cuMemAlloc(&p, bytes ? bytes : 1);
  if (r != CUDA_SUCCESS) {
    size_t free_b = 0, total_b = 0;
    d_.cuMemGetInfo(&free_b, &total_b);
    throw Error("cannot allocate " + mib(bytes) + " of GPU memory on " + info_.name + " (" + gib(free_b) +
                " free): " + d_.describe(r) + " (run with --device cpu)");
  }
  return p;
}

void CudaDevice::free(DevAddr p) noexcept {
  if (!p) return;
  if (capturing_) {  // the recorded graph may still use it
    deferred_free_.push_back(p);
    return;
  }
  d_.cuCtxSetCurrent(ctx_);
  d_.cuMemFree(p);
}

namespace {
constexpr size_t kStagePiece = size_t{16} << 20;  // an eager upload or download goes through at most this at once
}  // namespace

void CudaDevice::idle() {
  CU_CHECK(d_, cuStreamSynchronize, stream_);
  for (DevAddr p : deferred_free_) d_.cuMemFree(p);
  deferred_free_.clear();
  staging_.reset();
}

void CudaDevice::upload(DevAddr dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  bind();
  // Captured: one piece, read by the graph when it runs. Otherwise in pieces, so staging stays bounded.
  const size_t piece = capturing_ ? bytes : kStagePiece;
  for (size_t at = 0; at < bytes; at += piece) {
    const size_t n = std::min(piece, bytes - at);
    void* h = staging_.stage(n, capturing_);
    std::memcpy(h, static_cast<const char*>(src) + at, n);
    CU_CHECK(d_, cuMemcpyHtoDAsync, dst + at, h, n, stream_);
  }
}

void CudaDevice::download(void* dst, DevAddr src, size_t bytes) {
  if (bytes == 0) return;
  bind();
  if (capturing_) end_capture({});  // launches what was recorded (not kept)
  const size_t piece = std::min(bytes, kStagePiece);
  if (down_.bytes < piece) {
    if (down_.p) d_.cuMemFreeHost(down_.p);
    down_ = Pinned{};
    CU_CHECK(d_, cuMemHostAlloc, &down_.p, piece, 0);
    down_.bytes = piece;
  }
  for (size_t at = 0; at < bytes; at += piece) {
    const size_t n = std::min(piece, bytes - at);
    CU_CHECK(d_, cuMemcpyDtoHAsync, down_.p, src + at, n, stream_);
    CU_CHECK(d_, cuEventRecord, done_, stream_);
    CU_CHECK(d_, cuEventSynchronize, done_);  // this stream's work only, not the whole device
    std::memcpy(static_cast<char*>(dst) + at, down_.p, n);
  }
  idle();  // the stream is idle now: staging reusable, deferred frees done
}

size_t CudaDevice::mark() {
  bind();
  if (capturing_) throw Error("internal error: a profile timer inside a graph capture");
  if (marks_used_ == marks_.size()) {
    CUevent e = nullptr;
    CU_CHECK(d_, cuEventCreate, &e, 0);  // timing enabled
    marks_.push_back(e);
  }
  CU_CHECK(d_, cuEventRecord, marks_[marks_used_], stream_);
  return marks_used_++;
}

double CudaDevice::seconds_between(size_t a, size_t b) {
  bind();
  if (a >= marks_used_ || b >= marks_used_) throw Error("internal error: an unknown profile timer");
  CU_CHECK(d_, cuEventSynchronize, marks_[b]);
  float ms = 0;
  CU_CHECK(d_, cuEventElapsedTime, &ms, marks_[a], marks_[b]);
  return ms / 1e3;
}

void CudaDevice::zero(DevAddr dst, size_t bytes) {
  if (bytes == 0) return;
  bind();
  CU_CHECK(d_, cuMemsetD8Async, dst, 0, bytes, stream_);
}

void CudaDevice::copy(DevAddr dst, DevAddr src, size_t bytes) {
  if (bytes == 0) return;
  bind();
  CU_CHECK(d_, cuMemcpyDtoDAsync, dst, src, bytes, stream_);
}

void CudaDevice::synchronize() {
  bind();
  if (capturing_) end_capture({});
  idle();
}

void CudaDevice::begin_capture() {
  if (!graphs_ || capturing_) return;
  bind();
  CU_CHECK(d_, cuStreamBeginCapture, stream_, CU_STREAM_CAPTURE_MODE_RELAXED);
  capturing_ = true;
  graph_kernels_ = 0;
}

CUgraph CudaDevice::finish_capture() {
  capturing_ = false;
  CUgraph g = nullptr;
  const CUresult r = d_.cuStreamEndCapture(stream_, &g);
  if (r != CUDA_SUCCESS || !g) {
    graphs_ = false;  // the next steps run as plain launches
    throw Error("CUDA graph capture of a forward step failed: " + d_.describe(r) +
                " (set DLLM_GPU_GRAPHS=0 to run without graphs)");
  }
  return g;
}

bool CudaDevice::end_capture(std::span<const int64_t> key) {
  if (!capturing_) return false;
  bind();
  const bool kept = !key.empty();
  CUgraph g = finish_capture();
  CUgraphExec exec = nullptr;
  const auto launch_graph = [&](CUgraphExec e) {
    const CUresult r = d_.cuGraphLaunch(e, stream_);
    if (r != CUDA_SUCCESS) {
      d_.cuGraphDestroy(g);
      throw Error("CUDA driver call cuGraphLaunch failed: " + d_.describe(r) +
                  " (set DLLM_GPU_GRAPHS=0 to run without graphs)");
    }
  };
  graph_stats_.graph_kernels += graph_kernels_;
  if (!kept) {  // a capture cut short: run it once
    ++graph_stats_.broken;
    CU_CHECK(d_, cuGraphInstantiateWithFlags, &exec, g, 0);
    launch_graph(exec);
    d_.cuGraphExecDestroy(exec);  // freed by the driver once it has run
    d_.cuGraphDestroy(g);
    return false;
  }
  ++graph_stats_.captured;
  for (auto* e : graphs_cache_.candidates(key)) {
    CUgraphExecUpdateResultInfo info;
    if (d_.cuGraphExecUpdate(e->exec, g, &info) == CUDA_SUCCESS) {
      ++graph_stats_.updated;
      graphs_cache_.touch(*e, key);
      exec = e->exec;
      break;
    }
  }
  if (!exec) {
    ++graph_stats_.instantiated;
    CU_CHECK(d_, cuGraphInstantiateWithFlags, &exec, g, 0);
    for (CUgraphExec old : graphs_cache_.add(key, exec)) d_.cuGraphExecDestroy(old);
  }
  launch_graph(exec);
  d_.cuGraphDestroy(g);
  return true;
}

void CudaDevice::load_kernels(const KernelSet& set) {
  bool missing = false;
  for (const std::string& n : set.names()) missing = missing || !fns_.count(n);
  if (!missing) return;
  const auto t0 = std::chrono::steady_clock::now();
  bind();
  const Nvrtc* nv = Nvrtc::get();
  if (!nv) throw Error("the GPU backend needs NVRTC: " + Nvrtc::load_error() + " (run with --device cpu)");
  const std::string source = set.source();
  const std::string unit = set.unit_name();
  const KernelDiskCache cache;
  const CompileOutcome c = cache.compile_cached(*nv, source, unit, target_, driver_version_);
  if (!c.cache_note.empty()) notes_.push_back("kernel cache: " + c.cache_note);
  if (c.from_cache) {
    ++stats_.units_from_cache;
  } else {
    ++stats_.units_compiled;
    stats_.compile_seconds += c.compile_seconds;
  }
  CUmodule mod = nullptr;
  const CUresult r = d_.cuModuleLoadData(&mod, c.binary.data());
  if (r != CUDA_SUCCESS) {
    std::string hint;
    if (nv->version() > driver_version_) {
      hint = "; NVRTC " + nv->version_string() + " is newer than the driver's CUDA " +
             cuda_version_string(driver_version_) + ": update the driver or set DLLM_NVRTC to an older libnvrtc";
    }
    throw Error("CUDA driver call cuModuleLoadData failed for kernel unit " + unit + " (" + target_ +
                "): " + d_.describe(r) + hint);
  }
  modules_.push_back(mod);
  for (const std::string& n : set.names()) {
    CUfunction f = nullptr;
    const CUresult rf = d_.cuModuleGetFunction(&f, mod, n.c_str());
    if (rf != CUDA_SUCCESS) {
      throw Error("CUDA driver call cuModuleGetFunction failed for kernel " + n + ": " + d_.describe(rf));
    }
    fns_[n] = f;
  }
  stats_.load_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void CudaDevice::launch(const std::string& name, const Launch& dims, const void* params, size_t bytes) {
  (void)bytes;
  const auto it = fns_.find(name);
  if (it == fns_.end()) throw Error("internal error: GPU kernel " + name + " was not loaded");
  bind();
  if (dims.shared_bytes > 48 * 1024) {  // beyond the default limit: opt in once per function
    unsigned& allowed = shared_set_[it->second];
    if (allowed < dims.shared_bytes) {
      const CUresult ra = d_.cuFuncSetAttribute(it->second, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                                static_cast<int>(dims.shared_bytes));
      if (ra != CUDA_SUCCESS) {
        throw Error("CUDA driver call cuFuncSetAttribute failed for kernel " + name + " (" +
                    std::to_string(dims.shared_bytes) + " bytes of shared memory): " + d_.describe(ra));
      }
      allowed = dims.shared_bytes;
    }
  }
  void* args[] = {const_cast<void*>(params)};
  const CUresult r = d_.cuLaunchKernel(it->second, dims.grid_x, dims.grid_y, 1, dims.block_x, 1, 1, dims.shared_bytes,
                                       stream_, args, nullptr);
  if (capturing_) ++graph_kernels_;
  if (r != CUDA_SUCCESS) throw Error("CUDA driver call cuLaunchKernel failed for kernel " + name + ": " + d_.describe(r));
  if (debug_sync_) {
    const CUresult rs = d_.cuStreamSynchronize(stream_);
    if (rs != CUDA_SUCCESS) throw Error("GPU kernel " + name + " failed: " + d_.describe(rs));
  }
}

}  // namespace dllm::jit::cuda
