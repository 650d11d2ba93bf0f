// `dllm run --prompts-file`: requests of a JSON Lines file through the engine's batch, on the tiny models of
// both architectures. Every answer is the answer of `dllm run` with the same settings as flags, token for
// token, whatever --batch-size (1, 3, 8) and whatever the per-request overrides (lengths, steps, seeds,
// temperature > 0, remasking, threshold and dual cache); answers come in input order with "index" and "id";
// standard input ("-"); the text mode's blank-line separators; every bad line is a usage error naming its
// line and key, with nothing on stdout and no forward pass; the flags that cannot go with a file; Ctrl-C.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <sstream>

#include "support.h"

namespace dllm::test {
namespace {

using nlohmann::json;

const std::string kLlada = data_path("models/tiny-llada-F32.gguf");
const std::string kDream = data_path("models/tiny-dream-F32.gguf");
const std::string kMissing = "/nonexistent/model.gguf";

class ReferenceExecutorEnv : public ::testing::Environment {
 public:
  void SetUp() override { setenv("DLLM_EXECUTOR", "reference", 1); }
};
const auto* const kEnv = ::testing::AddGlobalTestEnvironment(new ReferenceExecutorEnv);

// A temporary request file, removed with the object.
class TempFile {
 public:
  explicit TempFile(const std::string& text) {
    char tpl[] = "/tmp/dllm-prompts-XXXXXX";
    const int fd = mkstemp(tpl);
    path_ = tpl;
    EXPECT_EQ(::write(fd, text.data(), text.size()), static_cast<ssize_t>(text.size()));
    close(fd);
  }
  ~TempFile() { unlink(path_.c_str()); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

std::string lines_of(const std::vector<json>& requests) {
  std::string text;
  for (const auto& r : requests) text += r.dump() + "\n";
  return text;
}

// The flags `dllm run` takes for one request line (the file's keys as flags, after the shared flags).
std::vector<std::string> flags_of(const json& req, const std::vector<std::string>& defaults) {
  std::vector<std::string> a = defaults;
  // A key given in the line replaces the shared flag of the same name.
  auto set = [&](const std::string& flag, const std::string& value) {
    for (size_t i = 0; i < a.size(); ++i) {
      if (a[i] == flag) {
        if (value.empty()) return;  // a bool flag already there
        a[i + 1] = value;
        return;
      }
    }
    a.push_back(flag);
    if (!value.empty()) a.push_back(value);
  };
  for (const auto& [k, v] : req.items()) {
    if (k == "id") continue;
    if (k == "prompt") {
      set("--prompt", v.get<std::string>());
    } else if (k == "prompt_tokens") {
      std::string ids;
      for (const auto& id : v) ids += (ids.empty() ? "" : ",") + std::to_string(id.get<int64_t>());
      set("--prompt-tokens", ids);
    } else if (k == "no_chat" || k == "dual_cache") {
      if (v.get<bool>()) set(k == "no_chat" ? "--no-chat" : "--dual-cache", "");
    } else {
      std::string flag = "--" + k;
      std::replace(flag.begin(), flag.end(), '_', '-');
      set(flag, v.is_string() ? v.get<std::string>() : v.dump());
    }
  }
  return a;
}

std::vector<json> json_lines(const std::string& out) {
  std::vector<json> v;
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);) v.push_back(json::parse(line));
  return v;
}

// The answers of `dllm run` one request at a time: --json objects and plain texts.
struct Single {
  std::vector<json> reports;
  std::vector<std::string> text;
};
Single one_at_a_time(const std::string& model, const std::vector<json>& requests,
                     const std::vector<std::string>& defaults) {
  Single s;
  for (const auto& req : requests) {
    std::vector<std::string> args = {"run", "--model", model};
    const auto f = flags_of(req, defaults);
    args.insert(args.end(), f.begin(), f.end());
    auto plain = run_dllm(args);
    EXPECT_EQ(plain.exit_code, 0) << req.dump() << "\n" << plain.err;
    s.text.push_back(plain.out);
    args.push_back("--json");
    auto r = run_dllm(args);
    EXPECT_EQ(r.exit_code, 0) << req.dump() << "\n" << r.err;
    s.reports.push_back(json::parse(r.out));
  }
  return s;
}

void expect_same_answers(const std::string& model, const std::vector<json>& requests,
                         const std::vector<std::string>& defaults) {
  const Single single = one_at_a_time(model, requests, defaults);
  const TempFile file(lines_of(requests));
  for (const char* batch : {"1", "3", "8"}) {
    std::vector<std::string> args = {"run", "--model", model, "--prompts-file", file.path(), "--batch-size", batch};
    args.insert(args.end(), defaults.begin(), defaults.end());
    args.push_back("--json");
    auto r = run_dllm(args);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.err, "");
    const auto got = json_lines(r.out);
    ASSERT_EQ(got.size(), requests.size()) << r.out;
    for (size_t i = 0; i < got.size(); ++i) {
      SCOPED_TRACE("batch " + std::string(batch) + ", request " + std::to_string(i) + ": " + requests[i].dump());
      EXPECT_EQ(got[i]["index"], i);  // input order
      EXPECT_EQ(got[i]["id"], requests[i].contains("id") ? requests[i]["id"] : json(nullptr));
      for (const char* k : {"prompt_ids", "output_ids", "text", "answer_length", "steps_run", "steps_total",
                            "forward_passes", "stopped_early", "interrupted"})
        EXPECT_EQ(got[i][k], single.reports[i][k]) << k;
      json s1 = single.reports[i]["settings"], s2 = got[i]["settings"];
      EXPECT_EQ(s2["system"], nullptr);
      s2.erase("system");
      EXPECT_EQ(s2, s1);
      for (const char* k : {"load_ms", "prompt_ms", "generate_ms", "step_mean_ms", "total_ms"})
        EXPECT_TRUE(got[i]["timings"].contains(k)) << k;
      for (const char* k : {"tokens_per_s", "peak_rss_bytes", "model", "device", "gpu_profile"})
        EXPECT_TRUE(got[i].contains(k)) << k;
    }
    // Text mode: each answer as `run` prints it, a blank line between two.
    args.pop_back();
    auto text = run_dllm(args);
    ASSERT_EQ(text.exit_code, 0) << text.err;
    std::string expected;
    for (size_t i = 0; i < single.text.size(); ++i) expected += (i ? "\n" : "") + single.text[i];
    EXPECT_EQ(text.out, expected);
  }
}

TEST(PromptsFile, LladaAnswersEqualSingleRunsWithOverrides) {
  const std::vector<json> requests = {
      {{"prompt", "Write a haiku about the sea"}, {"id", "first"}},
      {{"prompt", "hi"}, {"max_tokens", 32}, {"block_length", 16}, {"steps", 16}, {"temperature", 0.8}, {"seed", 7}},
      {{"prompt_tokens", {1012, 5, 9}}, {"max_tokens", 8}, {"block_length", 8}, {"steps", 4},
       {"remasking", "random"}, {"seed", 3}, {"id", 17}},
      {{"prompt", "Tell me a story"}, {"steps", 16}, {"threshold", 0.5}, {"dual_cache", true}},
      {{"prompt", "abc def"}, {"no_chat", true}, {"max_tokens", 24}, {"steps", 12}},
      {{"prompt", "x"}, {"dual_cache", true}, {"temperature", 0.5}, {"seed", 99}},
  };
  expect_same_answers(kLlada, requests, {"--max-tokens", "16", "--block-length", "8", "--steps", "8"});
}

TEST(PromptsFile, DreamAnswersEqualSingleRunsWithOverrides) {
  const std::vector<json> requests = {
      {{"prompt", "What is the capital of France?"}},
      {{"prompt", "hi"}, {"max_tokens", 8}, {"steps", 8}, {"remasking", "maskgit_plus"}, {"temperature", 0.7},
       {"seed", 11}},
      {{"prompt_tokens", {5, 6, 7}}, {"max_tokens", 12}, {"steps", 6}, {"remasking", "topk_margin"}},
      {{"prompt", "x"}, {"max_tokens", 20}, {"steps", 10}, {"id", 42}},
      {{"prompt", "no template"}, {"no_chat", true}, {"temperature", 1.0}, {"seed", 5}},
  };
  expect_same_answers(kDream, requests, {"--max-tokens", "16", "--steps", "8"});
}

TEST(PromptsFile, StandardInputBlankLinesAndSystem) {
  const std::string text = "\n{\"prompt\": \"hi\", \"id\": \"a\"}\n   \n\r\n{\"prompt\": \"hi\", \"system\": \"Be brief.\"}\r\n";
  const std::vector<std::string> flags = {"--max-tokens", "8", "--block-length", "8", "--steps", "4", "--json"};
  std::vector<std::string> args = {"run", "--model", kLlada, "--prompts-file", "-"};
  args.insert(args.end(), flags.begin(), flags.end());
  auto r = run_dllm(args, text);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto got = json_lines(r.out);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0]["index"], 0);
  EXPECT_EQ(got[0]["id"], "a");
  EXPECT_EQ(got[1]["index"], 1);
  EXPECT_EQ(got[1]["id"], nullptr);
  EXPECT_EQ(got[1]["settings"]["system"], "Be brief.");
  // The same file from a path gives the same answers; the system turn changes the prompt.
  const TempFile file(text);
  args[4] = file.path();
  auto from_path = run_dllm(args);
  EXPECT_EQ(json_lines(from_path.out)[0]["output_ids"], got[0]["output_ids"]);
  EXPECT_NE(got[1]["prompt_ids"], got[0]["prompt_ids"]);
  EXPECT_GT(got[1]["prompt_ids"].size(), got[0]["prompt_ids"].size());
  // A byte order mark before the first line; --verbose sums the batch up on stderr.
  auto bom = run_dllm({"run", "--model", kLlada, "--prompts-file", "-", "--max-tokens", "8", "--block-length", "8", "--verbose"},
                      "\xEF\xBB\xBF{\"prompt\": \"hi\"}\n");
  EXPECT_EQ(bom.exit_code, 0) << bom.err;
  EXPECT_NE(bom.err.find("requests: 1, 1 answered, batch size 8\n"), std::string::npos) << bom.err;
  EXPECT_NE(bom.err.find("peak resident memory: "), std::string::npos) << bom.err;
  // An empty file: no requests, no output.
  auto empty = run_dllm({"run", "--model", kLlada, "--prompts-file", "-"}, "\n\n");
  EXPECT_EQ(empty.exit_code, 0) << empty.err;
  EXPECT_EQ(empty.out, "");
}

