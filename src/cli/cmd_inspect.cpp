// dllm inspect PATH [--json] [--tensor NAME --out FILE]: prints what a GGUF file holds (version,
// metadata with long arrays summarised, a count per tensor type, every tensor's type and shape, sizes),
// for any architecture; --json prints the same as one JSON object. --tensor NAME --out FILE writes that
// tensor dequantized to little-endian f32 (row-major, ne0 fastest) through a temp file and a rename.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/args.h"
#include "common/error.h"
#include "model/gguf.h"
#include "common/interrupt.h"
#include "common/printable.h"
#include "model/quant.h"

namespace dllm::cli {

namespace {

using gguf::Value;
using gguf::ValueType;
using Json = nlohmann::ordered_json;

constexpr size_t kTextArrayItems = 8;   // array items shown in the text listing
constexpr size_t kJsonArrayItems = 8;   // array items kept in the JSON summary
constexpr size_t kTextStringMax = 160;  // longer strings are cut in the text listing
constexpr size_t kTextItemStringMax = 40;

// ---- formatting helpers ----

// The string escaped for a terminal (common/printable.h), cut after about `max` bytes.
std::string escape(std::string_view s, size_t max) { return escape_text(s, max); }

std::string quote(std::string_view s, size_t max) {
  std::string r(1, '"');
  r += escape(s, max);
  r += '"';
  return r;
}

std::string fmt_f32(float f) {
  char buf[32];
  auto res = std::to_chars(buf, buf + sizeof buf, f, std::chars_format::general);
  return std::string(buf, res.ptr);
}

std::string fmt_f64(double d) {
  char buf[32];
  auto res = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::general);
  return std::string(buf, res.ptr);
}

bool is_signed(ValueType t) {
  return t == ValueType::I8 || t == ValueType::I16 || t == ValueType::I32 || t == ValueType::I64;
}

std::string type_label(const Value& v) {
  if (v.type != ValueType::ARRAY) return gguf::value_type_name(v.type);
  return std::string("arr[") + gguf::value_type_name(v.elem_type) + ", " + std::to_string(v.size()) + "]";
}

// A value for the text listing. Arrays show their first items and how many more there are.
std::string fmt_value(const Value& v, size_t str_max) {
  switch (v.type) {
    case ValueType::F32: return fmt_f32(static_cast<float>(v.f));
    case ValueType::F64: return fmt_f64(v.f);
    case ValueType::BOOL: return v.u ? "true" : "false";
    case ValueType::STRING: {
      std::string q = quote(v.s, str_max);
      if (v.s.size() > str_max) q += " (" + std::to_string(v.s.size()) + " bytes)";
      return q;
    }
    case ValueType::ARRAY: {
      std::string r = "[";
      size_t shown = std::min(v.size(), kTextArrayItems);
      for (size_t k = 0; k < shown; ++k) {
        if (k) r += ", ";
        r += fmt_value(v.at(k), kTextItemStringMax);
      }
      if (shown < v.size()) r += ", ... " + std::to_string(v.size() - shown) + " more";
      return r + "]";
    }
    default: return is_signed(v.type) ? std::to_string(v.i) : std::to_string(v.u);
  }
}

// A value for JSON. f32 values become the double of their shortest decimal form (1e-05, not
// 9.99999974737875e-06); arrays become {type, elem_type, length, first}.
Json json_value(const Value& v) {
  switch (v.type) {
    case ValueType::F32: {
      float f = static_cast<float>(v.f);
      if (!std::isfinite(f)) return Json(nullptr);  // NaN / Inf have no JSON form
      return Json(std::stod(fmt_f32(f)));
    }
    case ValueType::F64: return Json(v.f);
    case ValueType::BOOL: return Json(v.u != 0);
    case ValueType::STRING: return Json(std::string(v.s));
    case ValueType::ARRAY: {
      Json j;
      j["type"] = "arr";
      j["elem_type"] = gguf::value_type_name(v.elem_type);
      j["length"] = v.size();
      Json first = Json::array();
      for (size_t k = 0; k < std::min(v.size(), kJsonArrayItems); ++k) first.push_back(json_value(v.at(k)));
      j["first"] = std::move(first);
      return j;
    }
    default: return is_signed(v.type) ? Json(v.i) : Json(v.u);
  }
}

std::string fmt_shape(const gguf::TensorInfo& t) {
  std::string r = "[";
  for (uint32_t d = 0; d < t.n_dims; ++d) r += (d ? ", " : "") + std::to_string(t.ne[d]);
  return r + "]";
}

Json json_shape(const gguf::TensorInfo& t) {
  Json s = Json::array();
  for (uint32_t d = 0; d < t.n_dims; ++d) s.push_back(t.ne[d]);
  return s;
}

std::string fmt_bytes(uint64_t n) {
  char buf[64];
  if (n >= (uint64_t{1} << 30))
    std::snprintf(buf, sizeof buf, " (%.2f GiB)", static_cast<double>(n) / (1 << 30));
  else if (n >= (uint64_t{1} << 20))
    std::snprintf(buf, sizeof buf, " (%.2f MiB)", static_cast<double>(n) / (1 << 20));
  else if (n >= 1024)
    std::snprintf(buf, sizeof buf, " (%.1f KiB)", static_cast<double>(n) / 1024);
  else
    buf[0] = 0;
  return std::to_string(n) + " bytes" + buf;
}

uint64_t total_tensor_bytes(const gguf::File& f) {
  uint64_t n = 0;
  for (const auto& t : f.tensors()) n += t.nbytes;  // each extent lies inside the file: no overflow
  return n;
}

std::map<uint32_t, size_t> type_counts(const gguf::File& f) {
  std::map<uint32_t, size_t> counts;
  for (const auto& t : f.tensors()) ++counts[t.type_id];
  return counts;
}

// ---- the listing ----

void print_text(const gguf::File& f, std::ostream& out) {
  out << "GGUF v" << f.version() << ": " << f.path() << "\n";
  out << "file size: " << fmt_bytes(f.file_size()) << "; alignment " << f.alignment()
      << "; tensor data at offset " << f.data_offset() << "\n\n";

  out << "metadata (" << f.metadata().size() << " keys):\n";
  for (const auto& kv : f.metadata())
    out << "  " << escape(kv.key, 256) << ": " << type_label(kv.value) << " = " << fmt_value(kv.value, kTextStringMax) << "\n";

  out << "\ntensor types (" << f.tensors().size() << " tensors):\n";
  for (const auto& [id, n] : type_counts(f)) out << "  " << ggml_type_name(id) << ": " << n << "\n";

  out << "\ntensors:\n";
  size_t name_w = 4, type_w = 4, shape_w = 5;
  for (const auto& t : f.tensors()) {
    name_w = std::max(name_w, std::min<size_t>(escape(t.name, 64).size(), 64));
    type_w = std::max(type_w, std::strlen(t.type_info.name));
    shape_w = std::max(shape_w, fmt_shape(t).size());
  }
  auto pad = [](std::string s, size_t w) { return s.size() < w ? s + std::string(w - s.size(), ' ') : s; };
  out << "  " << pad("name", name_w) << "  " << pad("type", type_w) << "  " << pad("shape", shape_w)
      << "  bytes\n";
  for (const auto& t : f.tensors()) {
    out << "  " << pad(escape(t.name, 64), name_w) << "  " << pad(t.type_info.name, type_w) << "  " << pad(fmt_shape(t), shape_w)
        << "  " << t.nbytes << "\n";
  }
  out << "\ntotal tensor data: " << fmt_bytes(total_tensor_bytes(f)) << " in " << f.tensors().size()
      << " tensors\n";
}

void print_json(const gguf::File& f, std::ostream& out) {
  Json j;
  j["file"] = f.path();
  j["version"] = f.version();
  j["alignment"] = f.alignment();
  j["data_offset"] = f.data_offset();
  Json meta = Json::object();
  for (const auto& kv : f.metadata()) {
    const std::string key(kv.key);
    if (kv.value.type == ValueType::ARRAY) {
      meta[key] = json_value(kv.value);
    } else {
      meta[key]["type"] = gguf::value_type_name(kv.value.type);
      meta[key]["value"] = json_value(kv.value);
    }
  }
  j["metadata"] = std::move(meta);
  Json counts = Json::object();
  for (const auto& [id, n] : type_counts(f)) counts[ggml_type_name(id)] = n;
  j["tensor_type_counts"] = std::move(counts);
  Json tensors = Json::array();
  for (const auto& t : f.tensors()) {
    Json e;
    e["name"] = std::string(t.name);
    e["type"] = t.type_info.name;
    e["shape"] = json_shape(t);
    e["offset"] = t.offset;
    e["nbytes"] = t.nbytes;
    tensors.push_back(std::move(e));
  }
  j["tensors"] = std::move(tensors);
  j["sizes"] = {{"file", f.file_size()}, {"tensor_data", total_tensor_bytes(f)}, {"header", f.data_offset()}};
  out << j.dump(2, ' ', false, Json::error_handler_t::replace) << "\n";
}

// ---- --tensor NAME --out FILE ----

[[noreturn]] void no_such_tensor(const gguf::File& f, const std::string& name) {
  std::string msg = "no tensor named '" + name + "' in " + f.path();
  std::string_view best;
  size_t best_d = std::max<size_t>(3, name.size() / 4) + 1;
  for (const auto& t : f.tensors()) {
    if (t.name.size() > name.size() + best_d || name.size() > t.name.size() + best_d) continue;
    size_t d = edit_distance(name, t.name);
    if (d < best_d) best_d = d, best = t.name;
  }
  if (!best.empty()) msg += " (did you mean '" + std::string(best) + "'?)";
  else if (f.tensors().empty()) msg += " (the file has no tensors)";
  throw Error(msg, Error::kRuntime, "run: dllm inspect " + f.path() + " to list its tensors");
}

// A temp file next to the destination; removed unless commit() renamed it over the destination.
class AtomicFile {
 public:
  explicit AtomicFile(const std::string& dest) : dest_(dest), tmp_(dest + ".tmp-XXXXXX") {
    fd_ = ::mkstemp(tmp_.data());
    if (fd_ < 0) fail(errno);
    mode_t mask = ::umask(0);
    ::umask(mask);
    ::fchmod(fd_, 0666 & ~mask);  // mkstemp makes 0600; give the file the usual permissions
  }
  ~AtomicFile() {
    if (fd_ >= 0) ::close(fd_);
    if (!committed_) ::unlink(tmp_.c_str());
  }
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* data, size_t n) {
    const char* p = static_cast<const char*>(data);
    while (n > 0) {
      ssize_t w = ::write(fd_, p, n);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) fail(w < 0 ? errno : EIO);
      p += w;
      n -= static_cast<size_t>(w);
    }
  }
  void commit() {
    if (::fsync(fd_) != 0) fail(errno);
    int rc = ::close(fd_);
    fd_ = -1;
    if (rc != 0) fail(errno);
    if (::rename(tmp_.c_str(), dest_.c_str()) != 0) fail(errno);
    committed_ = true;
  }

 private:
  [[noreturn]] void fail(int err) { throw Error("cannot write output file " + dest_ + ": " + std::strerror(err)); }
  std::string dest_, tmp_;
  int fd_ = -1;
  bool committed_ = false;
};

