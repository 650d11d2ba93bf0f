// ThreadPool: every item runs exactly once, on every pool size, and exceptions propagate.
#include "common/thread_pool.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include <atomic>
#include <stdexcept>
#include <vector>

using dllm::ThreadPool;

TEST(ThreadPool, EveryItemOnceForManySizes) {
  for (int threads : {1, 2, 3, 8}) {
    ThreadPool pool(threads);
    for (int64_t n : {0, 1, 2, 7, 1000}) {
      std::vector<std::atomic<int>> hits(n);
      std::atomic<int> bad_thread{0};
      pool.parallel_for(n, [&](int64_t i, int t) {
        hits[i]++;
        if (t < 0 || t >= threads) bad_thread++;
      });
      for (int64_t i = 0; i < n; ++i) EXPECT_EQ(hits[i].load(), 1) << "threads=" << threads << " n=" << n;
      EXPECT_EQ(bad_thread.load(), 0);
    }
  }
}

TEST(ThreadPool, RethrowsFirstException) {
  ThreadPool pool(3);
  EXPECT_THROW(pool.parallel_for(100, [](int64_t i, int) { if (i == 17) throw std::runtime_error("x"); }),
               std::runtime_error);
  // the pool still works afterwards
  std::atomic<int64_t> sum{0};
  pool.parallel_for(10, [&](int64_t i, int) { sum += i; });
  EXPECT_EQ(sum.load(), 45);
}

// Many short calls back to back (the workers are still spinning), then calls after the workers have gone
// to sleep, then a pool destroyed while its workers sleep: every item runs once, nothing hangs.
TEST(ThreadPool, ShortCallsAndCallsAfterSleepBothComplete) {
  for (int threads : {2, 3, 4}) {
    ThreadPool pool(threads);
    std::atomic<int64_t> sum{0};
    for (int call = 0; call < 5000; ++call) {
      pool.parallel_for(3, [&](int64_t i, int) { sum.fetch_add(i + 1, std::memory_order_relaxed); });
    }
    EXPECT_EQ(sum.load(), 5000 * 6);
    for (int call = 0; call < 5; ++call) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));  // long enough for the workers to sleep
      std::vector<std::atomic<int>> hits(100);
      pool.parallel_for(100, [&](int64_t i, int) { hits[static_cast<size_t>(i)].fetch_add(1); });
      for (auto& h : hits) ASSERT_EQ(h.load(), 1);
    }
  }
  ThreadPool idle(4);
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
}
