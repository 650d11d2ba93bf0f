// A fixed pool of worker threads. parallel_for hands out work items through one atomic counter, so
// faster cores (performance cores on hybrid CPUs) simply take more items; the caller's thread works too.
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
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_start_, cv_done_;
  uint64_t generation_ = 0;
  int active_ = 0;
  bool stop_ = false;
  const std::function<void(int64_t, int)>* fn_ = nullptr;
  int64_t n_items_ = 0;
  std::atomic<int64_t> next_{0};
  std::exception_ptr error_;
};

}  // namespace dllm
