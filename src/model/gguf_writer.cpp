// GGUF writer: little-endian encoding of metadata and tensor infos, aligned data section, atomic rename.
#include "model/gguf_writer.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <set>
#include <unistd.h>

#include "common/error.h"

namespace dllm::gguf {

namespace {

template <typename T>
std::string le(T v) {
  std::string s(sizeof(T), '\0');
  std::memcpy(s.data(), &v, sizeof(T));
  return s;
}

std::string gstr(const std::string& s) { return le<uint64_t>(s.size()) + s; }

uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

constexpr uint32_t kU32 = 4, kI32 = 5, kF32 = 6, kBool = 7, kString = 8, kArray = 9, kU64 = 10;

class FileSink : public DataSink {
 public:
  FileSink(FILE* f, const std::string& path) : f_(f), path_(path) {}
  void write(const void* data, size_t n) override {
    if (n && std::fwrite(data, 1, n, f_) != n)
      throw Error("cannot write " + path_ + ": " + std::strerror(errno));
    written_ += n;
  }
  uint64_t written() const { return written_; }
  void reset() { written_ = 0; }

 private:
  FILE* f_;
  std::string path_;
  uint64_t written_ = 0;
};

}  // namespace

Writer::Writer(uint32_t alignment) : alignment_(alignment) {
  if (alignment == 0 || (alignment & (alignment - 1)))
    throw Error("GGUF alignment must be a power of two, got " + std::to_string(alignment));
  if (alignment != 32) add_u32("general.alignment", alignment);
}

void Writer::add_kv(const std::string& key, uint32_t type, const std::string& encoded) {
  kv_bytes_ += gstr(key) + le<uint32_t>(type) + encoded;
  ++n_kv_;
}

void Writer::add_u32(const std::string& key, uint32_t v) { add_kv(key, kU32, le(v)); }
void Writer::add_i32(const std::string& key, int32_t v) { add_kv(key, kI32, le(v)); }
void Writer::add_u64(const std::string& key, uint64_t v) { add_kv(key, kU64, le(v)); }
void Writer::add_f32(const std::string& key, float v) { add_kv(key, kF32, le(v)); }
void Writer::add_bool(const std::string& key, bool v) { add_kv(key, kBool, std::string(1, v ? 1 : 0)); }
void Writer::add_string(const std::string& key, const std::string& v) { add_kv(key, kString, gstr(v)); }

void Writer::add_string_array(const std::string& key, const std::vector<std::string>& v) {
  std::string b = le<uint32_t>(kString) + le<uint64_t>(v.size());
  for (const auto& s : v) b += gstr(s);
  add_kv(key, kArray, b);
}

void Writer::add_i32_array(const std::string& key, const std::vector<int32_t>& v) {
  std::string b = le<uint32_t>(kI32) + le<uint64_t>(v.size());
  b.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(int32_t));
  add_kv(key, kArray, b);
}

void Writer::add_bool_array(const std::string& key, const std::vector<bool>& v) {
  std::string b = le<uint32_t>(kBool) + le<uint64_t>(v.size());
  for (bool x : v) b += static_cast<char>(x ? 1 : 0);
  add_kv(key, kArray, b);
}

void Writer::add_f32_array(const std::string& key, const std::vector<float>& v) {
  std::string b = le<uint32_t>(kF32) + le<uint64_t>(v.size());
  b.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
  add_kv(key, kArray, b);
}

void Writer::add_tensor(const std::string& name, GgmlType type, const std::vector<int64_t>& ne) {
  auto info = ggml_type_info(static_cast<uint32_t>(type));
  if (!info) throw Error("cannot write tensor " + name + ": unknown type");
  if (ne.empty() || ne.size() > 4) throw Error("cannot write tensor " + name + ": needs 1 to 4 dimensions");
  if (ne[0] % info->block_size)
    throw Error("cannot write tensor " + name + ": row length " + std::to_string(ne[0]) +
                " is not a multiple of the block size " + std::to_string(info->block_size) + " of " + info->name);
  for (const auto& t : tensors_)
    if (t.name == name) throw Error("cannot write tensor " + name + ": duplicate name");
  uint64_t rows = 1;
  for (size_t i = 1; i < ne.size(); ++i) rows *= static_cast<uint64_t>(ne[i]);
  Tensor t{name, type, ne, static_cast<uint64_t>(ne[0]) / info->block_size * info->type_size * rows, 0};
  t.offset = align_up(data_size_, alignment_);
  data_size_ = t.offset + t.nbytes;
  tensors_.push_back(std::move(t));
}

std::string Writer::header_bytes() const {
  std::string h = "GGUF" + le<uint32_t>(3) + le<uint64_t>(tensors_.size()) + le<uint64_t>(n_kv_) + kv_bytes_;
  for (const auto& t : tensors_) {
    h += gstr(t.name) + le<uint32_t>(static_cast<uint32_t>(t.ne.size()));
    for (int64_t d : t.ne) h += le<uint64_t>(static_cast<uint64_t>(d));
    h += le<uint32_t>(static_cast<uint32_t>(t.type)) + le<uint64_t>(t.offset);
  }
  h.resize(align_up(h.size(), alignment_), '\0');
  return h;
}

uint64_t Writer::file_size() const { return header_bytes().size() + data_size_; }

void Writer::write(const std::string& path, const std::function<void(size_t, DataSink&)>& produce) const {
  const std::string tmp = path + ".partial";
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) throw Error("cannot create " + tmp + ": " + std::strerror(errno));
  try {
    FileSink sink(f, tmp);
    const std::string header = header_bytes();
    sink.write(header.data(), header.size());
    uint64_t pos = 0;
    static const char zeros[64] = {};
    for (size_t i = 0; i < tensors_.size(); ++i) {
      const Tensor& t = tensors_[i];
      while (pos < t.offset) {
        size_t n = static_cast<size_t>(std::min<uint64_t>(sizeof zeros, t.offset - pos));
        sink.write(zeros, n);
        pos += n;
      }
      sink.reset();
      produce(i, sink);
      if (sink.written() != t.nbytes)
        throw Error("tensor " + t.name + ": produced " + std::to_string(sink.written()) + " bytes, expected " +
                    std::to_string(t.nbytes));
      pos += t.nbytes;
    }
    if (std::fflush(f) != 0 || fsync(fileno(f)) != 0)
      throw Error("cannot write " + tmp + ": " + std::strerror(errno));
  } catch (...) {
    std::fclose(f);
    std::remove(tmp.c_str());
    throw;
  }
  if (std::fclose(f) != 0) {
    std::remove(tmp.c_str());
    throw Error("cannot write " + tmp + ": " + std::strerror(errno));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    int e = errno;
    std::remove(tmp.c_str());
    throw Error("cannot rename " + tmp + " to " + path + ": " + std::strerror(e));
  }
}

}  // namespace dllm::gguf
