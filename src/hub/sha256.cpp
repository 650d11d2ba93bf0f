// Sha256 on OpenSSL's EVP digest interface.
#include "hub/sha256.h"

#include <openssl/evp.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

#include "common/error.h"

namespace dllm::hub {

namespace {
EVP_MD_CTX* ctx_of(void* p) { return static_cast<EVP_MD_CTX*>(p); }
}  // namespace

Sha256::Sha256() : ctx_(EVP_MD_CTX_new()) {
  if (!ctx_) throw Error("SHA-256: cannot allocate a digest context");
  reset();
}

Sha256::~Sha256() { EVP_MD_CTX_free(ctx_of(ctx_)); }

void Sha256::reset() {
  if (EVP_DigestInit_ex(ctx_of(ctx_), EVP_sha256(), nullptr) != 1) throw Error("SHA-256: digest init failed");
}

void Sha256::update(const void* data, size_t n) {
  if (n && EVP_DigestUpdate(ctx_of(ctx_), data, n) != 1) throw Error("SHA-256: digest update failed");
}

std::string Sha256::hex_digest() {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (EVP_DigestFinal_ex(ctx_of(ctx_), md, &len) != 1) throw Error("SHA-256: digest final failed");
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (unsigned i = 0; i < len; ++i) out += hex[md[i] >> 4], out += hex[md[i] & 15];
  return out;
}

std::string sha256_hex(std::string_view data) {
  Sha256 h;
  h.update(data);
  return h.hex_digest();
}

std::string sha256_file(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) throw Error("cannot read " + path + ": " + std::strerror(errno));
  Sha256 h;
  std::vector<char> buf(1 << 20);
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), f)) > 0) h.update(buf.data(), n);
  bool failed = std::ferror(f);
  std::fclose(f);
  if (failed) throw Error("cannot read " + path + ": read error");
  return h.hex_digest();
}

}  // namespace dllm::hub