// A bad line: usage error (2) naming the line and the key, nothing on stdout, no forward pass (no step
// lines from --dump-step-stats). The good lines before it do not run either.
void expect_line_error(const std::string& model, const std::string& bad, int line, const std::string& message) {
  SCOPED_TRACE(bad);
  std::string text;
  for (int i = 1; i < line; ++i) text += i == 2 ? "\n" : "{\"prompt\": \"fine\", \"max_tokens\": 8, \"steps\": 8}\n";
  text += bad + "\n{\"prompt\": \"after\"}\n";
  auto r = run_dllm({"run", "--model", model, "--prompts-file", "-", "--dump-step-stats", "--block-length", "8"}, text);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(r.err, "ERROR: --prompts-file - (standard input) line " + std::to_string(line) + ": " + message + "\n");
}

TEST(PromptsFile, BadLinesNameTheLineAndTheKey) {
  const std::vector<std::tuple<std::string, std::string>> cases = {
      {"{\"prompt\": \"x\"", "not valid JSON ("},
      {"not json", "not valid JSON ("},
      {"[1, 2]", "needs a JSON object, got [1,2]"},
      {"\"text\"", "needs a JSON object, got \"text\""},
      {"{\"prompt\": \"x\", \"max_token\": 8}", "unknown key \"max_token\" (did you mean \"max_tokens\"?)"},
      {"{\"prompt\": \"x\", \"colour\": 1}", "unknown key \"colour\""},
      {"{\"prompt\": 5}", "key \"prompt\" needs a string, got 5"},
      {"{\"prompt\": \"x\", \"max_tokens\": \"8\"}", "key \"max_tokens\" needs an integer, got \"8\""},
      {"{\"prompt\": \"x\", \"max_tokens\": 8.5}", "key \"max_tokens\" needs an integer, got 8.5"},
      {"{\"prompt\": \"x\", \"max_tokens\": 0}", "key \"max_tokens\" must be at least 1, got 0"},
      {"{\"prompt\": \"x\", \"steps\": -2}", "key \"steps\" must be at least 1, got -2"},
      {"{\"prompt\": \"x\", \"block_length\": 0}", "key \"block_length\" must be at least 1, got 0"},
      {"{\"prompt\": \"x\", \"temperature\": -1}", "key \"temperature\" must be at least 0, got -1"},
      {"{\"prompt\": \"x\", \"temperature\": true}", "key \"temperature\" needs a number, got true"},
      {"{\"prompt\": \"x\", \"threshold\": 1.5}", "key \"threshold\" must be between 0 and 1, got 1.5"},
      {"{\"prompt\": \"x\", \"seed\": -1}", "key \"seed\" must be at least 0, got -1"},
      {"{\"prompt\": \"x\", \"dual_cache\": 1}", "key \"dual_cache\" needs true or false, got 1"},
      {"{\"prompt\": \"x\", \"no_chat\": \"yes\"}", "key \"no_chat\" needs true or false, got \"yes\""},
      {"{\"prompt\": \"x\", \"remasking\": \"best\"}",
       "key \"remasking\" must be one of low_confidence|random|entropy|maskgit_plus|topk_margin, got \"best\""},
      {"{\"prompt\": \"x\", \"id\": [1]}", "key \"id\" needs a string or a number, got [1]"},
      {"{\"prompt\": \"x\", \"system\": null}", "key \"system\" needs a string, got null"},
      {"{\"prompt_tokens\": \"1,2\"}", "key \"prompt_tokens\" needs an array of token ids, got \"1,2\""},
      {"{\"prompt_tokens\": [1, \"a\"]}", "key \"prompt_tokens\" needs an array of integers, got \"a\" in it"},
      {"{\"prompt_tokens\": [1, -4]}", "key \"prompt_tokens\" needs non-negative ids, got -4"},
      {"{\"prompt\": \"x\", \"prompt_tokens\": [1]}",
       "keys \"prompt\" and \"prompt_tokens\" cannot be combined: give one of them"},
      {"{\"id\": 3}", "needs key \"prompt\" or \"prompt_tokens\""},
      {"{\"prompt\": \"x\", \"max_tokens\": 8, \"steps\": 16}",
       "key \"steps\" must be at most \"max_tokens\" 8, got 16 (every step commits at least one token)"},
  };
  // Errors of the file alone come before the model is opened: the model path does not even exist.
  for (const auto& [bad, message] : cases) {
    SCOPED_TRACE(bad);
    auto r = run_dllm({"run", "--model", kMissing, "--prompts-file", "-"}, "{\"prompt\": \"ok\"}\n\n" + bad + "\n");
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_EQ(r.out, "");
    EXPECT_EQ(r.err.rfind("ERROR: --prompts-file - (standard input) line 3: " + message, 0), 0u) << r.err;
  }
}