// Writes the tensor as f32, row-major with ne0 fastest, decoding about 4 MiB of output at a time.
void write_tensor_f32(const gguf::TensorInfo& t, const std::string& out) {
  static_assert(std::endian::native == std::endian::little, "the f32 output is written as host floats");
  InterruptScope interrupt_scope;  // Ctrl-C: the temp file is removed (by ~AtomicFile), nothing is left behind
  AtomicFile file(out);
  const int64_t ne0 = t.ne[0], rows = t.n_rows();
  if (ne0 > 0 && rows > 0) {
    const int64_t chunk = std::max<int64_t>(1, (int64_t{1} << 20) / ne0);
    std::vector<float> buf(static_cast<size_t>(std::min(rows, chunk) * ne0));
    for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
      const int64_t nr = std::min(chunk, rows - r0);
      throw_if_interrupted(": " + out + " was not written");
      for (int64_t r = 0; r < nr; ++r)
        quant::dequantize_row(t.type(), t.data + static_cast<uint64_t>(r0 + r) * t.row_bytes(), buf.data() + r * ne0,
                              ne0);
      file.write(buf.data(), static_cast<size_t>(nr * ne0) * sizeof(float));
    }
  }
  throw_if_interrupted(": " + out + " was not written");
  file.commit();
}

