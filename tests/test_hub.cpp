// The hub library's pieces that need no server: SHA-256 against the FIPS 180-4 / NIST vectors, telling ids from
// paths, quant matching and its errors, the hub's two listing shapes, the cache folder, and the download lock.
#include <gtest/gtest.h>

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include "hub/hub.h"
#include "hub/internal.h"
#include "hub/sha256.h"
#include "common/error.h"
#include "support.h"

using namespace dllm::hub;

namespace {

// Sets (or unsets, with nullptr) an environment variable for the scope.
class EnvVar {
 public:
  EnvVar(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old, had_ = true;
    if (value) {
      ::setenv(name, value, 1);
    } else {
      ::unsetenv(name);
    }
  }
  ~EnvVar() {
    if (had_) {
      ::setenv(name_.c_str(), old_.c_str(), 1);
    } else {
      ::unsetenv(name_.c_str());
    }
  }

 private:
  std::string name_, old_;
  bool had_ = false;
};

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const dllm::Error& e) {
    return e.what();
  }
  return "";
}

std::vector<RemoteFile> files(std::initializer_list<const char*> names) {
  std::vector<RemoteFile> out;
  for (const char* n : names) out.push_back({n, 1000, ""});
  return out;
}

std::string pick(const std::vector<RemoteFile>& fs, const std::string& repo, const std::string& quant) {
  return choose_gguf(fs, ModelId{repo, quant}).path;
}

}  // namespace

