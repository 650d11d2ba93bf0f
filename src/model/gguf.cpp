// GGUF v2/v3 reader. The file is memory-mapped read-only; a bounds-checked cursor walks the header, the
// metadata key/value pairs and the tensor infos. Every count is checked against the bytes left before
// anything is sized from it, every size computation is overflow-checked, and every tensor's extent is
// checked against the file size at open time, so the rest of dllm can trust what File exposes.
#include "model/gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <algorithm>
#include <cstring>
#include <limits>
#include <unordered_map>
#include <unordered_set>

#include "common/error.h"
#include "common/printable.h"

namespace dllm::gguf {

namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as a little-endian u32
constexpr uint32_t kMaxDims = 4;
constexpr int kMaxArrayDepth = 8;         // nested arrays deeper than this are rejected (no real file has any)
constexpr uint64_t kMinKvBytes = 8 + 4 + 1;          // key length, value type, smallest value
constexpr uint64_t kMinTensorInfoBytes = 8 + 4 + 4 + 8;  // name length, n_dims, type, offset

// A name from the file for an error message: in single quotes, escaped for a terminal (common/printable.h), cut
// after 120 bytes.
std::string quoted(std::string_view s) {
  std::string r = "'";  // (appended, not "'" + ...: GCC 12 warns falsely about that form)
  r += escape_text(s, 120);
  r += '\'';
  return r;
}

// Smallest encoded size of one value of type t (for bounding array counts before allocating).
uint64_t min_value_bytes(ValueType t) {
  switch (t) {
    case ValueType::U8: case ValueType::I8: case ValueType::BOOL: return 1;
    case ValueType::U16: case ValueType::I16: return 2;
    case ValueType::U32: case ValueType::I32: case ValueType::F32: return 4;
    case ValueType::U64: case ValueType::I64: case ValueType::F64: return 8;
    case ValueType::STRING: return 8;      // the length; the bytes may be empty
    case ValueType::ARRAY: return 4 + 8;   // element type + count
  }
  return 1;
}

bool valid_value_type(uint32_t t) { return t <= static_cast<uint32_t>(ValueType::F64); }

// Name of a type id that ggml once had and removed; nullptr for ids it never had.
const char* removed_type_name(uint32_t id) {
  switch (id) {
    case 4: return "Q4_2";
    case 5: return "Q4_3";
    case 31: return "Q4_0_4_4";
    case 32: return "Q4_0_4_8";
    case 33: return "Q4_0_8_8";
    case 36: return "IQ4_NL_4_4";
    case 37: return "IQ4_NL_4_8";
    case 38: return "IQ4_NL_8_8";
    default: return nullptr;
  }
}

// A bounds-checked little-endian cursor over the mapping. `what` describes the item being read, for errors.
class Cursor {
 public:
  Cursor(const std::string& path, const uint8_t* base, uint64_t size) : path_(path), base_(base), size_(size) {}

  uint64_t pos() const { return pos_; }
  uint64_t left() const { return size_ - pos_; }
  std::string what;  // e.g. "metadata key #3 'general.name'"
  std::string note;  // appended to truncation errors, e.g. that the declared count was implausible

  [[noreturn]] void fail(const std::string& msg) const { throw Error(path_ + ": " + msg); }

  void need(uint64_t n) const {
    if (n > left())
      fail("truncated file: " + what + " needs " + std::to_string(n) + " bytes at offset " +
           std::to_string(pos_) + " but only " + std::to_string(left()) + " are left (file size " +
           std::to_string(size_) + ")" + note);
  }

  // The next n bytes (checked), skipped.
  const uint8_t* skip(uint64_t n) {
    need(n);
    const uint8_t* p = base_ + pos_;
    pos_ += n;
    return p;
  }

  template <typename T>
  T read() {
    need(sizeof(T));
    T v;
    std::memcpy(&v, base_ + pos_, sizeof(T));  // GGUF is little-endian, as is every host dllm supports
    pos_ += sizeof(T);
    return v;
  }