TEST(PromptsFile, RequestsTheModelRefusesNameTheLineAndTheKey) {
  // Checked against the model's vocabulary and architecture before the weights: no step ran for the good
  // lines before the bad one, and nothing was printed.
  expect_line_error(kLlada, "{\"prompt_tokens\": [1, 2, 5000]}", 3,
                    "\"prompt_tokens\": id 5000 at position 2 is out of range: the model's vocabulary has 1024 "
                    "tokens (ids 0..1023)");
  expect_line_error(kLlada, "{\"prompt\": \"x\", \"max_tokens\": 20, \"steps\": 2}", 3,
                    "\"steps\" 2 is fewer than the block count 3 (\"max_tokens\" 20 / \"block_length\" 8, rounded "
                    "up): every block needs at least one step");
  expect_line_error(kLlada, "{\"prompt\": \"x\", \"remasking\": \"entropy\"}", 1,
                    "\"remasking\" entropy is not available for LLaDA models (use low_confidence or random)");
  expect_line_error(kLlada, "{\"prompt\": \"x\", \"max_tokens\": 4096}", 3,
                    "the canvas of 15 prompt tokens + \"max_tokens\" 4096 is longer than the model's context length "
                    "4096");
  expect_line_error(kDream, "{\"prompt\": \"x\", \"threshold\": 0.5}", 3,
                    "\"threshold\" is for LLaDA models only (this model is Dream)");
  expect_line_error(kDream, "{\"prompt\": \"x\", \"dual_cache\": true}", 3,
                    "\"dual_cache\" is for LLaDA models only (this model is Dream)");
  expect_line_error(kDream, "{\"prompt_tokens\": []}", 3, "the prompt is empty: Dream needs at least one prompt token");
  expect_line_error(kDream, "{\"prompt\": \"x\", \"remasking\": \"random\"}", 3,
                    "\"remasking\" random is not available for Dream models (use entropy, maskgit_plus or topk_margin)");
  // A request combining dual_cache with the --full-logits flag.
  auto r = run_dllm({"run", "--model", kLlada, "--prompts-file", "-", "--full-logits"},
                    "{\"prompt\": \"x\", \"dual_cache\": true}\n");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err, "ERROR: --prompts-file - (standard input) line 1: keys \"dual_cache\" and \"full_logits\" cannot be combined\n");
}

