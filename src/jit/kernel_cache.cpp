// KernelCache: get-or-create with generation outside the lock; Kernel wraps a finished generator.
#include "jit/kernel_cache.h"

#include <algorithm>
#include <atomic>
#include <mutex>

#include "jit/x64/amx_gemm.h"
#include "jit/x64/gemm_gen.h"
#include "common/error.h"

namespace dllm::jit {

Kernel::Kernel(const GemmDesc& desc, std::shared_ptr<JitGenerator> gen)
    : desc_(desc), name_(gen->kernel_name()), gen_(std::move(gen)) {
  code_ = gen_->code();
  size_ = gen_->code_size();
  fn_ = reinterpret_cast<GemmKernelFn>(const_cast<uint8_t*>(code_));
}

namespace {
std::atomic<KernelInterpreter> g_interpreter{nullptr};
}  // namespace

void set_kernel_interpreter(KernelInterpreter run) { g_interpreter.store(run); }
KernelInterpreter kernel_interpreter() { return g_interpreter.load(std::memory_order_relaxed); }

std::shared_ptr<const Kernel> generate_kernel(const GemmDesc& desc, bool any_cpu) {
  if (desc.isa == Isa::Portable) throw Error("cannot generate kernel " + desc.name() + ": the portable family has no JIT");
  if (!any_cpu && !kernel_interpreter() && !cpu_features().supports(desc.isa))
    throw Error("cannot generate kernel " + desc.name() + ": this CPU lacks " + isa_name(desc.isa));
  std::shared_ptr<JitGenerator> gen;
  if (desc.isa == Isa::Amx)
    gen = std::make_shared<AmxGemmGenerator>(desc);
  else if (desc.isa == Isa::Avx512Vnni)
    gen = std::make_shared<GemmGenerator<Xbyak::Zmm>>(desc);
  else
    gen = std::make_shared<GemmGenerator<Xbyak::Ymm>>(desc);
  gen->create();
  return std::make_shared<const Kernel>(desc, std::move(gen));
}

KernelCache& KernelCache::global() {
  static KernelCache cache;
  return cache;
}

std::shared_ptr<const Kernel> KernelCache::get(const GemmDesc& desc) {
  {
    std::shared_lock lk(mu_);
    auto it = map_.find(desc);
    if (it != map_.end()) {
      Entry e = it->second;
      lk.unlock();
      return e.get();
    }
  }
  std::promise<std::shared_ptr<const Kernel>> promise;
  {
    std::unique_lock lk(mu_);
    auto [it, inserted] = map_.try_emplace(desc, promise.get_future().share());
    if (!inserted) {
      Entry e = it->second;
      lk.unlock();
      return e.get();
    }
    ++generations_;
  }
  // Generate outside the lock; waiters of this descriptor block on the future.
  try {
    std::shared_ptr<const Kernel> k = generate_kernel(desc);
    promise.set_value(k);
    return k;
  } catch (...) {
    promise.set_exception(std::current_exception());
    throw;
  }
}

std::vector<std::shared_ptr<const Kernel>> KernelCache::kernels() const {
  std::vector<std::shared_ptr<const Kernel>> out;
  {
    std::shared_lock lk(mu_);
    for (const auto& [desc, e] : map_) {
      if (e.wait_for(std::chrono::seconds(0)) != std::future_status::ready) continue;
      try {
        out.push_back(e.get());
      } catch (...) {
      }
    }
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a->name() < b->name(); });
  return out;
}

size_t KernelCache::size() const {
  std::shared_lock lk(mu_);
  return map_.size();
}

int64_t KernelCache::generations() const {
  std::shared_lock lk(mu_);
  return generations_;
}

}  // namespace dllm::jit