  std::string_view read_string() {
    uint64_t len = read<uint64_t>();
    if (len > left())
      fail("string length " + std::to_string(len) + " at offset " + std::to_string(pos_ - 8) +
           " exceeds the " + std::to_string(left()) + " bytes left in the file (truncated or corrupt file) in " +
           what + note);
    std::string_view s(reinterpret_cast<const char*>(base_ + pos_), len);
    pos_ += len;
    return s;
  }

 private:
  const std::string& path_;
  const uint8_t* base_;
  uint64_t size_;
  uint64_t pos_ = 0;
};

void read_value(Cursor& c, ValueType t, Value& v, int depth, uint64_t& nested_budget);

// Bytes of one element of a fixed-size type (0 for strings and arrays).
uint64_t scalar_bytes(ValueType t) {
  return t == ValueType::STRING || t == ValueType::ARRAY ? 0 : min_value_bytes(t);
}

// Decodes one scalar of type t from its little-endian bytes.
void decode_scalar(ValueType t, const uint8_t* p, Value& v) {
  v.type = t;
  auto set_unsigned = [&](uint64_t x) {
    v.u = x;
    v.i = x <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ? static_cast<int64_t>(x) : 0;
    v.f = static_cast<double>(x);
  };
  auto set_signed = [&](int64_t x) {
    v.i = x;
    v.u = x >= 0 ? static_cast<uint64_t>(x) : 0;
    v.f = static_cast<double>(x);
  };
  auto get = [&](auto x) {
    std::memcpy(&x, p, sizeof x);
    return x;
  };
  switch (t) {
    case ValueType::U8: set_unsigned(get(uint8_t{})); break;
    case ValueType::I8: set_signed(get(int8_t{})); break;
    case ValueType::U16: set_unsigned(get(uint16_t{})); break;
    case ValueType::I16: set_signed(get(int16_t{})); break;
    case ValueType::U32: set_unsigned(get(uint32_t{})); break;
    case ValueType::I32: set_signed(get(int32_t{})); break;
    case ValueType::U64: set_unsigned(get(uint64_t{})); break;
    case ValueType::I64: set_signed(get(int64_t{})); break;
    case ValueType::F32: v.f = get(float{}); break;
    case ValueType::F64: v.f = get(double{}); break;
    case ValueType::BOOL: v.u = v.i = get(uint8_t{}) != 0; break;
    default: break;
  }
}

void read_array(Cursor& c, Value& v, int depth, uint64_t& nested_budget) {
  if (depth >= kMaxArrayDepth)
    c.fail(c.what + " nests arrays deeper than " + std::to_string(kMaxArrayDepth) + " levels");
  uint32_t et = c.read<uint32_t>();
  if (!valid_value_type(et)) c.fail(c.what + " is an array with invalid element type " + std::to_string(et));
  v.elem_type = static_cast<ValueType>(et);
  uint64_t n = c.read<uint64_t>();
  uint64_t per = min_value_bytes(v.elem_type);
  if (n > c.left() / per)
    c.fail(c.what + " is an array of " + std::to_string(n) + " " + value_type_name(v.elem_type) +
           " elements, longer than the file: only " + std::to_string(c.left()) + " bytes are left");
  v.count = n;
  if (const uint64_t size = scalar_bytes(v.elem_type)) {  // scalars: a view of the mapping, nothing allocated
    v.raw = c.skip(n * size);  // bounded: n * size <= bytes left
  } else if (v.elem_type == ValueType::STRING) {
    v.strs.reserve(n);  // 16 bytes per element of at least 8 in the file
    for (uint64_t k = 0; k < n; ++k) v.strs.push_back(c.read_string());
  } else {
    if (n > nested_budget)
      c.fail(c.what + " holds more than " + std::to_string(kMaxNestedArrayElements) +
             " nested array elements in all (no model file has that many)");
    nested_budget -= n;
    v.arr.resize(n);  // bounded: n * per <= bytes left, and by the budget
    for (uint64_t k = 0; k < n; ++k) read_value(c, v.elem_type, v.arr[k], depth + 1, nested_budget);
  }
}

void read_value(Cursor& c, ValueType t, Value& v, int depth, uint64_t& nested_budget) {
  v.type = t;
  if (const uint64_t size = scalar_bytes(t)) {
    decode_scalar(t, c.skip(size), v);
  } else if (t == ValueType::STRING) {
    v.s = c.read_string();
  } else {
    read_array(c, v, depth, nested_budget);
  }
}

}  // namespace

