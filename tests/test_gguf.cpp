// GGUF reader tests: every malformed fixture fails with an error naming its problem; the valid controls,
// the quant fixtures and the tiny models load with the right values; v2 files, every value type, nested
// arrays, alignment, the typed getters, open errors; and the fuzzer's regression inputs.
#include <dirent.h>
#include <malloc.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "gguf_test_writer.h"
#include "common/error.h"
#include "model/gguf.h"
#include "support.h"

namespace {

using dllm::Error;
using dllm::GgmlType;
using dllm::gguf::File;
using dllm::gguf::ValueType;
using dllm::test::data_path;
using dllm::test::garr;
using dllm::test::GgufWriter;
using dllm::test::gstr;
using dllm::test::le;

std::vector<std::string> list_dir(const std::string& dir, const std::string& suffix) {
  std::vector<std::string> out;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      std::string n = e->d_name;
      if (n.size() > suffix.size() && n.compare(n.size() - suffix.size(), suffix.size(), suffix) == 0)
        out.push_back(n);
    }
    closedir(d);
  }
  std::sort(out.begin(), out.end());
  return out;
}

// The Error File::open throws for `path`; fails the test when it loads.
Error open_error(const std::string& path) {
  try {
    File::open(path);
  } catch (const Error& e) {
    return e;
  }
  ADD_FAILURE() << path << " loaded, expected an error";
  return Error("");
}

Error parse_error(const std::string& bytes) {
  try {
    File::from_memory(bytes.data(), bytes.size(), "mem.gguf");
  } catch (const Error& e) {
    return e;
  }
  ADD_FAILURE() << "bytes parsed, expected an error";
  return Error("");
}

