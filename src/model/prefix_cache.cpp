// The cross-request prefix cache (prefix_cache.h).
#include "model/prefix_cache.h"

#include <algorithm>

namespace dllm::model {

PrefixCache::Hit PrefixCache::find(std::span<const int32_t> ids, int64_t max_length) {
  auto best = lru_.end();
  int64_t best_len = 0;
  for (auto it = lru_.begin(); it != lru_.end(); ++it) {
    const int64_t n = std::min({static_cast<int64_t>(it->ids.size()), static_cast<int64_t>(ids.size()), max_length});
    int64_t k = 0;
    while (k < n && it->ids[static_cast<size_t>(k)] == ids[static_cast<size_t>(k)]) ++k;
    if (k > best_len) best = it, best_len = k;
  }
  if (best == lru_.end()) {
    ++misses_;
    return {};
  }
  ++hits_;
  lru_.splice(lru_.begin(), lru_, best);
  return {&lru_.front(), best_len};
}

void PrefixCache::insert(Entry e) {
  const uint64_t b = e.bytes();
  if (e.ids.empty() || b > capacity_) return;
  // A kept entry that begins with all of these ids already holds them.
  for (auto it = lru_.begin(); it != lru_.end(); ++it) {
    if (it->ids.size() >= e.ids.size() && std::equal(e.ids.begin(), e.ids.end(), it->ids.begin())) {
      lru_.splice(lru_.begin(), lru_, it);
      return;
    }
  }
  // An entry this one extends says nothing more.
  for (auto it = lru_.begin(); it != lru_.end();) {
    if (it->ids.size() < e.ids.size() && std::equal(it->ids.begin(), it->ids.end(), e.ids.begin())) {
      bytes_ -= it->bytes();
      it = lru_.erase(it);
    } else {
      ++it;
    }
  }
  while (!lru_.empty() && bytes_ + b > capacity_) {
    bytes_ -= lru_.back().bytes();
    lru_.pop_back();
  }
  bytes_ += b;
  lru_.push_front(std::move(e));
}

}  // namespace dllm::model