TEST(HubSha256, FipsVectors) {
  EXPECT_EQ(sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(sha256_hex("abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklmnopqrlmnopqrs"
                       "mnopqrstnopqrstu"),
            "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1");
  EXPECT_EQ(sha256_hex(std::string(1000000, 'a')), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(HubSha256, IncrementalEqualsOneShotAtEveryPaddingBoundary) {
  // Lengths around the 55/56/64-byte padding edges, fed in uneven pieces.
  std::string data;
  for (int i = 0; i < 300; ++i) data += static_cast<char>((i * 131 + 7) & 0xff);
  for (size_t len : {0u, 1u, 55u, 56u, 57u, 63u, 64u, 65u, 119u, 120u, 128u, 300u}) {
    std::string part = data.substr(0, len);
    Sha256 h;
    for (size_t a = 0, step = 1; a < len; a += step, step = step % 7 + 3) h.update(part.substr(a, step));
    EXPECT_EQ(h.hex_digest(), sha256_hex(part)) << len;
  }
}

TEST(HubSha256, FileMatchesHashlibDigestOfFixture) {
  // The digest Python's hashlib gives for this fixture (sha256sum agrees).
  EXPECT_EQ(sha256_file(dllm::test::data_path("models/tiny-llada-Q4_K_M.gguf")),
            "8c69ea94cc30d050f0d5134fc49e843b59a4328dde2d287b08af346efbb252dd");
  EXPECT_NE(error_of([] { sha256_file("/nonexistent-dir/x.gguf"); }).find("/nonexistent-dir/x.gguf"),
            std::string::npos);
}

TEST(HubModelId, TellsIdsFromPaths) {
  auto id = parse_model_id("mradermacher/LLaDA-8B-Instruct-GGUF:Q4_K_M");
  ASSERT_TRUE(id);
  EXPECT_EQ(id->repo, "mradermacher/LLaDA-8B-Instruct-GGUF");
  EXPECT_EQ(id->quant, "Q4_K_M");
  EXPECT_EQ(id->str(), "mradermacher/LLaDA-8B-Instruct-GGUF:Q4_K_M");
  id = parse_model_id("owner/repo");
  ASSERT_TRUE(id);
  EXPECT_EQ(id->quant, "");
  // A file name as the quant, even one ending in .gguf, and a file in a folder of the repo.
  id = parse_model_id("owner/repo:model.Q8_0.gguf");
  ASSERT_TRUE(id);
  EXPECT_EQ(id->quant, "model.Q8_0.gguf");
  ASSERT_TRUE(parse_model_id("owner/repo:a/model.gguf"));

  for (const char* path : {"model.gguf", "models/model.gguf", "/nonexistent-dir/model.gguf", "./owner/repo",
                           "/abs/owner", "a/b/c", "owner/", "/owner/repo", "owner/repo:", "owner/repo:../x",
                           "owner/.hidden", "~/models/x", "owner/re po", ""})
    EXPECT_FALSE(parse_model_id(path)) << path;
  // An existing file or folder is a path, whatever its name looks like.
  EXPECT_FALSE(parse_model_id(dllm::test::data_path("models")));
  char dir[] = "/tmp/dllm-hub-id-XXXXXX";
  ASSERT_TRUE(mkdtemp(dir));
  std::string cwd = std::filesystem::current_path();
  std::filesystem::current_path(dir);
  std::filesystem::create_directories("owner/repo");
  EXPECT_FALSE(parse_model_id("owner/repo"));
  EXPECT_TRUE(parse_model_id("owner/other"));
  std::filesystem::current_path(cwd);
  std::filesystem::remove_all(dir);
}

TEST(HubModelId, DefaultModelIsAnIdAndDllmModelOverridesIt) {
  EnvVar unset("DLLM_MODEL", nullptr);
  EXPECT_EQ(default_model_id(), kDefaultModel);
  auto id = parse_model_id(default_model_id());
  ASSERT_TRUE(id);
  EXPECT_EQ(id->quant, "Q4_K_M");
  EnvVar set("DLLM_MODEL", "someone/Other-GGUF:Q8_0");
  EXPECT_EQ(default_model_id(), "someone/Other-GGUF:Q8_0");
}

TEST(HubQuant, MatchesWholeWordsCaseInsensitively) {
  auto fs = files({"LLaDA-8B-Instruct.Q4_K_M.gguf", "LLaDA-8B-Instruct.Q4_K_S.gguf", "LLaDA-8B-Instruct.IQ4_XS.gguf",
                   "LLaDA-8B-Instruct.Q4_0.gguf", "LLaDA-8B-Instruct.f16.gguf", "README.md",
                   "LLaDA-8B-Instruct.Q4_K_M.gguf.part1of2"});
  const std::string r = "o/LLaDA-GGUF";
  EXPECT_EQ(pick(fs, r, "Q4_K_M"), "LLaDA-8B-Instruct.Q4_K_M.gguf");
  EXPECT_EQ(pick(fs, r, "q4_k_m"), "LLaDA-8B-Instruct.Q4_K_M.gguf");
  EXPECT_EQ(pick(fs, r, "Q4_K_S"), "LLaDA-8B-Instruct.Q4_K_S.gguf");
  EXPECT_EQ(pick(fs, r, "Q4_0"), "LLaDA-8B-Instruct.Q4_0.gguf");
  EXPECT_EQ(pick(fs, r, "IQ4_XS"), "LLaDA-8B-Instruct.IQ4_XS.gguf");
  EXPECT_EQ(pick(fs, r, "F16"), "LLaDA-8B-Instruct.f16.gguf");
  EXPECT_EQ(pick(fs, r, "LLaDA-8B-Instruct.Q4_0.gguf"), "LLaDA-8B-Instruct.Q4_0.gguf");
  EXPECT_EQ(pick(fs, r, ""), "LLaDA-8B-Instruct.Q4_K_M.gguf");  // the default quant
  // "Q4_K" is a prefix of Q4_K_M / Q4_K_S, "XS" is inside IQ4_XS: neither is a whole word there.
  std::string e = error_of([&] { pick(fs, r, "Q4_K"); });
  EXPECT_NE(e.find("matches the quant 'Q4_K'"), std::string::npos) << e;
  e = error_of([&] { pick(fs, r, "XS"); });
  EXPECT_NE(e.find("no GGUF file of o/LLaDA-GGUF matches"), std::string::npos) << e;
  // The error lists every choice (label, file and size) and nothing that is not a GGUF file.
  for (const char* c : {"Q4_K_M (LLaDA-8B-Instruct.Q4_K_M.gguf, 1.00 kB)", "Q4_K_S", "IQ4_XS", "Q4_0",
                        "F16 (LLaDA-8B-Instruct.f16.gguf"})
    EXPECT_NE(e.find(c), std::string::npos) << c << " in " << e;
  EXPECT_EQ(e.find("README"), std::string::npos) << e;
  EXPECT_EQ(e.find("part1of2"), std::string::npos) << e;
}

TEST(HubQuant, AmbiguousAndDefaultlessReposListTheChoices) {
  auto fs = files({"a/model-Q4_K_M.gguf", "b/model-Q4_K_M.gguf", "model-Q8_0.gguf", "mmproj-model-f16.gguf"});
  std::string e = error_of([&] { pick(fs, "o/r", "q4_k_m"); });
  EXPECT_NE(e.find("ambiguous"), std::string::npos) << e;
  EXPECT_NE(e.find("a/model-Q4_K_M.gguf"), std::string::npos) << e;
  EXPECT_NE(e.find("b/model-Q4_K_M.gguf"), std::string::npos) << e;
  EXPECT_THROW(choose_gguf(fs, ModelId{"o/r", "Q4_K_M"}), AmbiguousError);
  EXPECT_EQ(pick(fs, "o/r", "b/model-Q4_K_M.gguf"), "b/model-Q4_K_M.gguf");
  // mmproj files are never picked, even when they are the only F16 one.
  EXPECT_NE(error_of([&] { pick(fs, "o/r", "F16"); }).find("matches the quant 'F16'"), std::string::npos);

  auto no_default = files({"m-Q8_0.gguf", "m-F16.gguf"});
  e = error_of([&] { pick(no_default, "o/r", ""); });
  EXPECT_NE(e.find("several GGUF files and none is Q4_K_M"), std::string::npos) << e;
  EXPECT_NE(e.find("Q8_0 (m-Q8_0.gguf"), std::string::npos) << e;
  EXPECT_NE(e.find("F16 (m-F16.gguf"), std::string::npos) << e;
  EXPECT_EQ(pick(files({"only.gguf", "notes.txt"}), "o/r", ""), "only.gguf");
  EXPECT_NE(error_of([&] { pick(files({"notes.txt"}), "o/r", ""); }).find("o/r has no GGUF file"), std::string::npos);
}

TEST(HubQuant, LabelsFromFileNames) {
  EXPECT_EQ(quant_label("LLaDA-8B-Instruct.Q4_K_M.gguf"), "Q4_K_M");
  EXPECT_EQ(quant_label("GSAI-ML_LLaDA-8B-Instruct-IQ4_XS.gguf"), "IQ4_XS");
  EXPECT_EQ(quant_label("x/model.bf16.gguf"), "BF16");
  EXPECT_EQ(quant_label("tiny-llada-Q8_0.gguf"), "Q8_0");
  EXPECT_EQ(quant_label("only.gguf"), "");
}

TEST(HubListing, ReadsTheTreeAndTheModelInfoShapes) {
  // The tree API: folders skipped, lfs.oid is the sha256, files kept in git have no lfs (no sha256).
  auto tree = parse_file_list(R"([
    {"type":"directory","oid":"abc","size":0,"path":"sub"},
    {"type":"file","oid":"1111111111111111111111111111111111111111","size":93,"path":"README.md"},
    {"type":"file","oid":"2222222222222222222222222222222222222222","size":135,"path":"sub/m.Q8_0.gguf",
     "lfs":{"oid":"8C69EA94CC30D050F0D5134FC49E843B59A4328DDE2D287B08AF346EFBB252DD","size":4920000000,
            "pointerSize":135}}])",
                              "o/r");
  ASSERT_EQ(tree.size(), 2u);
  EXPECT_EQ(tree[0].path, "README.md");
  EXPECT_EQ(tree[0].sha256, "");
  EXPECT_EQ(tree[1].path, "sub/m.Q8_0.gguf");
  EXPECT_EQ(tree[1].size, 4920000000ull);  // lfs.size, the real file's, not the pointer's
  EXPECT_EQ(tree[1].sha256, "8c69ea94cc30d050f0d5134fc49e843b59a4328dde2d287b08af346efbb252dd");
  // The model-info object (siblings with lfs.sha256, as /api/models/{repo}?blobs=true gives them).
  auto info = parse_file_list(R"({"id":"o/r","siblings":[{"rfilename":"a.gguf","size":7,
    "lfs":{"sha256":"a2bd815cc842d703fd68a8c566b67ffc4ea781f547566987acff7976f091430c","size":7}},
    {"rfilename":"config.json"}]})",
                              "o/r");
  ASSERT_EQ(info.size(), 2u);
  EXPECT_EQ(info[0].sha256, "a2bd815cc842d703fd68a8c566b67ffc4ea781f547566987acff7976f091430c");
  EXPECT_EQ(info[1].size, 0u);
  // Not JSON, not a listing, a path that would escape the cache.
  EXPECT_NE(error_of([] { parse_file_list("<!DOCTYPE html><html>", "o/r"); }).find("not valid JSON"), std::string::npos);
  EXPECT_NE(error_of([] { parse_file_list(R"({"error":"x"})", "o/r"); }).find("not a file list"), std::string::npos);
  EXPECT_NE(error_of([] { parse_file_list(R"([{"type":"file","path":"../../x.gguf"}])", "o/r"); }).find("unsafe"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_file_list(R"([{"type":"file","path":"/etc/x.gguf"}])", "o/r"); }).find("unsafe"),
            std::string::npos);
}

