// dllm inspect tests: the text listing, --json against what gguf-py reports for every tiny model,
// --tensor/--out (bit-exact against the quant fixtures' expected f32, atomic, nothing left on error),
// usage checks, and the binary end to end on valid and malformed files.
#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "cli/commands.h"
#include "cli/settings.h"
#include "gguf_test_writer.h"
#include "common/error.h"
#include "model/gguf.h"
#include "common/interrupt.h"
#include "model/quant.h"
#include "support.h"

namespace dllm::cli {
int cmd_inspect(const Settings& s, std::ostream& out);  // cmd_inspect.cpp: the command with its output stream
}

namespace {

using dllm::Error;
using dllm::cli::Settings;
using dllm::test::data_path;
using dllm::test::garr;
using dllm::test::GgufWriter;
using dllm::test::gstr;
using dllm::test::le;
using Json = nlohmann::json;

std::string inspect(const Settings& s) {
  std::ostringstream out;
  EXPECT_EQ(dllm::cli::cmd_inspect(s, out), 0);
  return out.str();
}

Settings settings_for(const std::string& path) {
  Settings s;
  s.command = "inspect";
  s.path = path;
  return s;
}

// The message of the Error the command throws (or "no error").
std::string inspect_error(const Settings& s, int* exit_code = nullptr) {
  std::ostringstream out;
  try {
    dllm::cli::cmd_inspect(s, out);
  } catch (const Error& e) {
    if (exit_code) *exit_code = e.exit_code();
    return e.what();
  }
  return "no error";
}

std::vector<std::string> list_dir(const std::string& dir) {
  std::vector<std::string> out;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d))
      if (e->d_name[0] != '.') out.push_back(e->d_name);
    closedir(d);
  }
  std::sort(out.begin(), out.end());
  return out;
}