TEST(PromptsFile, FlagsThatCannotGoWithAFile) {
  const TempFile file("{\"prompt\": \"x\"}\n");
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--prompt", "x"}, "flags --prompts-file and --prompt cannot be combined"},
      {{"--prompt-file", "f"}, "flags --prompts-file and --prompt-file cannot be combined"},
      {{"--prompt-tokens", "1,2"}, "flags --prompts-file and --prompt-tokens cannot be combined"},
      {{"--visual"}, "flags --prompts-file and --visual cannot be combined"},
      {{"--batch-size", "0"}, "flag --batch-size must be at least 1, got 0"},
      {{"--batch-size", "1025"}, "flag --batch-size must be at most 1024, got 1025"},
      {{"--batch-size", "two"}, "flag --batch-size needs an integer, got 'two'"},
  };
  for (const auto& [extra, message] : cases) {
    std::vector<std::string> args = {"run", "--model", kMissing, "--prompts-file", file.path()};
    args.insert(args.end(), extra.begin(), extra.end());
    auto r = run_dllm(args);
    EXPECT_EQ(r.exit_code, 2) << message;
    EXPECT_EQ(r.out, "");
    EXPECT_EQ(r.err.rfind("ERROR: " + message + "\n", 0), 0u) << r.err;
  }
  auto r = run_dllm({"run", "--model", kMissing, "--prompt", "x", "--batch-size", "4"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err, "ERROR: flag --batch-size needs --prompts-file\n");
  auto missing = run_dllm({"run", "--model", kLlada, "--prompts-file", "/nonexistent/requests.jsonl"});
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_EQ(missing.err, "ERROR: cannot read --prompts-file /nonexistent/requests.jsonl: No such file or directory\n");
  auto help = run_dllm({"run", "--help"});
  EXPECT_NE(help.out.find("--prompts-file"), std::string::npos);
  EXPECT_NE(help.out.find("--batch-size"), std::string::npos);
}