const char* value_type_name(ValueType t) {
  switch (t) {
    case ValueType::U8: return "u8";
    case ValueType::I8: return "i8";
    case ValueType::U16: return "u16";
    case ValueType::I16: return "i16";
    case ValueType::U32: return "u32";
    case ValueType::I32: return "i32";
    case ValueType::F32: return "f32";
    case ValueType::BOOL: return "bool";
    case ValueType::STRING: return "str";
    case ValueType::ARRAY: return "arr";
    case ValueType::U64: return "u64";
    case ValueType::I64: return "i64";
    case ValueType::F64: return "f64";
  }
  return "invalid";
}

Value Value::at(size_t k) const {
  if (type != ValueType::ARRAY || k >= count) throw Error("internal error: metadata array element out of range");
  if (const uint64_t size = scalar_bytes(elem_type)) {
    Value e;
    decode_scalar(elem_type, raw + k * size, e);
    return e;
  }
  if (elem_type == ValueType::STRING) {
    Value e;
    e.type = ValueType::STRING;
    e.s = strs[k];
    return e;
  }
  return arr[k];
}

bool Value::is_integer() const {
  switch (type) {
    case ValueType::U8: case ValueType::I8: case ValueType::U16: case ValueType::I16:
    case ValueType::U32: case ValueType::I32: case ValueType::U64: case ValueType::I64: return true;
    default: return false;
  }
}

// ---- opening and mapping ----

std::unique_ptr<File> File::open(const std::string& path) {
  auto cannot_open = [&](int err) {
    std::string msg = "cannot open model file " + path + ": " + std::strerror(err);
    if (err == ENOENT) throw Error(msg, Error::kRuntime, "to download a model, run: ./dllm pull");
    throw Error(msg);
  };
  // stat first, so that a FIFO or device never blocks open() and a directory gets its own message.
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) cannot_open(errno);
  if (S_ISDIR(st.st_mode)) throw Error("is a directory: " + path);
  if (!S_ISREG(st.st_mode)) throw Error("cannot open model file " + path + ": not a regular file");

  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) cannot_open(errno);
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {  // failed, or replaced between stat and open
    int err = S_ISREG(st.st_mode) ? errno : EINVAL;
    ::close(fd);
    cannot_open(err);
  }

  std::unique_ptr<File> f(new File());
  f->path_ = path;
  f->size_ = static_cast<uint64_t>(st.st_size);
  if (f->size_ > 0) {
    void* p = ::mmap(nullptr, f->size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      int err = errno;
      ::close(fd);
      throw Error("cannot map model file " + path + ": " + std::strerror(err));
    }
    f->base_ = static_cast<const uint8_t*>(p);
    f->mapped_ = true;
  }
  ::close(fd);  // the mapping keeps the file alive
  f->parse();
  return f;
}

std::unique_ptr<File> File::from_memory(const void* data, size_t size, const std::string& name) {
  std::unique_ptr<File> f(new File());
  f->path_ = name;
  f->base_ = static_cast<const uint8_t*>(data);
  f->size_ = size;
  f->parse();
  return f;
}

File::~File() {
  if (mapped_) ::munmap(const_cast<uint8_t*>(base_), size_);
}

// ---- parsing ----