TEST(HubListing, DeepOrHugeListingsAreRefusedBeforeParsing) {
  // 30 million levels would take gigabytes once parsed; the depth is checked on the text first.
  std::string deep = std::string(1000000, '[') + std::string(1000000, ']');
  std::string e = error_of([&] { parse_file_list(deep, "o/r"); });
  EXPECT_NE(e.find("the hub's file list for o/r is nested deeper than 16 levels"), std::string::npos) << e;
  // Brackets inside strings do not count.
  auto ok = parse_file_list(R"([{"type":"file","path":"[[[[[[[[[[[[[[[[[[[[.gguf","size":5,"x":"\"{{{{{{{{{{{{{{{{{{{{"}])",
                            "o/r");
  ASSERT_EQ(ok.size(), 1u);
  EXPECT_EQ(ok[0].path, "[[[[[[[[[[[[[[[[[[[[.gguf");
  std::string huge = "[" + std::string(17u << 20, ' ') + "]";
  e = error_of([&] { parse_file_list(huge, "o/r"); });
  EXPECT_NE(e.find("the hub's file list for o/r is larger than 16.8 MB"), std::string::npos) << e;
}

TEST(HubCache, StallTimeoutFromTheEnvironment) {
  EnvVar cache("DLLM_CACHE", "/tmp/dllm-cache-test");
  {
    EnvVar stall("DLLM_STALL_TIMEOUT", nullptr);
    EXPECT_EQ(options_from_env().stall_seconds, 60);
  }
  {
    EnvVar stall("DLLM_STALL_TIMEOUT", "2");
    EXPECT_EQ(options_from_env().stall_seconds, 2);
  }
  for (const char* bad : {"0", "-1", "2s", "100000"}) {
    EnvVar stall("DLLM_STALL_TIMEOUT", bad);
    EXPECT_NE(error_of([] { options_from_env(); }).find("DLLM_STALL_TIMEOUT must be a number of seconds"),
              std::string::npos)
        << bad;
  }
}

TEST(HubListing, NamesWithControlBytesOrInvalidUtf8AreRefused) {
  // A NUL would cut the name where the file system sees it: "a.gguf\0x" and "a.gguf" would share FILE.part,
  // FILE.lock and FILE.sha256. Control bytes, DEL and invalid UTF-8 are refused the same way, before any file.
  for (const char* bad : {R"(a.gguf\u0000x)", R"(a\u0001.gguf)", R"(a\u001b]0;pwned\u0007.gguf)", R"(a\u007f.gguf)",
                          R"(dir\n/a.gguf)", R"(a\t.gguf)"}) {
    std::string listing = std::string(R"([{"type":"file","path":")") + bad + R"(","size":5}])";
    EXPECT_NE(error_of([&] { parse_file_list(listing, "o/r"); }).find("unsafe path"), std::string::npos) << bad;
  }
  std::string invalid = "[{\"type\":\"file\",\"path\":\"a\xc3(.gguf\",\"size\":5}]";  // nlohmann rejects it too
  EXPECT_NE(error_of([&] { parse_file_list(invalid, "o/r"); }), "");
  for (std::string bad : {std::string("a\0b.gguf", 8), std::string("a\xff.gguf"), std::string("a\xc0\xaf.gguf"),
                          std::string("a\xed\xa0\x80.gguf"), std::string("a\x7f"), std::string("a\x1f")})
    EXPECT_FALSE(safe_relative_path(bad)) << bad;
  EXPECT_TRUE(safe_relative_path("sub/mod\xc3\xa9le-Q4_K_M.gguf"));  // UTF-8 names are fine
  EXPECT_EQ(parse_file_list(R"([{"type":"file","path":"d/\u00e9t\u00e9.gguf","size":5}])", "o/r").at(0).path,
            "d/\xc3\xa9t\xc3\xa9.gguf");
}

TEST(HubListing, HostileNamesAreEscapedInMessages) {
  // A control byte in a refused name, and a right-to-left override (valid UTF-8, so a legal name) in a listed one.
  std::string e = error_of([] { parse_file_list(R"([{"type":"file","path":"a\u001b]0;x\u0007.gguf","size":5}])", "o/r"); });
  EXPECT_EQ(e.find('\x1b'), std::string::npos) << e;
  EXPECT_NE(e.find("unsafe path: a\\x1b]0;x\\x07.gguf"), std::string::npos) << e;
  auto listed = parse_file_list(R"([{"type":"file","path":"evil\u202eggu.Q8_0.gguf","size":5}])", "o/r");
  e = error_of([&] { choose_gguf(listed, ModelId{"o/r", "Q5_K_M"}); });
  EXPECT_EQ(e.find("\xe2\x80\xae"), std::string::npos) << e;
  EXPECT_NE(e.find("evil\\u202eggu.Q8_0.gguf"), std::string::npos) << e;
}

TEST(HubListing, DownloadUrlsEncodeEachSegment) {
  Options o;
  o.endpoint = "https://hf-mirror.example";
  EXPECT_EQ(file_url(o, "o/r", "sub dir/m+1.gguf"), "https://hf-mirror.example/o/r/resolve/main/sub%20dir/m%2B1.gguf");
}

TEST(HubCache, FolderFromTheEnvironment) {
  {
    EnvVar a("DLLM_CACHE", "/data/dllm-cache"), b("XDG_CACHE_HOME", "/xdg");
    EXPECT_EQ(cache_dir_from_env(), "/data/dllm-cache");
  }
  {
    EnvVar a("DLLM_CACHE", nullptr), b("XDG_CACHE_HOME", "/xdg"), c("HOME", "/home/u");
    EXPECT_EQ(cache_dir_from_env(), "/xdg/dllm");
  }
  {
    EnvVar a("DLLM_CACHE", ""), b("XDG_CACHE_HOME", "relative/ignored"), c("HOME", "/home/u");
    EXPECT_EQ(cache_dir_from_env(), "/home/u/.cache/dllm");
  }
  {
    EnvVar a("DLLM_CACHE", nullptr), b("XDG_CACHE_HOME", nullptr), c("HOME", "/home/u");
    EXPECT_EQ(cache_dir_from_env(), "/home/u/.cache/dllm");
    Options o;
    o.cache_dir = cache_dir_from_env();
    EXPECT_EQ(repo_cache_dir(o, "owner/repo"), "/home/u/.cache/dllm/models/owner/repo");
  }
  EnvVar e("HF_ENDPOINT", "http://127.0.0.1:9/"), t("HF_TOKEN", "hf_x"), off("HF_HUB_OFFLINE", "1");
  Options o = options_from_env();
  EXPECT_EQ(o.endpoint, "http://127.0.0.1:9");
  EXPECT_EQ(o.token, "hf_x");
  EXPECT_TRUE(o.offline);
  EnvVar off0("HF_HUB_OFFLINE", "0");
  EXPECT_FALSE(options_from_env().offline);
}

TEST(HubCache, ResolveKeepsPathsAsTheyAre) {
  // Paths never touch the cache nor the network, even offline and with no HOME.
  EnvVar off("HF_HUB_OFFLINE", "1"), home("HOME", nullptr), c("DLLM_CACHE", nullptr), x("XDG_CACHE_HOME", nullptr);
  EXPECT_EQ(resolve_model("/nonexistent-dir/model.gguf"), "/nonexistent-dir/model.gguf");
  std::string fixture = dllm::test::data_path("models/tiny-llada-Q4_K_M.gguf");
  EXPECT_EQ(resolve_model(fixture), fixture);
}

TEST(HubLock, OneHolderAtATimeAndTheWaiterIsTold) {
  char dir[] = "/tmp/dllm-hub-lock-XXXXXX";
  ASSERT_TRUE(mkdtemp(dir));
  const std::string path = std::string(dir) + "/f.gguf.lock";
  std::atomic<int> inside{0}, max_inside{0}, waits{0};
  auto worker = [&] {
    FileLock lock(path, [&](long pid) {
      EXPECT_TRUE(pid == 0 || pid == static_cast<long>(getpid()));  // the holder's pid, once it has written it
      ++waits;
    });
    int now = ++inside;
    max_inside = std::max(max_inside.load(), now);
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    --inside;
  };
  std::vector<std::thread> ts;
  for (int i = 0; i < 4; ++i) ts.emplace_back(worker);
  for (auto& t : ts) t.join();
  EXPECT_EQ(max_inside.load(), 1);
  EXPECT_GE(waits.load(), 1);
  EXPECT_FALSE(file_exists(path));  // the last holder removed it
  std::filesystem::remove_all(dir);
}

TEST(HubFormat, BytesAndDurations) {
  EXPECT_EQ(format_bytes(512), "512 B");
  EXPECT_EQ(format_bytes(1422656), "1.42 MB");
  EXPECT_EQ(format_bytes(4920000000ull), "4.92 GB");
  EXPECT_EQ(format_bytes(25600000), "25.6 MB");
  EXPECT_EQ(format_duration(42.4), "42s");
  EXPECT_EQ(format_duration(185), "3m05s");
  EXPECT_EQ(format_duration(3720), "1h02m");
}

// The mixture-of-experts GGUF repositories as their converters name the files (llada-moe: LLaDA-MoE-7B-A1B;
// rnd1: RND1-30B-A3B, whose quantisers ship Q5_K_M, Q4_K_M, Q4_K_S, IQ4_XS, Q8_0 side by side): an id picks
// the quant it names, and no quant picks Q4_K_M.
TEST(HubQuant, MixtureOfExpertsReposPickTheirQuants) {
  auto moe = files({"LLaDA-MoE-7B-A1B-Instruct.Q4_K_M.gguf", "LLaDA-MoE-7B-A1B-Instruct.Q4_K_S.gguf",
                    "LLaDA-MoE-7B-A1B-Instruct.Q5_K_M.gguf", "LLaDA-MoE-7B-A1B-Instruct.Q8_0.gguf",
                    "LLaDA-MoE-7B-A1B-Instruct.IQ4_XS.gguf", "README.md"});
  EXPECT_EQ(pick(moe, "mradermacher/LLaDA-MoE-7B-A1B-Instruct-GGUF", ""), "LLaDA-MoE-7B-A1B-Instruct.Q4_K_M.gguf");
  EXPECT_EQ(pick(moe, "mradermacher/LLaDA-MoE-7B-A1B-Instruct-GGUF", "Q8_0"), "LLaDA-MoE-7B-A1B-Instruct.Q8_0.gguf");
  EXPECT_EQ(pick(moe, "mradermacher/LLaDA-MoE-7B-A1B-Instruct-GGUF", "q5_k_m"), "LLaDA-MoE-7B-A1B-Instruct.Q5_K_M.gguf");
  auto rnd1 = files({"RND1-Base-0910-Q4_K_M.gguf", "RND1-Base-0910-Q8_0.gguf", "RND1-Base-0910-IQ4_XS.gguf",
                     "RND1-Base-0910-F16.gguf"});
  EXPECT_EQ(pick(rnd1, "o/RND1-Base-0910-GGUF", ""), "RND1-Base-0910-Q4_K_M.gguf");
  EXPECT_EQ(pick(rnd1, "o/RND1-Base-0910-GGUF", "IQ4_XS"), "RND1-Base-0910-IQ4_XS.gguf");
  EXPECT_EQ(quant_label("RND1-Base-0910-Q4_K_M.gguf"), "Q4_K_M");
}

// unsloth/diffusiongemma-26B-A4B-it-GGUF's names: plain and dynamic (UD-...-K_XL) quants, an mmproj file and a
// split BF16 in a folder.
TEST(HubQuant, DiffusionGemmaRepoPicksItsQuants) {
  const std::string repo = "unsloth/diffusiongemma-26B-A4B-it-GGUF";
  auto fs = files({"diffusiongemma-26B-A4B-it-Q4_K_M.gguf", "diffusiongemma-26B-A4B-it-UD-Q4_K_XL.gguf",
                   "diffusiongemma-26B-A4B-it-Q8_0.gguf", "diffusiongemma-26B-A4B-it-UD-IQ2_XXS.gguf",
                   "diffusiongemma-26B-A4B-it-Q5_K_S.gguf", "diffusiongemma-26B-A4B-it-IQ4_NL.gguf",
                   "mmproj-F16.gguf", "BF16/diffusiongemma-26B-A4B-it-BF16-00001-of-00002.gguf",
                   "BF16/diffusiongemma-26B-A4B-it-BF16-00002-of-00002.gguf", "README.md"});
  EXPECT_EQ(pick(fs, repo, ""), "diffusiongemma-26B-A4B-it-Q4_K_M.gguf");
  EXPECT_EQ(pick(fs, repo, "Q4_K_XL"), "diffusiongemma-26B-A4B-it-UD-Q4_K_XL.gguf");
  EXPECT_EQ(pick(fs, repo, "UD-Q4_K_XL"), "diffusiongemma-26B-A4B-it-UD-Q4_K_XL.gguf");
  EXPECT_EQ(pick(fs, repo, "iq2_xxs"), "diffusiongemma-26B-A4B-it-UD-IQ2_XXS.gguf");
  EXPECT_EQ(pick(fs, repo, "Q8_0"), "diffusiongemma-26B-A4B-it-Q8_0.gguf");
  EXPECT_EQ(quant_label("diffusiongemma-26B-A4B-it-UD-Q4_K_XL.gguf"), "Q4_K_XL");
  EXPECT_EQ(quant_label("diffusiongemma-26B-A4B-it-UD-IQ2_XXS.gguf"), "IQ2_XXS");
  // A quant that is not there lists every choice by its label.
  const std::string e = error_of([&] { pick(fs, repo, "Q3_K_M"); });
  for (const char* c : {"Q4_K_XL (", "IQ2_XXS (", "Q5_K_S (", "IQ4_NL (", "Q8_0 ("})
    EXPECT_NE(e.find(c), std::string::npos) << c << " in " << e;
  EXPECT_EQ(e.find("mmproj"), std::string::npos) << e;
  // The split BF16 is two files: ambiguous, named.
  EXPECT_THROW(choose_gguf(fs, ModelId{repo, "BF16"}), AmbiguousError);
}