TEST(PromptsFile, InterruptPrintsWhatFinishedAndExits130) {
  // Two short requests, then a long one: Ctrl-C once the long one runs.
  const TempFile file(
      "{\"prompt\": \"a\", \"max_tokens\": 4, \"block_length\": 4, \"steps\": 2, \"id\": \"short1\"}\n"
      "{\"prompt\": \"b\", \"max_tokens\": 4, \"block_length\": 4, \"steps\": 2, \"id\": \"short2\"}\n"
      "{\"prompt\": \"c\", \"max_tokens\": 512, \"block_length\": 512, \"steps\": 512, \"id\": \"long\"}\n");
  const auto r = run_dllm_interrupted({"run", "--model", kLlada, "--prompts-file", file.path(), "--batch-size", "1",
                                       "--json", "--dump-step-stats", "--no-early-stop"},
                                      "request=2 step=");
  ASSERT_FALSE(r.signaled);
  EXPECT_EQ(r.exit_code, 130);
  const std::string& out = r.out;
  const std::string& err = r.err;
  const auto got = json_lines(out);
  ASSERT_EQ(got.size(), 2u) << out;
  EXPECT_EQ(got[0]["id"], "short1");
  EXPECT_EQ(got[1]["id"], "short2");
  EXPECT_NE(err.find("interrupted: 2 of 3 requests finished\n"), std::string::npos) << err;
}

}  // namespace
}  // namespace dllm::test