class TempDir {
 public:
  TempDir() {
    char tpl[] = "/tmp/dllm-gguf-test-XXXXXX";
    path_ = mkdtemp(tpl);
  }
  ~TempDir() { std::system(("rm -rf '" + path_ + "'").c_str()); }
  std::string file(const std::string& name) const { return path_ + "/" + name; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// ---- malformed fixtures ----

// Words each malformed file's error must contain (besides the file's path).
const std::map<std::string, std::vector<std::string>> kMalformed = {
    {"empty.gguf", {"is not a GGUF file", "empty"}},
    {"truncated-header.gguf", {"truncated", "header"}},
    {"bad-magic.gguf", {"is not a GGUF file (bad magic)."}},
    {"html-page.gguf", {"is not a GGUF file (bad magic)."}},
    {"version-1.gguf", {"unsupported GGUF version 1"}},
    {"version-big-endian.gguf", {"unsupported GGUF version 50331648", "big-endian"}},
    {"truncated-in-kv.gguf", {"truncated", "metadata key #0"}},
    {"truncated-in-tensor-info.gguf", {"truncated", "tensor info #0"}},
    {"truncated-data.gguf", {"tensor 't0'", "past the end of the file", "'t1'", "truncated"}},
    {"tensor-data-past-eof.gguf", {"tensor 'big'", "4194304 bytes", "past the end of the file"}},
    {"tensor-offset-past-eof.gguf", {"tensor 't0'", "offset 1099511627776", "past the end of the file"}},
    {"string-length-overflow.gguf", {"string length 18446744073709551615", "exceeds", "metadata key #0"}},
    {"string-value-too-long.gguf", {"string length 4611686018427387904", "exceeds", "'general.architecture'"}},
    {"n-tensors-2pow63.gguf", {"9223372036854775808 tensors", "implausible"}},
    {"n-kv-huge.gguf", {"4611686018427387904 metadata key/value pairs", "implausible"}},
    {"misaligned-tensor-offset.gguf", {"tensor 't1'", "offset 68", "not aligned to 32"}},
    {"unknown-tensor-type.gguf", {"unknown tensor type 1000 for tensor 't0'"}},
    {"removed-tensor-type.gguf", {"unknown tensor type 4 for tensor 't0'", "Q4_2", "removed"}},
    {"duplicate-tensor-names.gguf", {"duplicate tensor name 't0'"}},
    {"duplicate-kv-key.gguf", {"duplicate metadata key 'general.name'"}},
    {"dims-product-overflow.gguf", {"tensor 'huge'", "[4294967296, 4294967296, 4, 1]", "element count overflows"}},
    {"negative-dim.gguf", {"tensor 'neg'", "invalid dimension 0", "-9223372036854775808"}},
    {"too-many-dims.gguf", {"tensor 't0'", "too many dimensions: 5 > 4"}},
    {"row-not-multiple-of-block.gguf", {"tensor 'q'", "Q4_0", "row length 48", "block size 32"}},
    {"bad-kv-type.gguf", {"metadata key 'fixture.bad'", "invalid value type 99"}},
    {"array-count-overflow.gguf", {"'fixture.arr'", "2305843009213693952", "longer than the file"}},
    {"bad-alignment.gguf", {"general.alignment 48", "not a power of two"}},
};

TEST(GgufMalformed, EveryFixtureIsCovered) {
  for (const auto& name : list_dir(data_path("gguf/malformed"), ".gguf")) {
    if (name.rfind("valid-", 0) != 0) {
      EXPECT_TRUE(kMalformed.count(name)) << "no expectation for " << name;
    }
  }
}

TEST(GgufMalformed, EachFailsNamingTheProblem) {
  for (const auto& [name, words] : kMalformed) {
    const std::string path = data_path("gguf/malformed/" + name);
    Error e = open_error(path);
    std::string msg = e.what();
    EXPECT_EQ(e.exit_code(), 1) << name;
    EXPECT_EQ(msg.rfind(path, 0), 0u) << name << ": message should start with the path: " << msg;
    for (const auto& w : words) EXPECT_NE(msg.find(w), std::string::npos) << name << ": '" << w << "' not in: " << msg;
  }
}

TEST(GgufMalformed, BadMagicMessageIsExactWithHint) {
  for (const char* name : {"bad-magic.gguf", "html-page.gguf"}) {
    const std::string path = data_path(std::string("gguf/malformed/") + name);
    Error e = open_error(path);
    EXPECT_EQ(std::string(e.what()), path + " is not a GGUF file (bad magic).");
    EXPECT_NE(e.hint().find("HTML"), std::string::npos) << e.hint();
    EXPECT_NE(e.hint().find("./dllm pull"), std::string::npos) << e.hint();
  }
}

// ---- valid controls and fixtures ----

TEST(GgufValid, MinimalControl) {
  auto f = File::open(data_path("gguf/malformed/valid-minimal.gguf"));
  EXPECT_EQ(f->version(), 3u);
  EXPECT_EQ(f->alignment(), 32u);
  EXPECT_EQ(f->file_size(), 320u);
  EXPECT_EQ(f->data_offset(), 224u);  // gguf-py: t0 at 224, t1 at 288
  EXPECT_EQ(f->metadata().size(), 2u);
  EXPECT_EQ(f->get_string("general.architecture"), "fixture");
  ASSERT_EQ(f->tensors().size(), 2u);
  const auto* t0 = f->find_tensor("t0");
  const auto* t1 = f->find_tensor("t1");
  ASSERT_TRUE(t0 && t1);
  EXPECT_EQ(t0->type(), GgmlType::F32);
  EXPECT_EQ(t0->n_dims, 2u);
  EXPECT_EQ(t0->ne[0], 8);
  EXPECT_EQ(t0->ne[1], 2);
  EXPECT_EQ(t0->nbytes, 64u);
  EXPECT_EQ(t0->offset, 0u);
  EXPECT_EQ(t1->n_dims, 1u);
  EXPECT_EQ(t1->n_elements(), 8);
  EXPECT_EQ(t1->offset, 64u);
  EXPECT_EQ(t1->data, f->base() + 288);
  for (int k = 0; k < 16; ++k) {
    float v;
    std::memcpy(&v, t0->data + 4 * k, 4);
    EXPECT_EQ(v, 0.25f * k);
  }
  for (int k = 0; k < 8; ++k) {
    float v;
    std::memcpy(&v, t1->data + 4 * k, 4);
    EXPECT_EQ(v, 100.0f + 0.25f * k);
  }
  EXPECT_EQ(f->find_tensor("t2"), nullptr);
}

TEST(GgufValid, NoTensorsControl) {
  auto f = File::open(data_path("gguf/malformed/valid-no-tensors.gguf"));
  EXPECT_EQ(f->metadata().size(), 3u);
  EXPECT_EQ(f->tensors().size(), 0u);
  EXPECT_EQ(f->get_uint("fixture.answer"), 42u);
  EXPECT_EQ(f->find("fixture.answer")->type, ValueType::U32);
  EXPECT_GE(f->data_offset(), f->file_size());  // no padding after the last KV: data section at/after EOF
}

TEST(GgufValid, QuantFixtureTypesAndShapes) {
  for (const char* file : {"gguf/quants.gguf", "gguf/quants-expected-f32.gguf"}) {
    auto f = File::open(data_path(file));
    ASSERT_EQ(f->tensors().size(), 41u) << file;
    for (const auto& t : f->tensors()) {
      // Names are "<type>.<set>.<ne0>x<ne1>", e.g. q4_k.mix.256x7.
      std::string name(t.name);
      std::string type = name.substr(0, name.find('.'));
      std::transform(type.begin(), type.end(), type.begin(), ::toupper);
      std::string dims = name.substr(name.rfind('.') + 1);
      int64_t ne0 = std::stoll(dims.substr(0, dims.find('x')));
      int64_t ne1 = std::stoll(dims.substr(dims.find('x') + 1));
      EXPECT_EQ(t.type_info.name, std::string(std::string_view(file).find("expected") != std::string_view::npos ? "F32" : type)) << name;
      EXPECT_EQ(t.ne[0], ne0) << name;
      EXPECT_EQ(t.ne[1], ne1) << name;
      EXPECT_EQ(t.nbytes, t.row_bytes() * static_cast<uint64_t>(ne1)) << name;
      EXPECT_EQ((t.data - f->base()) % 32, 0) << name;
      EXPECT_LE(static_cast<uint64_t>(t.data - f->base()) + t.nbytes, f->file_size()) << name;
    }
  }
}

TEST(GgufValid, TinyModels) {
  for (const auto& name : list_dir(data_path("models"), ".gguf")) {
    auto f = File::open(data_path("models/" + name));
    const bool llada = name.find("llada") != std::string::npos;
    const std::string arch = llada ? "llada" : "dream";
    EXPECT_EQ(f->get_string("general.architecture"), arch) << name;
    EXPECT_EQ(f->get_uint(arch + ".block_count"), 2u) << name;
    EXPECT_EQ(f->get_int(arch + ".embedding_length"), 256) << name;
    EXPECT_EQ(static_cast<float>(f->get_float(arch + ".attention.layer_norm_rms_epsilon")), llada ? 1e-5f : 1e-6f);
    EXPECT_EQ(f->get_float(arch + ".rope.freq_base"), llada ? 500000.0 : 1000000.0);
    EXPECT_FALSE(f->get_bool(arch + ".attention.causal"));
    EXPECT_EQ(f->get_string_array("tokenizer.ggml.tokens").size(), 1024u);
    EXPECT_EQ(f->get_int_array("tokenizer.ggml.token_type").size(), 1024u);
    EXPECT_EQ(f->get_uint("tokenizer.ggml.mask_token_id"), llada ? 1014u : 1019u);
    EXPECT_EQ(f->tensors().size(), llada ? 21u : 27u) << name;  // dream adds q/k/v biases
    const auto* emb = f->find_tensor("token_embd.weight");
    ASSERT_TRUE(emb) << name;
    EXPECT_EQ(emb->ne[0], 256);
    EXPECT_EQ(emb->ne[1], 1024);
  }
}

// ---- synthetic files: v2, value types, alignment ----

TEST(GgufSynthetic, Version2WithAllValueTypesAndNestedArrays) {
  GgufWriter w(2, 64);
  w.kv("general.alignment", 4, le<uint32_t>(64))
      .kv("u8", 0, le<uint8_t>(200)).kv("i8", 1, le<int8_t>(-5)).kv("u16", 2, le<uint16_t>(60000))
      .kv("i16", 3, le<int16_t>(-300)).kv("u32", 4, le<uint32_t>(4000000000u)).kv("i32", 5, le<int32_t>(-7))
      .kv("f32", 6, le<float>(1.5f)).kv("bool", 7, le<uint8_t>(1)).kv_str("str", "h\xC3\xA9llo")
      .kv("u64", 10, le<uint64_t>(~0ull)).kv("i64", 11, le<int64_t>(-(1ll << 40))).kv("f64", 12, le<double>(-0.25))
      .kv("arr.str", 9, garr(8, 2, gstr("a") + gstr("")))
      .kv("arr.i16", 9, garr(3, 3, le<int16_t>(-1) + le<int16_t>(2) + le<int16_t>(3)))
      .kv("arr.nested", 9, garr(9, 2, garr(0, 2, "\x01\x02") + garr(8, 1, gstr("x"))))
      .kv("arr.empty", 9, garr(10, 0, ""))
      .tensor("a", {3}, 0, dllm::test::f32_bytes({1, 2, 3}))
      .tensor("b", {2, 1, 1, 2}, 1, std::string(8, '\x3c'));
  std::string bytes = w.bytes();
  auto f = File::from_memory(bytes.data(), bytes.size(), "v2.gguf");
  EXPECT_EQ(f->version(), 2u);
  EXPECT_EQ(f->alignment(), 64u);
  EXPECT_EQ(f->data_offset() % 64, 0u);
  EXPECT_EQ(f->get_uint("u8"), 200u);
  EXPECT_EQ(f->get_int("i8"), -5);
  EXPECT_EQ(f->get_uint("u16"), 60000u);
  EXPECT_EQ(f->get_int("i16"), -300);
  EXPECT_EQ(f->get_uint("u32"), 4000000000u);
  EXPECT_EQ(f->get_int("i32"), -7);
  EXPECT_EQ(f->get_float("f32"), 1.5);
  EXPECT_TRUE(f->get_bool("bool"));
  EXPECT_EQ(f->get_string("str"), "h\xC3\xA9llo");
  EXPECT_EQ(f->get_uint("u64"), ~0ull);
  EXPECT_EQ(f->get_int("i64"), -(1ll << 40));
  EXPECT_EQ(f->get_float("f64"), -0.25);
  EXPECT_EQ(f->get_float("i32"), -7.0);  // integers are accepted as floats
  EXPECT_EQ(f->get_string_array("arr.str"), (std::vector<std::string_view>{"a", ""}));
  EXPECT_EQ(f->get_int_array("arr.i16"), (std::vector<int64_t>{-1, 2, 3}));
  const auto* nested = f->find("arr.nested");
  ASSERT_TRUE(nested);
  EXPECT_EQ(nested->elem_type, ValueType::ARRAY);
  ASSERT_EQ(nested->arr.size(), 2u);
  EXPECT_EQ(nested->arr[0].elem_type, ValueType::U8);
  ASSERT_EQ(nested->arr[0].size(), 2u);
  EXPECT_EQ(nested->arr[0].at(1).u, 2u);
  EXPECT_EQ(nested->arr[1].at(0).s, "x");
  EXPECT_EQ(f->find("arr.empty")->size(), 0u);
  ASSERT_EQ(f->tensors().size(), 2u);
  const auto& b = f->tensors()[1];
  EXPECT_EQ(b.type(), GgmlType::F16);
  EXPECT_EQ(b.offset, 64u);
  EXPECT_EQ(b.n_elements(), 4);
  EXPECT_EQ(b.n_rows(), 2);
  EXPECT_EQ(b.data, f->base() + f->data_offset() + 64);
  EXPECT_EQ(static_cast<unsigned char>(b.data[7]), 0x3c);
}

TEST(GgufSynthetic, TypedGetterErrors) {
  GgufWriter w;
  w.kv("neg", 5, le<int32_t>(-1)).kv("big", 10, le<uint64_t>(1ull << 63)).kv_str("s", "x").kv_u32("n", 1);
  std::string bytes = w.bytes();
  auto f = File::from_memory(bytes.data(), bytes.size(), "m.gguf");
  auto msg = [](auto fn) {
    try {
      fn();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(msg([&] { f->get_uint("missing.key"); }), "required metadata key missing: missing.key");
  EXPECT_EQ(msg([&] { f->get_string("n"); }), "metadata key n has type u32, expected str");
  EXPECT_EQ(msg([&] { f->get_uint("s"); }), "metadata key s has type str, expected an unsigned integer");
  EXPECT_NE(msg([&] { f->get_uint("neg"); }).find("non-negative"), std::string::npos);
  EXPECT_NE(msg([&] { f->get_int("big"); }).find("does not fit in int64"), std::string::npos);
  EXPECT_NE(msg([&] { f->get_bool("n"); }).find("expected bool"), std::string::npos);
  EXPECT_NE(msg([&] { f->get_string_array("s"); }).find("expected arr[str]"), std::string::npos);
  EXPECT_EQ(f->get_int("neg"), -1);
  EXPECT_EQ(f->find("nothing"), nullptr);
}

TEST(GgufSynthetic, AlignmentRules) {
  auto with_alignment = [](uint32_t type, const std::string& v) {
    return GgufWriter().kv("general.alignment", type, v).tensor("t", {4}, 0, std::string(16, '\0')).bytes();
  };
  EXPECT_NE(std::string(parse_error(with_alignment(4, le<uint32_t>(0))).what()).find("general.alignment 0 is not a power of two"), std::string::npos);
  EXPECT_NE(std::string(parse_error(with_alignment(10, le<uint64_t>(32))).what()).find("general.alignment has type u64, expected u32"), std::string::npos);
  std::string ok = with_alignment(4, le<uint32_t>(1));
  auto f = File::from_memory(ok.data(), ok.size(), "a1.gguf");
  EXPECT_EQ(f->alignment(), 1u);
  // Custom alignment: offsets must be multiples of it, not of 32.
  std::string mis = GgufWriter(3, 64).kv_u32("general.alignment", 64).tensor("t", {4}, 0, std::string(16, '\0'), 32).bytes();
  EXPECT_NE(std::string(parse_error(mis).what()).find("tensor 't' data offset 32 is not aligned to 64 bytes"), std::string::npos);
}

TEST(GgufSynthetic, EveryKnownTypeIdIsAccepted) {
  // The reader sizes every type ggml knows (decoding them is the model loader's business).
  for (uint32_t id = 0; id < 64; ++id) {
    auto info = dllm::ggml_type_info(id);
    std::string bytes = GgufWriter().tensor("x", {info ? info->block_size : 32, 3}, id,
                                            std::string(info ? 3 * info->type_size : 0, '\0')).bytes();
    if (info) {
      auto f = File::from_memory(bytes.data(), bytes.size(), "t.gguf");
      EXPECT_EQ(f->tensors()[0].nbytes, 3u * info->type_size) << info->name;
      EXPECT_EQ(f->tensors()[0].type_id, id);
    } else {
      EXPECT_NE(std::string(parse_error(bytes).what()).find("unknown tensor type " + std::to_string(id) + " for tensor 'x'"),
                std::string::npos);
    }
  }
}

TEST(GgufSynthetic, ShapesAndCounts) {
  // Zero dimensions are allowed (an empty tensor), n_dims 0 is a scalar.
  std::string empty = GgufWriter().tensor("e", {0, 1ull << 62}, 0, "").tensor("s", {}, 0, std::string(4, '\0')).bytes();
  auto f = File::from_memory(empty.data(), empty.size(), "z.gguf");
  EXPECT_EQ(f->tensors()[0].nbytes, 0u);
  EXPECT_EQ(f->tensors()[0].n_elements(), 0);
  EXPECT_EQ(f->tensors()[1].n_dims, 0u);
  EXPECT_EQ(f->tensors()[1].n_elements(), 1);
  // The bytes of a large F32 tensor overflow 64 bits although its element count does not.
  std::string huge = GgufWriter().tensor("h", {1ull << 62}, 0, "").bytes();
  EXPECT_NE(std::string(parse_error(huge).what()).find("tensor 'h' is too large"), std::string::npos);
  // Counts larger than the file: no allocation, a clear error.
  std::string lying = GgufWriter().kv_u32("a", 1).counts(0, 1ull << 40).bytes();
  std::string msg = parse_error(lying).what();
  EXPECT_NE(msg.find("1099511627776 metadata key/value pairs"), std::string::npos) << msg;
  // An array of strings needs 8 bytes per element.
  std::string strs = GgufWriter().kv("a", 9, garr(8, 1000, std::string(7999, '\0'))).bytes();
  EXPECT_NE(std::string(parse_error(strs).what()).find("array of 1000 str elements, longer than the file"), std::string::npos);
  // Invalid array element type, and arrays nested too deep.
  EXPECT_NE(std::string(parse_error(GgufWriter().kv("a", 9, garr(13, 0, "")).bytes()).what()).find("invalid element type 13"),
            std::string::npos);
  std::string deep = garr(0, 0, "");
  for (int k = 0; k < 20; ++k) deep = garr(9, 1, deep);
  EXPECT_NE(std::string(parse_error(GgufWriter().kv("d", 9, deep).bytes()).what()).find("nests arrays deeper"), std::string::npos);
}

// ---- opening ----

TEST(GgufOpen, MissingFileHasPullHint) {
  Error e = open_error("/nonexistent/dir/model.gguf");
  EXPECT_EQ(std::string(e.what()), "cannot open model file /nonexistent/dir/model.gguf: No such file or directory");
  EXPECT_EQ(e.hint(), "to download a model, run: ./dllm pull");
  EXPECT_EQ(e.exit_code(), 1);
}

TEST(GgufOpen, OtherReasonsHaveNoHint) {
  TempDir dir;
  Error d = open_error(dir.path());
  EXPECT_EQ(std::string(d.what()), "is a directory: " + dir.path());
  EXPECT_TRUE(d.hint().empty());

  const std::string model = data_path("gguf/malformed/valid-minimal.gguf");
  Error nd = open_error(model + "/x.gguf");
  EXPECT_EQ(std::string(nd.what()), "cannot open model file " + model + "/x.gguf: Not a directory");
  EXPECT_TRUE(nd.hint().empty());
}

// Opens `path` in a child process running as user nobody (root ignores file permissions) and returns
// the error message and whether a hint came with it.
std::string open_error_as_nobody(const std::string& path) {
  int fds[2];
  if (pipe(fds) != 0) return "pipe failed";
  pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    std::string msg = "loaded";
    if (setgid(65534) != 0 || setuid(65534) != 0) msg = "setuid failed";
    else
      try {
        File::open(path);
      } catch (const Error& e) {
        msg = std::string(e.what()) + (e.hint().empty() ? "" : " [hint]");
      }
    ssize_t n = write(fds[1], msg.data(), msg.size());
    _exit(n == static_cast<ssize_t>(msg.size()) ? 0 : 1);
  }
  close(fds[1]);
  std::string msg;
  char buf[512];
  for (ssize_t n; (n = read(fds[0], buf, sizeof buf)) > 0;) msg.append(buf, static_cast<size_t>(n));
  close(fds[0]);
  waitpid(pid, nullptr, 0);
  return msg;
}

TEST(GgufOpen, PermissionDeniedHasNoHint) {
  TempDir dir;
  chmod(dir.path().c_str(), 0755);
  const std::string locked = dir.file("locked.gguf");
  GgufWriter().write(locked);
  chmod(locked.c_str(), 0);
  std::string expected = "cannot open model file " + locked + ": Permission denied";
  if (geteuid() == 0) {
    EXPECT_EQ(open_error_as_nobody(locked), expected);
  } else {
    Error p = open_error(locked);
    EXPECT_EQ(std::string(p.what()), expected);
    EXPECT_TRUE(p.hint().empty());
  }
}

TEST(GgufOpen, FileOnDiskMatchesMemoryParse) {
  TempDir dir;
  const std::string path = dir.file("v2.gguf");
  GgufWriter(2).kv_str("general.architecture", "x").tensor("t", {2}, 0, dllm::test::f32_bytes({7, 8})).write(path);
  auto f = File::open(path);
  EXPECT_EQ(f->path(), path);
  EXPECT_EQ(f->version(), 2u);
  float v;
  std::memcpy(&v, f->tensors()[0].data + 4, 4);
  EXPECT_EQ(v, 8.0f);
}

// ---- fuzzer regressions ----

TEST(GgufRegress, EveryFuzzerFindingIsHandled) {
  auto files = list_dir(data_path("gguf/regress"), ".gguf");
  ASSERT_FALSE(files.empty());
  for (const auto& name : files) {
    std::string bytes = dllm::test::read_file(data_path("gguf/regress/" + name));
    try {
      auto f = File::from_memory(bytes.data(), bytes.size(), name);
      for (const auto& t : f->tensors()) {
        EXPECT_GE(t.n_elements(), 0) << name;
        EXPECT_GE(t.n_rows(), 0) << name;
        EXPECT_LE(static_cast<uint64_t>(t.data - f->base()) + t.nbytes, f->file_size()) << name;
      }
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
    }
  }
}

}  // namespace

// ---- hostile metadata: memory stays near the file's own bytes, and past generous counts a clear error ----

namespace {

size_t heap_in_use() { return mallinfo2().uordblks; }

std::string hostile_error(const std::string& bytes) {
  try {
    File::from_memory(bytes.data(), bytes.size(), "hostile.gguf");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(GgufHostile, LargeArraysStayInTheMapping) {
  // arr[u8] of 4 Mi elements: 4 MB in the file, 335 MB when every element was an 80-byte Value.
  const uint64_t n = 4u << 20;
  std::string items(n, '\0');
  for (uint64_t k = 0; k < n; ++k) items[k] = static_cast<char>(k * 7);
  const std::string bytes = GgufWriter().kv("big", 9, garr(0, n, items)).kv("strs", 9, garr(8, 3, gstr("a") + gstr("") + gstr("xyz"))).bytes();
  const size_t before = heap_in_use();
  auto f = File::from_memory(bytes.data(), bytes.size(), "big.gguf");
  const size_t grew = heap_in_use() - before;
  EXPECT_LT(grew, bytes.size()) << "metadata took " << grew << " bytes for a " << bytes.size() << "-byte file";
  const dllm::gguf::Value* v = f->find("big");
  ASSERT_NE(v, nullptr);
  ASSERT_EQ(v->size(), n);
  EXPECT_EQ(v->at(0).u, 0u);
  EXPECT_EQ(v->at(n - 1).u, static_cast<uint8_t>((n - 1) * 7));
  EXPECT_EQ(f->get_int_array("big").size(), n);
  EXPECT_EQ(f->get_string_array("strs"), (std::vector<std::string_view>{"a", "", "xyz"}));
}

TEST(GgufHostile, TooManyKeysTensorsOrNestedElementsAreRefused) {
  {
    GgufWriter w;
    for (uint64_t k = 0; k <= dllm::gguf::kMaxMetadataKeys; ++k) {
      std::string key = "k";  // (not "k" + to_string: GCC 12 warns falsely about that)
      key += std::to_string(k);
      w.kv_u32(key, 1);
    }
    EXPECT_EQ(hostile_error(w.bytes()), "hostile.gguf: the header declares 65537 metadata keys, more than the 65536 dllm "
                                      "reads (no model file has that many)");
  }
  {
    GgufWriter w;
    for (uint64_t k = 0; k <= dllm::gguf::kMaxTensors; ++k) {
      std::string name = "t";
      name += std::to_string(k);
      w.tensor(name, {1}, 0, "", 0);
    }
    EXPECT_EQ(hostile_error(w.bytes()), "hostile.gguf: the header declares 262145 tensors, more than the 262144 dllm "
                                      "reads (no model file has that many)");
  }
  {
    // 70000 empty arrays inside one array: each costs a Value (about 100 bytes) for 12 bytes of file.
    std::string inner;
    for (int k = 0; k < 70000; ++k) inner += le<uint32_t>(0) + le<uint64_t>(0);
    const std::string e = hostile_error(GgufWriter().kv("nest", 9, garr(9, 70000, inner)).bytes());
    EXPECT_NE(e.find("holds more than 65536 nested array elements in all"), std::string::npos) << e;
  }
}
