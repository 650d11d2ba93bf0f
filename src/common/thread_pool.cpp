// ThreadPool: workers wait on a generation counter; items are claimed with fetch_add.
#include "common/thread_pool.h"

#include <sched.h>

namespace dllm {

namespace {

// Spin iterations before sleeping: tens of microseconds, longer than the gaps inside a forward pass.
// Only when every thread has a CPU of its own: an oversubscribed pool would spin on the CPU that the
// thread it waits for needs.
constexpr int kSpin = 2048;

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

}  // namespace

ThreadPool::ThreadPool(int n_threads)
    : n_threads_(n_threads < 1 ? 1 : n_threads), spin_(n_threads_ <= hardware_threads() ? kSpin : 0) {
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this, i] { worker(i); });
}

ThreadPool::~ThreadPool() {
  stop_.store(true);
  {
    std::lock_guard<std::mutex> lk(mu_);
    cv_start_.notify_all();
  }
  for (auto& t : workers_) t.join();
}

int ThreadPool::hardware_threads() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
  unsigned n = std::thread::hardware_concurrency();
  return n ? static_cast<int>(n) : 1;
}

void ThreadPool::run_items(int thread) {
  for (;;) {
    int64_t item = next_.fetch_add(1, std::memory_order_relaxed);
    if (item >= n_items_) break;
    try {
      (*fn_)(item, thread);
    } catch (...) {
      std::lock_guard<std::mutex> lk(mu_);
      if (!error_) error_ = std::current_exception();
      next_.store(n_items_, std::memory_order_relaxed);  // stop handing out work
    }
  }
}

void ThreadPool::worker(int index) {
  uint64_t seen = 0;
  for (;;) {
    // Wait for the next call: spin, then sleep. sleepers_ (seq_cst) and the caller's generation_
    // increment see each other, so a call never misses a sleeping worker.
    int spins = 0;
    uint64_t g;
    while ((g = generation_.load()) == seen && !stop_.load()) {
      if (++spins < spin_) {
        cpu_relax();
        continue;
      }
      std::unique_lock<std::mutex> lk(mu_);
      sleepers_.fetch_add(1);
      cv_start_.wait(lk, [&] { return stop_.load() || generation_.load() != seen; });
      sleepers_.fetch_sub(1);
    }
    if (stop_.load()) return;
    seen = g;
    run_items(index);
    if (active_.fetch_sub(1) == 1 && caller_waiting_.load()) {
      std::lock_guard<std::mutex> lk(mu_);
      cv_done_.notify_one();
    }
  }
}

void ThreadPool::parallel_for(int64_t n_items, const std::function<void(int64_t, int)>& fn) {
  if (n_items <= 0) return;
  if (n_threads_ == 1 || n_items == 1) {
    for (int64_t i = 0; i < n_items; ++i) fn(i, 0);
    return;
  }
  // Every worker finished the previous call (active_ reached 0), so nothing reads these now.
  fn_ = &fn;
  n_items_ = n_items;
  next_.store(0, std::memory_order_relaxed);
  error_ = nullptr;
  active_.store(n_threads_ - 1);
  generation_.fetch_add(1);  // publishes the fields above
  if (sleepers_.load() > 0) {
    std::lock_guard<std::mutex> lk(mu_);
    cv_start_.notify_all();
  }
  run_items(0);
  for (int spins = 0; active_.load() != 0 && spins < spin_; ++spins) cpu_relax();
  if (active_.load() != 0) {
    std::unique_lock<std::mutex> lk(mu_);
    caller_waiting_.store(true);
    cv_done_.wait(lk, [&] { return active_.load() == 0; });
    caller_waiting_.store(false);
  }
  std::exception_ptr err;
  {
    std::lock_guard<std::mutex> lk(mu_);
    fn_ = nullptr;
    err = error_;
  }
  if (err) std::rethrow_exception(err);
}

}  // namespace dllm
