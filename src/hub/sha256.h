// SHA-256, incremental: downloads hash their bytes as they arrive and compare the digest with the value the
// hub publishes. A thin wrapper over OpenSSL's EVP interface (libcrypto, already loaded by libcurl).
#pragma once
#include <cstddef>
#include <string>
#include <string_view>

namespace dllm::hub {

class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;
  void update(const void* data, size_t n);
  void update(std::string_view s) { update(s.data(), s.size()); }
  // The digest as 64 lowercase hex digits. Finishes the hash: call reset() before reusing the object.
  std::string hex_digest();
  void reset();

 private:
  void* ctx_;  // EVP_MD_CTX
};

// The digest of a whole string, or of a whole file (throws dllm::Error naming the file when it cannot be read).
std::string sha256_hex(std::string_view data);
std::string sha256_file(const std::string& path);

}  // namespace dllm::hub
