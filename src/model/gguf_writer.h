// GGUF v3 writer that streams: metadata and tensor infos are collected first, then the file is written in one
// pass, each tensor's bytes produced by a callback, so a multi-gigabyte model never sits in memory. The file is
// written under a temporary name and renamed into place only when complete.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "model/ggml_types.h"

namespace dllm::gguf {

// Where a tensor's bytes go; write() may be called any number of times with any sizes.
class DataSink {
 public:
  virtual ~DataSink() = default;
  virtual void write(const void* data, size_t n) = 0;
};

class Writer {
 public:
  explicit Writer(uint32_t alignment = 32);

  void add_u32(const std::string& key, uint32_t v);
  void add_i32(const std::string& key, int32_t v);
  void add_u64(const std::string& key, uint64_t v);
  void add_f32(const std::string& key, float v);
  void add_bool(const std::string& key, bool v);
  void add_string(const std::string& key, const std::string& v);
  void add_string_array(const std::string& key, const std::vector<std::string>& v);
  void add_i32_array(const std::string& key, const std::vector<int32_t>& v);
  void add_f32_array(const std::string& key, const std::vector<float>& v);
  void add_bool_array(const std::string& key, const std::vector<bool>& v);

  // Declares a tensor (ne[0] = row length); its bytes come from the callback given to write().
  // Throws dllm::Error when ne[0] is not a multiple of the type's block size.
  void add_tensor(const std::string& name, GgmlType type, const std::vector<int64_t>& ne);

  size_t n_tensors() const { return tensors_.size(); }
  uint64_t tensor_bytes(size_t i) const { return tensors_[i].nbytes; }
  // Size of the finished file.
  uint64_t file_size() const;

  // Writes the file. produce(i, sink) must write exactly tensor_bytes(i) bytes for tensor i (checked).
  // Tensors are produced in declaration order. Throws dllm::Error naming the path on I/O failure and
  // leaves no file under `path` then.
  void write(const std::string& path, const std::function<void(size_t tensor, DataSink& sink)>& produce) const;

 private:
  struct Tensor {
    std::string name;
    GgmlType type;
    std::vector<int64_t> ne;
    uint64_t nbytes = 0;
    uint64_t offset = 0;
  };
  void add_kv(const std::string& key, uint32_t type, const std::string& encoded);
  std::string header_bytes() const;

  uint32_t alignment_;
  uint64_t n_kv_ = 0;
  std::string kv_bytes_;
  std::vector<Tensor> tensors_;
  uint64_t data_size_ = 0;
};

}  // namespace dllm::gguf
