// ThreadPool: every item runs exactly once, on every pool size, and exceptions propagate.
#include "model/thread_pool.h"

#include <gtest/gtest.h>

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
