// Encoded prefixes kept across requests (DiffusionGemma's cached prompt): the keys and values of a finished
// sequence's encoded prefix (its prompt and the blocks appended to it), with the token ids they encode. A new
// sequence whose prompt begins with some entry's ids copies those positions into its own store and encodes
// only the rest: the next turn of a chat. The reuse is exact: a prefix position's keys and values depend only
// on the tokens up to it (the prompt is encoded causally), and every executor computes a row the same whatever
// else shares its pass. Bounded in bytes, least recently used first out.
#pragma once
#include <cstdint>
#include <list>
#include <span>
#include <vector>

namespace dllm::model {

class PrefixCache {
 public:
  explicit PrefixCache(uint64_t capacity_bytes) : capacity_(capacity_bytes) {}

  struct Entry {
    std::vector<int32_t> ids;  // the tokens encoded
    std::vector<float> kv;     // Executor::kv_read's layout, ids.size() positions
    uint64_t bytes() const { return ids.size() * sizeof(int32_t) + kv.size() * sizeof(float); }
  };
  struct Hit {
    const Entry* entry = nullptr;  // valid until the next insert
    int64_t length = 0;            // positions of the entry that begin `ids`
  };

  // The entry sharing the longest run of leading ids with `ids` (at most `max_length` of them), which becomes
  // the most recently used; length 0 when none shares any.
  Hit find(std::span<const int32_t> ids, int64_t max_length);
  // Keeps an entry, evicting the least recently used ones to make room; one larger than the whole capacity
  // is not kept. An entry whose ids begin the new one's (the earlier turn of the same chat) is replaced.
  void insert(Entry e);

  uint64_t capacity_bytes() const { return capacity_; }
  uint64_t bytes() const { return bytes_; }
  size_t entries() const { return lru_.size(); }
  int64_t hits() const { return hits_; }
  int64_t misses() const { return misses_; }

 private:
  uint64_t capacity_ = 0, bytes_ = 0;
  int64_t hits_ = 0, misses_ = 0;
  std::list<Entry> lru_;  // most recently used first
};

}  // namespace dllm::model