void dump_tensor(const gguf::File& f, const Settings& s, std::ostream& out) {
  const gguf::TensorInfo* t = f.find_tensor(s.tensor);
  if (!t) no_such_tensor(f, s.tensor);
  if (!quant::can_dequantize(t->type()))
    throw Error(std::string("unsupported GGUF tensor type: ") + t->type_info.name + " (tensor " + s.tensor + ")");
  struct stat in_st, out_st;
  if (::stat(f.path().c_str(), &in_st) == 0 && ::stat(s.out.c_str(), &out_st) == 0 &&
      in_st.st_dev == out_st.st_dev && in_st.st_ino == out_st.st_ino)
    throw Error("refusing to overwrite the model file " + f.path() + " with tensor data: choose another --out");
  write_tensor_f32(*t, s.out);
  if (s.json) {
    Json j;
    j["tensor"] = s.tensor;
    j["type"] = t->type_info.name;
    j["shape"] = json_shape(*t);
    j["elements"] = t->n_elements();
    j["out"] = s.out;
    j["bytes"] = static_cast<uint64_t>(t->n_elements()) * sizeof(float);
    out << j.dump(2, ' ', false, Json::error_handler_t::replace) << "\n";
  } else {
    out << "wrote tensor " << quote(s.tensor, 256) << " (" << t->type_info.name << " " << fmt_shape(*t) << ", "
        << t->n_elements() << " values) to " << s.out << " as little-endian f32\n";
  }
}

}  // namespace

// The command with its output stream as a parameter (tests pass a std::ostringstream).
int cmd_inspect(const Settings& s, std::ostream& out) {
  if (s.path.empty()) throw usage_error("missing model path for 'inspect'");
  if (!s.tensor.empty() && s.out.empty()) throw usage_error("flag --tensor needs --out FILE for 'inspect'");
  if (s.tensor.empty() && !s.out.empty()) throw usage_error("flag --out needs --tensor NAME for 'inspect'");
  auto f = gguf::File::open(s.path);
  if (!s.tensor.empty())
    dump_tensor(*f, s, out);
  else if (s.json)
    print_json(*f, out);
  else
    print_text(*f, out);
  out.flush();
  return 0;
}

int cmd_inspect(const Settings& s) { return cmd_inspect(s, std::cout); }

}  // namespace dllm::cli
