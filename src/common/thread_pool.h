// A fixed pool of worker threads. parallel_for hands out work items through one atomic counter, so
// faster cores (performance cores on hybrid CPUs) simply take more items; the caller's thread works too.
// Between calls the workers spin briefly (a forward pass makes hundreds of calls a step, each a few
// hundred microseconds apart) and then sleep on a condition variable; the caller does the same while it
// waits for the last item. A pool with more threads than CPUs never spins.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace dllm {

class ThreadPool {
 public:
  // n_threads counts the caller: ThreadPool(1) runs everything on the calling thread.
  explicit ThreadPool(int n_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }

  // Calls fn(item, thread_index) for every item in [0, n_items), thread_index in [0, size()).
  // Returns when all items are done. The first exception thrown by fn is rethrown here.
  void parallel_for(int64_t n_items, const std::function<void(int64_t item, int thread)>& fn);

  // Logical CPUs available to this process (sched_getaffinity), at least 1.
  static int hardware_threads();

 private:
  void worker(int index);
  void run_items(int thread);

  int n_threads_;
  int spin_;  // spin iterations before sleeping (0 when there are more threads than CPUs)
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_start_, cv_done_;
  std::atomic<uint64_t> generation_{0};      // one more per parallel_for
  std::atomic<int> active_{0};               // workers still on the current call
  std::atomic<int> sleepers_{0};             // workers blocked (or about to block) on cv_start_
  std::atomic<bool> caller_waiting_{false};  // the caller blocked on cv_done_
  std::atomic<bool> stop_{false};
  const std::function<void(int64_t, int)>* fn_ = nullptr;  // published by the generation_ increment
  int64_t n_items_ = 0;
  std::atomic<int64_t> next_{0};
  std::exception_ptr error_;  // under mu_
};

}  // namespace dllm
