// SHA-256 (FIPS 180-4), incremental: downloads hash their bytes as they arrive and compare the digest with the
// value the hub publishes. Portable C++ with no dependency (see sha256.cpp for why not libcrypto).
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace dllm::hub {

class Sha256 {
 public:
  Sha256();
  void update(const void* data, size_t n);
  void update(std::string_view s) { update(s.data(), s.size()); }
  // The digest as 64 lowercase hex digits. Finishes the hash: call reset() before reusing the object.
  std::string hex_digest();
  void reset();

 private:
  void block(const uint8_t* p);
  std::array<uint32_t, 8> h_;
  std::array<uint8_t, 64> buf_;
  size_t buf_len_ = 0;
  uint64_t total_ = 0;  // bytes hashed so far
};

// The digest of a whole string, or of a whole file (throws dllm::Error naming the file when it cannot be read).
std::string sha256_hex(std::string_view data);
std::string sha256_file(const std::string& path);

}  // namespace dllm::hub