class TempDir {
 public:
  TempDir() {
    char tpl[] = "/tmp/dllm-inspect-test-XXXXXX";
    path_ = mkdtemp(tpl);
  }
  ~TempDir() { std::system(("rm -rf '" + path_ + "'").c_str()); }
  std::string file(const std::string& name) const { return path_ + "/" + name; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

// ---- the text listing ----

TEST(InspectText, MinimalFile) {
  const std::string path = data_path("gguf/malformed/valid-minimal.gguf");
  std::string out = inspect(settings_for(path));
  EXPECT_TRUE(contains(out, "GGUF v3: " + path + "\n")) << out;
  EXPECT_TRUE(contains(out, "file size: 320 bytes; alignment 32; tensor data at offset 224")) << out;
  EXPECT_TRUE(contains(out, "metadata (2 keys):")) << out;
  EXPECT_TRUE(contains(out, "  general.architecture: str = \"fixture\"\n")) << out;
  EXPECT_TRUE(contains(out, "tensor types (2 tensors):\n  F32: 2\n")) << out;
  EXPECT_TRUE(contains(out, "  t0    F32   [8, 2]  64\n")) << out;
  EXPECT_TRUE(contains(out, "  t1    F32   [8]     32\n")) << out;
  EXPECT_TRUE(contains(out, "total tensor data: 96 bytes in 2 tensors")) << out;
}

TEST(InspectText, ArraysAreSummarisedAndStringsEscaped) {
  TempDir dir;
  std::string items;
  for (int k = 0; k < 20; ++k) items += gstr(std::string(1, 's') += std::to_string(k));
  GgufWriter()
      .kv("tokens", 9, garr(8, 20, items))
      .kv("ids", 9, garr(5, 3, le<int32_t>(-1) + le<int32_t>(0) + le<int32_t>(7)))
      .kv_str("quote", std::string("a\"b\\c\nd\x01") + "\xff")
      .kv_str("long", std::string(500, 'x'))
      .kv("eps", 6, le<float>(1e-5f))
      .kv("flag", 7, le<uint8_t>(1))
      .tensor("q", {64, 2}, 2, std::string(2 * 2 * 18, '\0'))
      .tensor("w", {32}, 8, std::string(34, '\0'))
      .tensor("v", {32}, 8, std::string(34, '\0'))
      .write(dir.file("a.gguf"));
  std::string out = inspect(settings_for(dir.file("a.gguf")));
  EXPECT_TRUE(contains(out, "  tokens: arr[str, 20] = [\"s0\", \"s1\", \"s2\", \"s3\", \"s4\", \"s5\", \"s6\", \"s7\", ... 12 more]\n"))
      << out;
  EXPECT_TRUE(contains(out, "  ids: arr[i32, 3] = [-1, 0, 7]\n")) << out;
  EXPECT_TRUE(contains(out, "  quote: str = \"a\\\"b\\\\c\\nd\\x01\\xff\"\n")) << out;
  EXPECT_TRUE(contains(out, "  long: str = \"" + std::string(160, 'x') + "...\" (500 bytes)\n")) << out;
  EXPECT_TRUE(contains(out, "  eps: f32 = 1e-05\n")) << out;
  EXPECT_TRUE(contains(out, "  flag: bool = true\n")) << out;
  EXPECT_TRUE(contains(out, "  Q4_0: 1\n  Q8_0: 2\n")) << out;
  EXPECT_TRUE(contains(out, "  q     Q4_0  [64, 2]  72\n")) << out;
}

// ---- --json against gguf-py ----

// Compares one metadata value from dllm's JSON with gguf-py's: f32 values as float32.
void expect_same_value(const std::string& where, const std::string& type, const Json& mine, const Json& ref) {
  if (type == "f32") {
    ASSERT_TRUE(mine.is_number()) << where;
    EXPECT_EQ(mine.get<float>(), ref.get<float>()) << where;
  } else {
    EXPECT_EQ(mine, ref) << where;
  }
}

TEST(InspectJson, EveryTinyModelMatchesGgufPy) {
  const Json expected = Json::parse(dllm::test::read_file(data_path("models/inspect-expected.json")));
  int checked = 0;
  for (const auto& name : list_dir(data_path("models"))) {
    if (name.size() < 5 || name.substr(name.size() - 5) != ".gguf") continue;
    ASSERT_TRUE(expected.contains(name)) << "inspect-expected.json lacks " << name << ": rerun make_inspect_expected.py";
    const Json& ref = expected[name];
    Settings s = settings_for(data_path("models/" + name));
    s.json = true;
    const Json mine = Json::parse(inspect(s));
    EXPECT_EQ(mine["version"], ref["version"]) << name;
    EXPECT_EQ(mine["alignment"], ref["alignment"]) << name;
    EXPECT_EQ(mine["data_offset"], ref["data_offset"]) << name;
    EXPECT_EQ(mine["sizes"]["file"], ref["file_size"]) << name;

    // Metadata: same keys in the same order, same types and values (arrays: type, length, first items).
    std::vector<std::string> my_keys, ref_keys;
    for (const auto& [k, v] : mine["metadata"].items()) my_keys.push_back(k);
    for (const auto& [k, v] : ref["metadata"].items()) ref_keys.push_back(k);
    EXPECT_EQ(my_keys.size(), ref_keys.size()) << name;
    for (const auto& [key, r] : ref["metadata"].items()) {
      const std::string where = name + " " + key;
      ASSERT_TRUE(mine["metadata"].contains(key)) << where;
      const Json& m = mine["metadata"][key];
      EXPECT_EQ(m["type"], r["type"]) << where;
      if (r["type"] == "arr") {
        EXPECT_EQ(m["elem_type"], r["elem_type"]) << where;
        EXPECT_EQ(m["length"], r["length"]) << where;
        ASSERT_EQ(m["first"].size(), r["first"].size()) << where;
        for (size_t k = 0; k < r["first"].size(); ++k)
          expect_same_value(where, r["elem_type"], m["first"][k], r["first"][k]);
      } else {
        expect_same_value(where, r["type"], m["value"], r["value"]);
      }
    }

    // Tensors: names, types, shapes (ne order), offsets and sizes, in file order.
    ASSERT_EQ(mine["tensors"].size(), ref["tensors"].size()) << name;
    uint64_t total = 0;
    for (size_t k = 0; k < ref["tensors"].size(); ++k) {
      const Json& m = mine["tensors"][k];
      const Json& r = ref["tensors"][k];
      EXPECT_EQ(m["name"], r["name"]) << name;
      EXPECT_EQ(m["type"], r["type"]) << name << " " << r["name"];
      EXPECT_EQ(m["shape"], r["shape"]) << name << " " << r["name"];
      EXPECT_EQ(m["offset"], r["offset"]) << name << " " << r["name"];
      EXPECT_EQ(m["nbytes"], r["nbytes"]) << name << " " << r["name"];
      total += r["nbytes"].get<uint64_t>();
    }
    EXPECT_EQ(mine["tensor_type_counts"], ref["tensor_type_counts"]) << name;
    EXPECT_EQ(mine["sizes"]["tensor_data"], total) << name;
    ++checked;
  }
  EXPECT_EQ(checked, 8);
}

TEST(InspectText, TerminalControlsFromTheFileAreEscaped) {
  // ESC (C0), CSI as U+009B (C1, valid UTF-8), a right-to-left override U+202E, in a key, a value and a tensor name.
  TempDir dir;
  const std::string csi = "\xc2\x9b", rlo = "\xe2\x80\xae";
  GgufWriter()
      .kv_str("general.name", "a\x1b]0;title\x07" + csi + "31m" + rlo + "gguf.exe")
      .kv_str("key" + csi + "2J", "v")
      .tensor("t" + rlo + "0", {4}, 0, std::string(16, '\0'))
      .write(dir.file("esc.gguf"));
  const std::string text = inspect(settings_for(dir.file("esc.gguf")));
  EXPECT_EQ(text.find('\x1b'), std::string::npos) << text;
  EXPECT_EQ(text.find(csi), std::string::npos) << text;
  EXPECT_EQ(text.find(rlo), std::string::npos) << text;
  EXPECT_NE(text.find("a\\x1b]0;title\\x07\\u009b31m\\u202egguf.exe"), std::string::npos) << text;
  EXPECT_NE(text.find("key\\u009b2J"), std::string::npos) << text;
  EXPECT_NE(text.find("t\\u202e0"), std::string::npos) << text;
}

TEST(InspectJson, SummarisesArraysAndKeepsFileOrder) {
  TempDir dir;
  std::string items;
  for (int k = 0; k < 10; ++k) items += le<uint16_t>(static_cast<uint16_t>(k * 100));
  GgufWriter(2)
      .kv_str("z.first", "z")
      .kv("a.arr", 9, garr(2, 10, items))
      .kv("nested", 9, garr(9, 1, garr(8, 1, gstr("x"))))
      .kv("u64", 10, le<uint64_t>(~0ull))
      .write(dir.file("j.gguf"));
  Settings s = settings_for(dir.file("j.gguf"));
  s.json = true;
  std::string text = inspect(s);
  Json j = Json::parse(text);
  EXPECT_EQ(j["version"], 2);
  EXPECT_LT(text.find("z.first"), text.find("a.arr"));  // file order, not sorted
  EXPECT_EQ(j["metadata"]["a.arr"]["type"], "arr");
  EXPECT_EQ(j["metadata"]["a.arr"]["elem_type"], "u16");
  EXPECT_EQ(j["metadata"]["a.arr"]["length"], 10);
  EXPECT_EQ(j["metadata"]["a.arr"]["first"], Json({0, 100, 200, 300, 400, 500, 600, 700}));
  EXPECT_EQ(j["metadata"]["nested"]["first"][0]["elem_type"], "str");
  EXPECT_EQ(j["metadata"]["nested"]["first"][0]["first"][0], "x");
  EXPECT_EQ(j["metadata"]["u64"]["value"].get<uint64_t>(), ~0ull);
  EXPECT_TRUE(j["tensors"].empty());
  EXPECT_TRUE(j["tensor_type_counts"].empty());
}

// ---- --tensor NAME --out FILE ----

std::string tensor_bytes(const dllm::gguf::File& f, const std::string& name) {
  const auto* t = f.find_tensor(name);
  if (!t) return "";
  return std::string(reinterpret_cast<const char*>(t->data), t->nbytes);
}

TEST(InspectTensor, F32TensorIsCopiedExactly) {
  TempDir dir;
  Settings s = settings_for(data_path("gguf/malformed/valid-minimal.gguf"));
  s.tensor = "t0";
  s.out = dir.file("t0.f32");
  std::string out = inspect(s);
  EXPECT_TRUE(contains(out, "wrote tensor \"t0\" (F32 [8, 2], 16 values) to " + s.out)) << out;
  std::string bytes = dllm::test::read_file(s.out);
  ASSERT_EQ(bytes.size(), 64u);
  for (int k = 0; k < 16; ++k) {
    float v;
    std::memcpy(&v, bytes.data() + 4 * k, 4);
    EXPECT_EQ(v, 0.25f * k);
  }
  EXPECT_EQ(list_dir(dir.path()), std::vector<std::string>{"t0.f32"});  // no temp file left behind
}

TEST(InspectTensor, CtrlCLeavesNoTempFileBehind) {
  TempDir dir;
  Settings s = settings_for(data_path("gguf/malformed/valid-minimal.gguf"));
  s.tensor = "t0";
  s.out = dir.file("t0.f32");
  int code = 0;
  std::string e;
  {
    dllm::InterruptScope scope;  // SIGINT sets the flag the dump polls instead of killing this test
    ASSERT_EQ(::raise(SIGINT), 0);
    e = inspect_error(s, &code);
  }
  dllm::reset_interrupt();
  EXPECT_EQ(e, "interrupted (Ctrl-C): " + s.out + " was not written");
  EXPECT_EQ(code, 130);
  EXPECT_EQ(list_dir(dir.path()), std::vector<std::string>{});  // no OUT.tmp-XXXXXX, no OUT
  EXPECT_EQ(::signal(SIGINT, SIG_DFL), SIG_DFL);  // the scope put the default action back
}

TEST(InspectTensor, EveryQuantTypeMatchesTheExpectedF32BitForBit) {
  TempDir dir;
  auto quants = dllm::gguf::File::open(data_path("gguf/quants.gguf"));
  auto expected = dllm::gguf::File::open(data_path("gguf/quants-expected-f32.gguf"));
  int checked = 0;
  for (const auto& t : quants->tensors()) {
    Settings s = settings_for(data_path("gguf/quants.gguf"));
    s.tensor = std::string(t.name);
    s.out = dir.file("out.f32");
    inspect(s);
    std::string got = dllm::test::read_file(s.out);
    std::string want = tensor_bytes(*expected, s.tensor);
    ASSERT_EQ(got.size(), want.size()) << s.tensor;
    EXPECT_TRUE(got == want) << s.tensor << " differs from quants-expected-f32.gguf";
    ++checked;
  }
  EXPECT_EQ(checked, 41);
}

TEST(InspectTensor, UnknownNameSuggestsAndWritesNothing) {
  TempDir dir;
  const std::string path = data_path("models/tiny-llada-Q4_K_M.gguf");
  Settings s = settings_for(path);
  s.tensor = "blk.0.atn_q.weight";
  s.out = dir.file("x.f32");
  int code = 0;
  EXPECT_EQ(inspect_error(s, &code),
            "no tensor named 'blk.0.atn_q.weight' in " + path + " (did you mean 'blk.0.attn_q.weight'?)");
  EXPECT_EQ(code, 1);
  s.tensor = "nothing.like.it.at.all";
  EXPECT_EQ(inspect_error(s), "no tensor named 'nothing.like.it.at.all' in " + path);
  EXPECT_TRUE(list_dir(dir.path()).empty());
}

TEST(InspectTensor, UnsupportedTypeLeavesExistingOutputAlone) {
  TempDir dir;
  GgufWriter().tensor("blk.0.attn_q.weight", {256, 1}, 16, std::string(66, '\0')).write(dir.file("iq.gguf"));
  {
    std::ofstream(dir.file("keep.f32")) << "old";
  }
  Settings s = settings_for(dir.file("iq.gguf"));
  s.tensor = "blk.0.attn_q.weight";
  s.out = dir.file("keep.f32");
  EXPECT_EQ(inspect_error(s), "unsupported GGUF tensor type: IQ2_XXS (tensor blk.0.attn_q.weight)");
  EXPECT_EQ(dllm::test::read_file(dir.file("keep.f32")), "old");
  EXPECT_EQ(list_dir(dir.path()), (std::vector<std::string>{"iq.gguf", "keep.f32"}));
}

TEST(InspectTensor, OutputProblemsAreNamed) {
  TempDir dir;
  Settings s = settings_for(data_path("gguf/malformed/valid-minimal.gguf"));
  s.tensor = "t1";
  s.out = dir.file("no/such/dir/t1.f32");
  EXPECT_EQ(inspect_error(s), "cannot write output file " + s.out + ": No such file or directory");
  // Never over the model itself.
  const std::string copy = dir.file("m.gguf");
  {
    std::ofstream(copy, std::ios::binary) << dllm::test::read_file(s.path);
  }
  s.path = copy;
  s.out = copy;
  EXPECT_TRUE(contains(inspect_error(s), "refusing to overwrite the model file")) << inspect_error(s);
  EXPECT_EQ(dllm::test::read_file(copy).size(), 320u);
}

TEST(InspectUsage, FlagCombinations) {
  int code = 0;
  EXPECT_EQ(inspect_error(settings_for(""), &code), "missing model path for 'inspect'");
  EXPECT_EQ(code, 2);
  Settings s = settings_for(data_path("gguf/malformed/valid-minimal.gguf"));
  s.tensor = "t0";
  EXPECT_TRUE(contains(inspect_error(s, &code), "--out"));
  EXPECT_EQ(code, 2);
  s.tensor.clear();
  s.out = "/tmp/x.f32";
  EXPECT_TRUE(contains(inspect_error(s, &code), "--tensor"));
  EXPECT_EQ(code, 2);
}

TEST(InspectErrors, ReaderErrorsPassThrough) {
  int code = 0;
  const std::string path = data_path("gguf/malformed/duplicate-tensor-names.gguf");
  EXPECT_TRUE(contains(inspect_error(settings_for(path), &code), "duplicate tensor name 't0'"));
  EXPECT_EQ(code, 1);
}

// ---- the binary, end to end ----

TEST(InspectBinary, ValidFilesExitZero) {
  const std::string path = data_path("models/tiny-dream-Q4_K_M.gguf");
  auto r = dllm::test::run_dllm({"inspect", path});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "GGUF v3: " + path)) << r.out;
  EXPECT_TRUE(contains(r.out, "  general.architecture: str = \"dream\"\n")) << r.out;
  EXPECT_TRUE(contains(r.out, "  Q4_K: 13\n  Q6_K: 3\n")) << r.out;
  EXPECT_TRUE(contains(r.out, "blk.1.attn_q.bias")) << r.out;
  EXPECT_TRUE(r.err.empty()) << r.err;
}

