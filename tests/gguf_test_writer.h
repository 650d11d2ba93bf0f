// A tiny GGUF writer for tests: builds v2/v3 files byte by byte (including deliberately broken ones)
// so reader and inspect tests can cover cases the fixture files do not.
#pragma once
#include <cstdint>
#include <cstring>
#include <fstream>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

namespace dllm::test {

// Little-endian encoding of one scalar (the host is little-endian, like GGUF).
template <typename T>
std::string le(T v) {
  std::string s(sizeof(T), '\0');
  std::memcpy(s.data(), &v, sizeof(T));
  return s;
}

// A GGUF string: u64 length + bytes.
inline std::string gstr(std::string_view s) { return le<uint64_t>(s.size()) + std::string(s); }

// An array value: element type, count, then the encoded elements.
inline std::string garr(uint32_t elem_type, uint64_t count, const std::string& items) {
  return le<uint32_t>(elem_type) + le<uint64_t>(count) + items;
}

class GgufWriter {
 public:
  explicit GgufWriter(uint32_t version = 3, uint64_t alignment = 32) : version_(version), alignment_(alignment) {}

  // A key with value type `type` and an already encoded value.
  GgufWriter& kv(std::string_view key, uint32_t type, const std::string& value) {
    kvs_ += gstr(key) + le<uint32_t>(type) + value;
    ++n_kv_;
    return *this;
  }
  GgufWriter& kv_u32(std::string_view key, uint32_t v) { return kv(key, 4, le(v)); }
  GgufWriter& kv_str(std::string_view key, std::string_view v) { return kv(key, 8, gstr(v)); }

  // A tensor; its data is placed at the next aligned offset of the data section unless `offset` is given.
  GgufWriter& tensor(std::string_view name, std::vector<uint64_t> ne, uint32_t type, const std::string& data,
                     int64_t offset = -1) {
    while (data_.size() % alignment_) data_.push_back('\0');
    uint64_t off = offset >= 0 ? static_cast<uint64_t>(offset) : data_.size();
    infos_ += gstr(name) + le<uint32_t>(static_cast<uint32_t>(ne.size()));
    for (uint64_t n : ne) infos_ += le<uint64_t>(n);
    infos_ += le<uint32_t>(type) + le<uint64_t>(off);
    data_ += data;
    ++n_tensors_;
    return *this;
  }

  // Override the counts written in the header (to build lying files).
  GgufWriter& counts(uint64_t n_tensors, uint64_t n_kv) {
    n_tensors_override_ = n_tensors;
    n_kv_override_ = n_kv;
    has_override_ = true;
    return *this;
  }

  std::string bytes() const {
    std::string s = "GGUF" + le<uint32_t>(version_);
    s += le<uint64_t>(has_override_ ? n_tensors_override_ : n_tensors_);
    s += le<uint64_t>(has_override_ ? n_kv_override_ : n_kv_);
    s += kvs_ + infos_;
    if (n_tensors_ > 0) {
      while (s.size() % alignment_) s.push_back('\0');
      s += data_;
    }
    return s;
  }

  void write(const std::string& path) const {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    std::string b = bytes();
    f.write(b.data(), static_cast<std::streamsize>(b.size()));
  }

 private:
  uint32_t version_;
  uint64_t alignment_;
  std::string kvs_, infos_, data_;
  uint64_t n_kv_ = 0, n_tensors_ = 0;
  uint64_t n_kv_override_ = 0, n_tensors_override_ = 0;
  bool has_override_ = false;
};

// F32 values as raw bytes.
inline std::string f32_bytes(std::initializer_list<float> v) {
  std::string s;
  for (float x : v) s += le(x);
  return s;
}

}  // namespace dllm::test
