// GGUF v2/v3 reader: memory-maps a file, parses header, metadata and tensor infos, and checks every
// count, length, offset and extent against the file size (and against overflow) before it is used.
// Nothing is allocated from an untrusted count before that count is checked against the bytes left.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "model/ggml_types.h"

namespace dllm::gguf {

enum class ValueType : uint32_t {
  U8 = 0, I8 = 1, U16 = 2, I16 = 3, U32 = 4, I32 = 5, F32 = 6, BOOL = 7,
  STRING = 8, ARRAY = 9, U64 = 10, I64 = 11, F64 = 12,
};
const char* value_type_name(ValueType t);  // "u32", "str", "arr", ...

// One metadata value. Scalars are widened into the fields below; strings point into the mapping. Arrays are kept
// compact, so metadata never takes much more memory than its bytes in the file: an array of scalars stays in the
// mapping (decoded by at()), an array of strings is a list of views, and only arrays of arrays hold Values.
struct Value {
  ValueType type = ValueType::U8;
  uint64_t u = 0;          // unsigned integers and bool (0/1)
  int64_t i = 0;           // signed integers (also set for unsigned values that fit)
  double f = 0;            // F32 / F64 (also set for every integer type)
  std::string_view s;      // STRING
  ValueType elem_type = ValueType::U8;  // ARRAY: type of the elements
  uint64_t count = 0;                   // ARRAY: number of elements
  const uint8_t* raw = nullptr;         // ARRAY of scalars: the first element's bytes in the mapping
  std::vector<std::string_view> strs;   // ARRAY of strings: the elements
  std::vector<Value> arr;               // ARRAY of arrays: the elements (nested arrays allowed)

  size_t size() const { return static_cast<size_t>(count); }  // ARRAY: number of elements
  Value at(size_t k) const;                                   // ARRAY: element k (k < size())
  bool is_integer() const;
  bool is_float() const { return type == ValueType::F32 || type == ValueType::F64; }
};

struct KeyValue {
  std::string_view key;
  Value value;
};

struct TensorInfo {
  std::string_view name;
  uint32_t type_id = 0;        // raw GGUF type id
  GgmlTypeInfo type_info{};    // its geometry (the reader rejects unknown ids)
  uint32_t n_dims = 0;
  int64_t ne[4] = {1, 1, 1, 1};  // ne[0] is the row length (contiguous)
  uint64_t offset = 0;         // relative to the data section
  uint64_t nbytes = 0;
  const uint8_t* data = nullptr;  // into the mapping

  GgmlType type() const { return type_info.type; }
  int64_t n_elements() const { return ne[0] * ne[1] * ne[2] * ne[3]; }
  int64_t n_rows() const { return ne[1] * ne[2] * ne[3]; }
  uint64_t row_bytes() const { return static_cast<uint64_t>(ne[0]) / type_info.block_size * type_info.type_size; }
};

// Bounds past which a file is refused with a clear error rather than parsed: far beyond any real model (LLaDA-8B
// has about 40 keys and 291 tensors), they keep the memory the metadata takes to a few tens of MB.
inline constexpr uint64_t kMaxMetadataKeys = 65536;
inline constexpr uint64_t kMaxTensors = 262144;
inline constexpr uint64_t kMaxNestedArrayElements = 65536;  // elements of arrays of arrays, in all

class File {
 public:
  // Opens and validates the whole file. Throws dllm::Error (exit 1) naming the problem:
  // "cannot open model file PATH: <OS reason>", "is a directory: PATH", "PATH is not a GGUF file (bad magic).", ...
  static std::unique_ptr<File> open(const std::string& path);
  // Parses bytes already in memory (the fuzzer and tests use it). The File does not own them: they must
  // outlive it. `name` stands in for the path in error messages.
  static std::unique_ptr<File> from_memory(const void* data, size_t size, const std::string& name);
  ~File();
  File(const File&) = delete;
  File& operator=(const File&) = delete;

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t file_size() const { return size_; }
  uint64_t data_offset() const { return data_offset_; }  // start of the tensor data section

  const std::vector<KeyValue>& metadata() const { return kvs_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }

  const Value* find(std::string_view key) const;          // nullptr when absent
  const TensorInfo* find_tensor(std::string_view name) const;

  // Typed getters: throw Error("required metadata key missing: KEY") when absent and
  // Error("metadata key KEY has type T, expected ...") when the type does not fit.
  uint64_t get_uint(std::string_view key) const;
  int64_t get_int(std::string_view key) const;
  double get_float(std::string_view key) const;   // accepts integer values too
  bool get_bool(std::string_view key) const;
  std::string_view get_string(std::string_view key) const;
  std::vector<std::string_view> get_string_array(std::string_view key) const;
  std::vector<int64_t> get_int_array(std::string_view key) const;

  // The raw bytes of the mapping (for tests and tools).
  const uint8_t* base() const { return base_; }

 private:
  File() = default;
  void parse();

  std::string path_;
  const uint8_t* base_ = nullptr;
  uint64_t size_ = 0;
  bool mapped_ = false;  // base_ is our mapping (munmap in the destructor)
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::vector<KeyValue> kvs_;
  std::vector<TensorInfo> tensors_;
  std::unordered_map<std::string_view, size_t> tensor_index_;  // name -> index in tensors_
};

}  // namespace dllm::gguf