void File::parse() {
  static const char kBadMagicHint[] =
      "A failed download leaves an HTML error page with a .gguf name. Delete the file and run ./dllm pull again";
  if (size_ == 0) throw Error(path_ + " is not a GGUF file: it is empty (0 bytes, no magic).", Error::kRuntime, kBadMagicHint);
  if (size_ < 4 ? std::memcmp(base_, "GGUF", size_) != 0 : std::memcmp(base_, "GGUF", 4) != 0)
    throw Error(path_ + " is not a GGUF file (bad magic).", Error::kRuntime, kBadMagicHint);

  Cursor c(path_, base_, size_);
  c.what = "the GGUF header";
  if (c.read<uint32_t>() != kMagic) c.fail("internal error: magic");
  version_ = c.read<uint32_t>();
  if (version_ != 2 && version_ != 3) {
    uint32_t swapped = __builtin_bswap32(version_);
    std::string msg = "unsupported GGUF version " + std::to_string(version_);
    if (swapped == 2 || swapped == 3)
      msg += ": the file is big-endian (version " + std::to_string(swapped) +
             " with swapped byte order); dllm reads little-endian GGUF v2 and v3 only";
    else if (version_ == 1)
      msg += " (obsolete); dllm reads GGUF v2 and v3 only: convert the model again with a current llama.cpp";
    else
      msg += "; dllm reads GGUF v2 and v3 only";
    c.fail(msg);
  }
  const uint64_t n_tensors = c.read<uint64_t>();
  const uint64_t n_kv = c.read<uint64_t>();
  // Counts are never trusted for allocation: storage grows only as items are actually read, and the
  // initial reservation is bounded by what the bytes left could hold. A count the file cannot possibly
  // hold is named in the truncation error the parse then runs into.
  auto implausible = [&](uint64_t n, const char* items) {
    if (n <= c.left()) return std::string();  // small counts: plain truncation, named where it happens
    return "; the header declares " + std::to_string(n) + " " + items + ", an implausible count for the " +
           std::to_string(c.left()) + " bytes left (truncated or corrupt header)";
  };

  // Metadata.
  c.note = implausible(n_kv, "metadata key/value pairs");
  kvs_.reserve(std::min(n_kv, c.left() / kMinKvBytes));
  std::unordered_map<std::string_view, uint64_t> seen_keys;
  seen_keys.reserve(kvs_.capacity());
  const std::string of_kv = " of " + std::to_string(n_kv);
  uint64_t nested_budget = kMaxNestedArrayElements;
  for (uint64_t k = 0; k < n_kv; ++k) {
    if (k == kMaxMetadataKeys)
      c.fail("the header declares " + std::to_string(n_kv) + " metadata keys, more than the " +
             std::to_string(kMaxMetadataKeys) + " dllm reads (no model file has that many)");
    c.what = "metadata key #" + std::to_string(k) + of_kv;
    KeyValue& kv = kvs_.emplace_back();
    kv.key = c.read_string();
    c.what = "metadata key #" + std::to_string(k) + " " + quoted(kv.key);
    auto [it, inserted] = seen_keys.emplace(kv.key, k);
    if (!inserted)
      c.fail("duplicate metadata key " + quoted(kv.key) + " (entries #" + std::to_string(it->second) + " and #" +
             std::to_string(k) + ")");
    uint32_t t = c.read<uint32_t>();
    if (!valid_value_type(t)) c.fail("metadata key " + quoted(kv.key) + " has invalid value type " + std::to_string(t));
    read_value(c, static_cast<ValueType>(t), kv.value, 0, nested_budget);
  }

  if (const Value* a = find("general.alignment")) {
    if (a->type != ValueType::U32)
      c.fail(std::string("general.alignment has type ") + value_type_name(a->type) + ", expected u32");
    if (a->u == 0 || (a->u & (a->u - 1)) != 0)
      c.fail("general.alignment " + std::to_string(a->u) + " is not a power of two");
    alignment_ = a->u;
  }

  // Tensor infos.
  c.note = implausible(n_tensors, "tensors");
  tensors_.reserve(std::min(n_tensors, c.left() / kMinTensorInfoBytes));
  tensor_index_.reserve(tensors_.capacity());
  const std::string of_tensors = " of " + std::to_string(n_tensors);
  for (uint64_t k = 0; k < n_tensors; ++k) {
    if (k == kMaxTensors)
      c.fail("the header declares " + std::to_string(n_tensors) + " tensors, more than the " +
             std::to_string(kMaxTensors) + " dllm reads (no model file has that many)");
    TensorInfo& t = tensors_.emplace_back();
    c.what = "tensor info #" + std::to_string(k) + of_tensors;
    t.name = c.read_string();
    const std::string tn = "tensor " + quoted(t.name);
    c.what = "tensor info #" + std::to_string(k) + " (" + tn + ")";
    auto [it, inserted] = tensor_index_.emplace(t.name, k);
    if (!inserted)
      c.fail("duplicate tensor name " + quoted(t.name) + " (tensors #" + std::to_string(it->second) + " and #" +
             std::to_string(k) + ")");

    t.n_dims = c.read<uint32_t>();
    if (t.n_dims > kMaxDims)
      c.fail(tn + " has too many dimensions: " + std::to_string(t.n_dims) + " > " + std::to_string(kMaxDims));
    for (uint32_t d = 0; d < t.n_dims; ++d) {
      uint64_t ne = c.read<uint64_t>();
      if (ne > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        c.fail(tn + " has an invalid dimension " + std::to_string(d) + ": " + std::to_string(ne) + " (" +
               std::to_string(static_cast<int64_t>(ne)) + " as a signed 64-bit number)");
      t.ne[d] = static_cast<int64_t>(ne);
    }
    // The product of the nonzero dimensions must fit in int64: then every partial product that
    // n_elements() and n_rows() form fits too, whatever dimension is zero.
    {
      int64_t n = 1;
      for (int64_t ne : t.ne)
        if (ne != 0 && __builtin_mul_overflow(n, ne, &n))
          c.fail(tn + " has shape [" + std::to_string(t.ne[0]) + ", " + std::to_string(t.ne[1]) + ", " +
                 std::to_string(t.ne[2]) + ", " + std::to_string(t.ne[3]) + "]: its element count overflows 64 bits");
    }

    t.type_id = c.read<uint32_t>();
    auto info = ggml_type_info(t.type_id);
    if (!info) {
      std::string msg = "unknown tensor type " + std::to_string(t.type_id) + " for " + tn;
      if (const char* removed = removed_type_name(t.type_id))
        msg += std::string(" (type ") + removed + " was removed from ggml)";
      c.fail(msg);
    }
    t.type_info = *info;
    if (t.ne[0] % info->block_size != 0)
      c.fail(tn + " (" + info->name + ") has row length " + std::to_string(t.ne[0]) +
             ", not a multiple of the block size " + std::to_string(info->block_size));
    uint64_t row_bytes = 0, nbytes = 0;
    if (__builtin_mul_overflow(static_cast<uint64_t>(t.ne[0]) / info->block_size, uint64_t{info->type_size}, &row_bytes) ||
        __builtin_mul_overflow(row_bytes, static_cast<uint64_t>(t.n_rows()), &nbytes))
      c.fail(tn + " is too large: its size in bytes overflows 64 bits");
    t.nbytes = nbytes;

    t.offset = c.read<uint64_t>();
    if (t.offset % alignment_ != 0)
      c.fail(tn + " data offset " + std::to_string(t.offset) + " is not aligned to " + std::to_string(alignment_) +
             " bytes");
  }

  // The data section starts at the aligned end of the tensor infos. Without tensors it may lie past
  // the end of the file (writers add no padding then).
  data_offset_ = (c.pos() + alignment_ - 1) / alignment_ * alignment_;
  std::vector<const TensorInfo*> past_end;
  for (TensorInfo& t : tensors_) {
    uint64_t start = 0;
    if (__builtin_add_overflow(data_offset_, t.offset, &start) || start > size_ || t.nbytes > size_ - start)
      past_end.push_back(&t);
    else
      t.data = base_ + start;
  }
  if (!past_end.empty()) {
    const TensorInfo& t = *past_end[0];
    std::string msg = "tensor " + quoted(t.name);
    if (t.offset > size_ - std::min(size_, data_offset_))
      msg += " data offset " + std::to_string(t.offset) + " is past the end of the file (data section at " +
             std::to_string(data_offset_) + ", file size " + std::to_string(size_) + ")";
    else
      msg += " data (" + std::to_string(t.nbytes) + " bytes at file offset " + std::to_string(data_offset_ + t.offset) +
             ") runs past the end of the file (file size " + std::to_string(size_) + "): out of file bounds, truncated file";
    if (past_end.size() > 1) {
      msg += "; " + std::to_string(past_end.size() - 1) + " more tensor(s) past the end:";
      for (size_t k = 1; k < past_end.size() && k < 4; ++k) msg += " " + quoted(past_end[k]->name);
      if (past_end.size() > 4) msg += " ...";
    }
    c.fail(msg);
  }
}

// ---- lookups and typed getters ----

const Value* File::find(std::string_view key) const {
  for (const KeyValue& kv : kvs_)
    if (kv.key == key) return &kv.value;
  return nullptr;
}

const TensorInfo* File::find_tensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

namespace {

[[noreturn]] void wrong_type(std::string_view key, const Value& v, const char* expected) {
  std::string t = value_type_name(v.type);
  if (v.type == ValueType::ARRAY) t = "arr[" + std::string(value_type_name(v.elem_type)) + "]";
  throw Error("metadata key " + shown(key) + " has type " + t + ", expected " + expected);
}

bool is_signed_type(ValueType t) {
  return t == ValueType::I8 || t == ValueType::I16 || t == ValueType::I32 || t == ValueType::I64;
}

int64_t to_int64(std::string_view key, const Value& v) {
  if (!v.is_integer()) wrong_type(key, v, "an integer");
  if (!is_signed_type(v.type) && v.u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
    throw Error("metadata key " + shown(key) + " value " + std::to_string(v.u) + " does not fit in int64");
  return v.i;
}

}  // namespace

static const Value& require(const File& f, std::string_view key) {
  const Value* v = f.find(key);
  if (!v) throw Error("required metadata key missing: " + shown(key));
  return *v;
}

uint64_t File::get_uint(std::string_view key) const {
  const Value& v = require(*this, key);
  if (!v.is_integer()) wrong_type(key, v, "an unsigned integer");
  if (is_signed_type(v.type) && v.i < 0)
    throw Error("metadata key " + shown(key) + " is " + std::to_string(v.i) + ", expected a non-negative integer");
  return v.u;
}

int64_t File::get_int(std::string_view key) const { return to_int64(key, require(*this, key)); }

double File::get_float(std::string_view key) const {
  const Value& v = require(*this, key);
  if (!v.is_float() && !v.is_integer()) wrong_type(key, v, "a number");
  return v.f;
}

bool File::get_bool(std::string_view key) const {
  const Value& v = require(*this, key);
  if (v.type != ValueType::BOOL) wrong_type(key, v, "bool");
  return v.u != 0;
}

std::string_view File::get_string(std::string_view key) const {
  const Value& v = require(*this, key);
  if (v.type != ValueType::STRING) wrong_type(key, v, "str");
  return v.s;
}

std::vector<std::string_view> File::get_string_array(std::string_view key) const {
  const Value& v = require(*this, key);
  if (v.type != ValueType::ARRAY || v.elem_type != ValueType::STRING) wrong_type(key, v, "arr[str]");
  std::vector<std::string_view> out;
  return v.strs;
  return out;
}

std::vector<int64_t> File::get_int_array(std::string_view key) const {
  const Value& v = require(*this, key);
  Value probe;
  probe.type = v.elem_type;
  if (v.type != ValueType::ARRAY || !probe.is_integer()) wrong_type(key, v, "an array of integers");
  std::vector<int64_t> out;
  out.reserve(v.size());
  for (size_t k = 0; k < v.size(); ++k) out.push_back(to_int64(key, v.at(k)));
  return out;
}

}  // namespace dllm::gguf