TEST(InspectBinary, EveryMalformedFileExitsOneWithAnError) {
  for (const auto& name : list_dir(data_path("gguf/malformed"))) {
    if (name.size() < 5 || name.substr(name.size() - 5) != ".gguf") continue;
    const std::string path = data_path("gguf/malformed/" + name);
    auto r = dllm::test::run_dllm({"inspect", path});
    if (name.rfind("valid-", 0) == 0) {
      EXPECT_EQ(r.exit_code, 0) << name << ": " << r.err;
      continue;
    }
    EXPECT_EQ(r.exit_code, 1) << name << ": " << r.err;
    EXPECT_EQ(r.err.rfind("ERROR: ", 0), 0u) << name << ": " << r.err;
    EXPECT_TRUE(contains(r.err, path)) << name << ": " << r.err;
    EXPECT_TRUE(r.out.empty()) << name << ": " << r.out;
  }
}

TEST(InspectBinary, MissingFileAndDirectory) {
  auto r = dllm::test::run_dllm({"inspect", "/nonexistent/model.gguf"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err.substr(0, r.err.find('\n')),
            "ERROR: cannot open model file /nonexistent/model.gguf: No such file or directory");
  TempDir dir;
  r = dllm::test::run_dllm({"inspect", dir.path()});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err.substr(0, r.err.find('\n')), "ERROR: is a directory: " + dir.path());
}

}  // namespace
