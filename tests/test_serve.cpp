// dllm serve end to end: a real server on 127.0.0.1 (port 0) with the tiny fixture models. curl checks the
// raw protocol (SSE framing, error bodies and codes, the key, limits, /metrics, the queue, SIGTERM); the
// official `openai` Python client (tests/serve/openai_check.py, from the venv `./dllm test` creates under
// build/) checks chat and completions against `dllm run` token for token and multi-turn prompts against
// jinja2's rendering of the models' own templates; tests/serve/load_check.py runs 32 streaming clients and
// 8 that disconnect; headless Chromium drives the page at /. Also the pieces the server streams with
// (committed prefix, UTF-8 and stop-string hold-back).
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <thread>

#include "common/printable.h"
#include "server/stream.h"
#include "support.h"

namespace dllm::test {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

const std::string kLlada = "models/tiny-llada-Q8_0.gguf";
const std::string kDream = "models/tiny-dream-Q8_0.gguf";

struct Http {
  int status = 0;
  std::string headers, body;
  json j() const { return json::parse(body); }
};

// curl with the given arguments; the status, response headers and body.
Http curl(const std::vector<std::string>& args) {
  char body_tpl[] = "/tmp/dllm-curl-body-XXXXXX";
  char head_tpl[] = "/tmp/dllm-curl-head-XXXXXX";
  close(mkstemp(body_tpl));
  close(mkstemp(head_tpl));
  std::vector<std::string> a = {"-sS", "--max-time", "120", "-o", body_tpl, "-D", head_tpl, "-w", "%{http_code}"};
  a.insert(a.end(), args.begin(), args.end());
  const RunResult r = run_program("curl", a);
  Http h;
  h.status = std::atoi(r.out.c_str());
  h.body = read_file(body_tpl);
  h.headers = read_file(head_tpl);
  unlink(body_tpl);
  unlink(head_tpl);
  return h;
}

Http post(const ServeProcess& s, const std::string& path, const std::string& body,
          std::vector<std::string> extra = {}) {
  std::vector<std::string> a = {"-H", "Content-Type: application/json", "--data-binary", body};
  a.insert(a.end(), extra.begin(), extra.end());
  a.push_back(s.url() + path);
  return curl(a);
}

Http get(const ServeProcess& s, const std::string& path, std::vector<std::string> extra = {}) {
  extra.push_back(s.url() + path);
  return curl(extra);
}

// The answer `dllm run` gives (its --json): answer ids and text.
struct RunAnswer {
  std::vector<int32_t> tokens;
  std::string text;
};
RunAnswer run_answer(const std::vector<std::string>& args) {
  std::vector<std::string> a = {"run", "--json"};
  a.insert(a.end(), args.begin(), args.end());
  const RunResult r = run_dllm(a);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  const json j = json::parse(r.out);
  const auto out = j.at("output_ids").get<std::vector<int32_t>>();
  const size_t n = j.at("answer_length").get<size_t>();
  return {std::vector<int32_t>(out.begin(), out.begin() + static_cast<long>(n)), j.at("text").get<std::string>()};
}

// The SSE events of a body: each "data: ..." payload, checking the framing (every event one data line and a
// blank line; nothing else but comments).
std::vector<std::string> sse_events(const std::string& body) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos < body.size()) {
    const size_t end = body.find("\n\n", pos);
    EXPECT_NE(end, std::string::npos) << "an event without its blank line at " << pos;
    if (end == std::string::npos) break;
    const std::string ev = body.substr(pos, end - pos);
    pos = end + 2;
    EXPECT_EQ(ev.rfind("data: ", 0), 0u) << ev;
    EXPECT_EQ(ev.find('\n'), std::string::npos) << ev;
    out.push_back(ev.substr(6));
  }
  return out;
}

// The server shared by the protocol tests: tiny LLaDA, 16-token answers in blocks of 8.
class ServeLlada : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    server_ = new ServeProcess({"--model", data_path(kLlada), "--max-tokens", "16", "--block-length", "8",
                                "--threads", "2", "--batch-size", "4"});
  }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  static ServeProcess* server_;
};
ServeProcess* ServeLlada::server_ = nullptr;

TEST_F(ServeLlada, HealthModelsAndPage) {
  Http h = get(*server_, "/health");
  EXPECT_EQ(h.status, 200);
  EXPECT_EQ(h.j()["status"], "ok");
  h = get(*server_, "/v1/models");
  ASSERT_EQ(h.status, 200);
  EXPECT_EQ(h.j()["object"], "list");
  EXPECT_EQ(h.j()["data"][0]["id"], "tiny-llada-Q8_0");
  h = get(*server_, "/");
  EXPECT_EQ(h.status, 200);
  EXPECT_NE(h.headers.find("text/html"), std::string::npos);
  EXPECT_NE(h.body.find("id=\"canvas\""), std::string::npos);
  EXPECT_EQ(h.body.find("http://"), std::string::npos) << "the page loads nothing from elsewhere";
  EXPECT_EQ(h.body.find("https://"), std::string::npos);
}

TEST_F(ServeLlada, GreedyAnswersEqualRun) {
  const RunAnswer chat = run_answer({"--model", data_path(kLlada), "--prompt", "Hello there", "--max-tokens", "16",
                                     "--block-length", "8"});
  Http h = post(*server_, "/v1/chat/completions",
                R"({"model": "tiny-llada-Q8_0", "messages": [{"role": "user", "content": "Hello there"}],
                    "return_tokens": true, "top_p": 1, "frequency_penalty": 0, "tools": [], "user": "u1"})");
  ASSERT_EQ(h.status, 200) << h.body;
  json j = h.j();
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["choices"][0]["dllm"]["tokens"].get<std::vector<int32_t>>(), chat.tokens);
  EXPECT_EQ(j["choices"][0]["message"]["content"], chat.text);
  EXPECT_EQ(j["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(j["usage"]["completion_tokens"], chat.tokens.size());
  EXPECT_EQ(j["usage"]["total_tokens"], j["usage"]["prompt_tokens"].get<int>() + static_cast<int>(chat.tokens.size()));

  // Completions: the raw prompt, no template; settings from the body (max_tokens, steps, block_length).
  const RunAnswer raw = run_answer({"--model", data_path(kLlada), "--prompt", "The sea is", "--no-chat",
                                    "--max-tokens", "24", "--block-length", "8", "--steps", "12"});
  h = post(*server_, "/v1/completions",
           R"({"prompt": "The sea is", "max_tokens": 24, "block_length": 8, "steps": 12, "return_tokens": true})");
  ASSERT_EQ(h.status, 200) << h.body;
  j = h.j();
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["choices"][0]["dllm"]["tokens"].get<std::vector<int32_t>>(), raw.tokens);
  EXPECT_EQ(j["choices"][0]["text"], raw.text);
}

TEST_F(ServeLlada, StreamFramingAndCommittedText) {
  const std::string body = R"({"messages": [{"role": "user", "content": "Tell me a story"}], "max_tokens": 32,
      "stream": true, "stream_options": {"include_usage": true, "include_canvas": true}})";
  const Http whole = post(*server_, "/v1/chat/completions",
                          R"({"messages": [{"role": "user", "content": "Tell me a story"}], "max_tokens": 32})");
  ASSERT_EQ(whole.status, 200);
  const std::string answer = whole.j()["choices"][0]["message"]["content"];
  const Http h = post(*server_, "/v1/chat/completions", body, {"-N"});
  ASSERT_EQ(h.status, 200) << h.body;
  EXPECT_NE(h.headers.find("text/event-stream"), std::string::npos);
  const auto events = sse_events(h.body);
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events.back(), "[DONE]");
  std::string text;
  int64_t last_step = -1, last_masks = 1 << 30;
  bool role_first = false, saw_finish = false, saw_usage = false;
  size_t canvases = 0;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    const json c = json::parse(events[i]);
    EXPECT_EQ(c["object"], "chat.completion.chunk");
    if (c.contains("dllm")) {
      ++canvases;
      const json& d = c["dllm"];
      EXPECT_GT(d["step"].get<int64_t>(), last_step);
      last_step = d["step"];
      ASSERT_EQ(d["canvas"].size(), 32u);
      int64_t masks = 0;
      for (const auto& p : d["canvas"]) masks += p.is_null();
      EXPECT_LE(masks, last_masks) << "a committed position was masked again";
      last_masks = masks;
      // Text shown so far never runs past the canvas's committed prefix.
      continue;
    }
    if (c.contains("usage")) {
      saw_usage = true;
      EXPECT_TRUE(c["choices"].empty());
      EXPECT_EQ(c["usage"]["completion_tokens"], whole.j()["usage"]["completion_tokens"]);
      continue;
    }
    const json& ch = c["choices"][0];
    if (!role_first) {
      EXPECT_EQ(ch["delta"]["role"], "assistant");
      role_first = true;
    }
    EXPECT_FALSE(saw_finish) << "text after the finish_reason";
    if (ch["delta"].contains("content")) text += ch["delta"]["content"].get<std::string>();
    if (!ch["finish_reason"].is_null()) {
      saw_finish = true;
      EXPECT_EQ(ch["finish_reason"], whole.j()["choices"][0]["finish_reason"]);
    }
  }
  EXPECT_TRUE(saw_finish && saw_usage && role_first);
  EXPECT_GT(canvases, 1u);
  EXPECT_EQ(text, answer);
}

TEST_F(ServeLlada, StopStringsAndChoices) {
  const Http whole = post(*server_, "/v1/completions", R"({"prompt": "Once upon a time", "max_tokens": 32})");
  ASSERT_EQ(whole.status, 200);
  const std::string text = whole.j()["choices"][0]["text"];
  ASSERT_GE(text.size(), 8u);
  // A stop string from the middle of the greedy answer: the answer ends before it, finish_reason stop.
  const std::string stop = text.substr(text.size() / 2, 3);
  const std::string expected = text.substr(0, text.find(stop));
  const json req = {{"prompt", "Once upon a time"}, {"max_tokens", 32}, {"stop", {stop}}};
  Http h = post(*server_, "/v1/completions", req.dump());
  ASSERT_EQ(h.status, 200) << h.body;
  EXPECT_EQ(h.j()["choices"][0]["text"], expected);
  EXPECT_EQ(h.j()["choices"][0]["finish_reason"], "stop");
  json sreq = req;
  sreq["stream"] = true;
  h = post(*server_, "/v1/completions", sreq.dump(), {"-N"});
  std::string streamed, finish;
  for (const auto& e : sse_events(h.body)) {
    if (e == "[DONE]") continue;
    const json c = json::parse(e);
    streamed += c["choices"][0]["text"].get<std::string>();
    if (!c["choices"][0]["finish_reason"].is_null()) finish = c["choices"][0]["finish_reason"];
  }
  EXPECT_EQ(streamed, expected);
  EXPECT_EQ(finish, "stop");

  // n = 3 with sampling: three choices, seeds seed, seed+1, seed+2 (the first equals a single request).
  h = post(*server_, "/v1/completions",
           R"({"prompt": "Once upon a time", "max_tokens": 16, "n": 3, "temperature": 1.5, "seed": 7})");
  ASSERT_EQ(h.status, 200) << h.body;
  ASSERT_EQ(h.j()["choices"].size(), 3u);
  const Http one =
      post(*server_, "/v1/completions", R"({"prompt": "Once upon a time", "max_tokens": 16, "temperature": 1.5, "seed": 7})");
  EXPECT_EQ(h.j()["choices"][0]["text"], one.j()["choices"][0]["text"]);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(h.j()["choices"][i]["index"], i);
}

TEST_F(ServeLlada, ErrorsNameTheField) {
  struct Case {
    std::string path, body;
    int status;
    std::string param, code;
  };
  const std::vector<Case> cases = {
      {"/v1/chat/completions", "{not json", 400, "", ""},
      {"/v1/chat/completions", "[1, 2]", 400, "", ""},
      {"/v1/chat/completions", R"({"max_tokens": 8})", 400, "messages", "missing_field"},
      {"/v1/chat/completions", R"({"messages": []})", 400, "messages", "invalid_value"},
      {"/v1/chat/completions", R"({"messages": [{"role": "robot", "content": "x"}]})", 400, "messages[0].role",
       "invalid_value"},
      {"/v1/chat/completions", R"({"messages": [{"role": "user", "content": 5}]})", 400, "messages[0].content",
       "invalid_value"},
      {"/v1/chat/completions", R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": "many"})", 400,
       "max_tokens", "invalid_value"},
      {"/v1/chat/completions", R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0})", 400,
       "max_tokens", "invalid_value"},
      {"/v1/chat/completions", R"({"messages": [{"role": "user", "content": "x"}], "temperature": -1})", 400,
       "temperature", "invalid_value"},
      {"/v1/chat/completions", R"({"messages": [{"role": "user", "content": "x"}], "n": 99})", 400, "n",
       "invalid_value"},
      {"/v1/chat/completions", R"({"messages": [{"role": "user", "content": "x"}], "stop": [1]})", 400, "stop",
       "invalid_value"},
      {"/v1/chat/completions", R"({"messages": [{"role": "user", "content": "x"}], "remasking": "best"})", 400,
       "remasking", "invalid_value"},
      {"/v1/chat/completions", R"({"messages": [{"role": "user", "content": "x"}], "threshold": 2})", 400,
       "threshold", "invalid_value"},
      {"/v1/chat/completions", R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": 16, "steps": 1})",
       400, "steps", "invalid_value"},
      {"/v1/chat/completions", R"({"messages": [{"role": "user", "content": "x"}], "steps": 99})", 400, "steps",
       "invalid_value"},
      {"/v1/completions", R"({"prompt": [999999]})", 400, "prompt", "invalid_value"},
      {"/v1/completions", R"({"prompt": ["a", [999999]]})", 400, "prompt", "invalid_value"},
      // Fields asking for what the server does not do: named, until they are implemented (their neutral
      // values pass: GreedyAnswersEqualRun).
      {"/v1/chat/completions", R"({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_object"}})",
       400, "response_format", "unsupported_field"},
      {"/v1/chat/completions", R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]})",
       400, "tools", "unsupported_field"},
      {"/v1/chat/completions", R"({"messages": [{"role": "user", "content": "x"}], "tool_choice": "auto"})", 400,
       "tool_choice", "unsupported_field"},
      {"/v1/chat/completions", R"({"messages": [{"role": "user", "content": "x"}], "top_p": 0.9})", 400, "top_p",
       "unsupported_field"},
      {"/v1/completions", R"({"prompt": "x", "presence_penalty": 0.5})", 400, "presence_penalty", "unsupported_field"},
      {"/v1/completions", R"({"prompt": "x", "logit_bias": {"5": 100}})", 400, "logit_bias", "unsupported_field"},
      {"/v1/completions", R"({"prompt": {"a": 1}})", 400, "prompt", "invalid_value"},
      {"/v1/chat/completions", R"({"model": "gpt-4", "messages": [{"role": "user", "content": "x"}]})", 404,
       "model", "model_not_found"},
      // The prompt and the canvas past the model's context (4096): 400 naming the prompt.
      {"/v1/completions", R"({"prompt": "x", "max_tokens": 4096, "block_length": 4096})", 400, "prompt",
       "context_length_exceeded"},
      {"/v1/chat/completions",
       R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": 4096, "block_length": 4096})", 400,
       "messages", "context_length_exceeded"},
  };
  for (const Case& c : cases) {
    const Http h = post(*server_, c.path, c.body);
    EXPECT_EQ(h.status, c.status) << c.body << " -> " << h.body;
    json e;
    ASSERT_NO_THROW(e = h.j()) << h.body;
    ASSERT_TRUE(e.contains("error")) << h.body;
    EXPECT_TRUE(e["error"]["message"].is_string());
    EXPECT_TRUE(e["error"]["type"].is_string());
    if (!c.param.empty()) {
      EXPECT_EQ(e["error"]["param"], c.param) << h.body;
      if (c.code != "context_length_exceeded") {
        EXPECT_NE(e["error"]["message"].get<std::string>().find(c.param), std::string::npos) << h.body;
      }
    }
    if (!c.code.empty()) {
      EXPECT_EQ(e["error"]["code"], c.code) << h.body;
    }
  }
  // Unknown paths and methods, and a body over the limit (4 MiB), in the same error form.
  Http h = get(*server_, "/v1/nothing");
  EXPECT_EQ(h.status, 404);
  EXPECT_EQ(h.j()["error"]["code"], "unknown_url");
  const std::string big_path = (fs::temp_directory_path() / "dllm-serve-big.json").string();
  {
    std::ofstream f(big_path);
    f << R"({"prompt": ")" << std::string(5 << 20, 'a') << R"("})";
  }
  h = curl({"-H", "Content-Type: application/json", "--data-binary", "@" + big_path, server_->url() + "/v1/completions"});
  fs::remove(big_path);
  EXPECT_EQ(h.status, 413);
  EXPECT_EQ(h.j()["error"]["code"], "request_too_large");
  // Still serving.
  EXPECT_EQ(get(*server_, "/health").status, 200);
}

// The endpoints apps expect from llama-server: /tokenize and /detokenize (the ids `dllm tokenize`
// gives), /props, /v1/models/{id}.
TEST_F(ServeLlada, TokenizerPropsAndModelEndpoints) {
  const std::string text = "Hello world, the sea is blue.";
  const RunResult t = run_dllm({"tokenize", "--model", data_path(kLlada), "--prompt", text, "--no-chat", "--json"});
  ASSERT_EQ(t.exit_code, 0) << t.err;
  const auto ids = json::parse(t.out)["ids"].get<std::vector<int32_t>>();
  Http h = post(*server_, "/tokenize", json({{"content", text}, {"add_special", true}}).dump());
  ASSERT_EQ(h.status, 200) << h.body;
  EXPECT_EQ(h.j()["tokens"].get<std::vector<int32_t>>(), ids);
  h = post(*server_, "/tokenize", json({{"content", text}, {"with_pieces", true}}).dump());
  ASSERT_EQ(h.status, 200) << h.body;
  const json pieces = h.j()["tokens"];
  std::string joined;
  for (const auto& p : pieces) joined += p["piece"].get<std::string>();
  EXPECT_EQ(joined, text);
  json plain = json::array();
  for (const auto& p : pieces) plain.push_back(p["id"]);
  h = post(*server_, "/detokenize", json({{"tokens", plain}}).dump());
  ASSERT_EQ(h.status, 200) << h.body;
  EXPECT_EQ(h.j()["content"], text);
  h = post(*server_, "/detokenize", R"({"tokens": [1, 99999999]})");
  EXPECT_EQ(h.status, 400);
  EXPECT_EQ(h.j()["error"]["param"], "tokens");
  h = post(*server_, "/tokenize", R"({"text": "x"})");
  EXPECT_EQ(h.status, 400);
  EXPECT_EQ(h.j()["error"]["param"], "content");

  h = get(*server_, "/props");
  ASSERT_EQ(h.status, 200) << h.body;
  EXPECT_EQ(h.j()["model"], "tiny-llada-Q8_0");
  EXPECT_EQ(h.j()["context_length"], 4096);
  EXPECT_EQ(h.j()["defaults"]["max_tokens"], 16);
  EXPECT_EQ(h.j()["defaults"]["block_length"], 8);
  EXPECT_EQ(h.j()["limits"]["batch_size"], 4);
  EXPECT_EQ(h.j()["limits"]["max_body_bytes"], 4 << 20);
  h = get(*server_, "/v1/models/tiny-llada-Q8_0");
  ASSERT_EQ(h.status, 200);
  EXPECT_EQ(h.j()["id"], "tiny-llada-Q8_0");
  h = get(*server_, "/v1/models/gpt-4");
  EXPECT_EQ(h.status, 404);
  EXPECT_EQ(h.j()["error"]["code"], "model_not_found");
}

// /v1/completions with a list of prompts: n choices per prompt in order, each as its single request.
// A request without a seed gets a fresh one; completion_tokens counts the answer up to a stop string.
TEST_F(ServeLlada, PromptListsSeedsAndStopCounts) {
  Http h = post(*server_, "/v1/completions",
                R"({"prompt": ["The sea is", "Once upon a time"], "max_tokens": 16, "n": 2, "temperature": 1.5,
                    "seed": 7})");
  ASSERT_EQ(h.status, 200) << h.body;
  const json list = h.j();
  ASSERT_EQ(list["choices"].size(), 4u);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(list["choices"][i]["index"], i);
  const Http second = post(*server_, "/v1/completions",
                           R"({"prompt": "Once upon a time", "max_tokens": 16, "temperature": 1.5, "seed": 7})");
  EXPECT_EQ(list["choices"][2]["text"], second.j()["choices"][0]["text"]);
  // Unseeded: fresh seeds (six samples at a high temperature are not all the same answer).
  std::set<std::string> answers;
  for (int i = 0; i < 6; ++i) {
    h = post(*server_, "/v1/completions", R"({"prompt": "Once upon a time", "max_tokens": 16, "temperature": 3})");
    ASSERT_EQ(h.status, 200) << h.body;
    answers.insert(h.j()["choices"][0]["text"].get<std::string>());
  }
  EXPECT_GT(answers.size(), 1u);
  // A stop string: completion_tokens counts the tokens up to it (the returned ids cover the text and no
  // fewer would).
  const Http whole = post(*server_, "/v1/completions", R"({"prompt": "Once upon a time", "max_tokens": 32})");
  const std::string text = whole.j()["choices"][0]["text"];
  ASSERT_GE(text.size(), 8u);
  const std::string stop = text.substr(text.size() / 2, 3);
  h = post(*server_, "/v1/completions",
           json({{"prompt", "Once upon a time"}, {"max_tokens", 32}, {"stop", stop}, {"return_tokens", true}}).dump());
  ASSERT_EQ(h.status, 200) << h.body;
  const auto counted = h.j()["choices"][0]["dllm"]["tokens"].get<std::vector<int32_t>>();
  EXPECT_EQ(h.j()["usage"]["completion_tokens"], counted.size());
  EXPECT_LT(counted.size(), whole.j()["usage"]["completion_tokens"].get<size_t>());
  ASSERT_FALSE(counted.empty());
  const std::string shown = h.j()["choices"][0]["text"];
  const Http all = post(*server_, "/detokenize", json({{"tokens", counted}}).dump());
  const Http fewer = post(*server_, "/detokenize",
                          json({{"tokens", std::vector<int32_t>(counted.begin(), counted.end() - 1)}}).dump());
  EXPECT_EQ(all.j()["content"].get<std::string>().rfind(shown, 0), 0u);
  EXPECT_LT(fewer.j()["content"].get<std::string>().size(), shown.size());
}

// Any max_tokens works (the server's block length is 8; 13 does not divide); logprobs / top_logprobs equal
// `dllm run --json --top-logprobs` for the same request, in OpenAI's chat and completions forms, whole and
// streamed (the final chunk of a choice carries them: a diffusion answer's tokens become final out of order).
TEST_F(ServeLlada, AnyMaxTokensAndLogprobs) {
  Http h = post(*server_, "/v1/chat/completions",
                R"({"messages": [{"role": "user", "content": "Hello there"}], "max_tokens": 13, "return_tokens": true})");
  ASSERT_EQ(h.status, 200) << h.body;
  EXPECT_LE(h.j()["choices"][0]["dllm"]["tokens"].size(), 13u);
  const RunResult run = run_dllm({"run", "--json", "--model", data_path(kLlada), "--prompt", "Hello there",
                                  "--max-tokens", "16", "--block-length", "8", "--top-logprobs", "3"});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  const json ref = json::parse(run.out);
  const size_t n = ref["answer_length"].get<size_t>();
  ASSERT_GE(n, 1u);
  h = post(*server_, "/v1/chat/completions",
           R"({"messages": [{"role": "user", "content": "Hello there"}], "logprobs": true, "top_logprobs": 3,
               "return_tokens": true})");
  ASSERT_EQ(h.status, 200) << h.body;
  const json chat = h.j()["choices"][0];
  const json content = chat["logprobs"]["content"];
  ASSERT_EQ(content.size(), n) << h.body;
  for (size_t i = 0; i < n; ++i) {
    const json& want = ref["logprobs"][i];
    EXPECT_DOUBLE_EQ(content[i]["logprob"].get<double>(), want["logprob"].get<double>()) << i;
    ASSERT_EQ(content[i]["top_logprobs"].size(), 3u);
    for (size_t k = 0; k < 3; ++k)
      EXPECT_DOUBLE_EQ(content[i]["top_logprobs"][k]["logprob"].get<double>(),
                       want["top_logprobs"][k]["logprob"].get<double>());
    // Greedy: the committed token is the most probable one; its bytes are its text.
    EXPECT_DOUBLE_EQ(content[i]["logprob"].get<double>(), content[i]["top_logprobs"][0]["logprob"].get<double>());
    EXPECT_LE(content[i]["logprob"].get<double>(), 0.0);
    std::string bytes;
    for (const auto& b : content[i]["bytes"]) bytes += static_cast<char>(b.get<int>());
    const Http t = post(*server_, "/detokenize", json({{"tokens", {chat["dllm"]["tokens"][i]}}}).dump());
    // (/detokenize answers valid UTF-8: a token holding part of a character shows U+FFFD there)
    EXPECT_EQ(sanitize_utf8(bytes), t.j()["content"].get<std::string>()) << i;
    EXPECT_EQ(sanitize_utf8(bytes), content[i]["token"].get<std::string>()) << i;
  }
  // Completions' form, and a stream's final chunk.
  h = post(*server_, "/v1/completions", R"({"prompt": "The sea is", "logprobs": 2, "max_tokens": 16})");
  ASSERT_EQ(h.status, 200) << h.body;
  const json lp = h.j()["choices"][0]["logprobs"];
  ASSERT_TRUE(lp.is_object()) << h.body;
  EXPECT_EQ(lp["tokens"].size(), lp["token_logprobs"].size());
  EXPECT_EQ(lp["tokens"].size(), lp["top_logprobs"].size());
  EXPECT_EQ(lp["tokens"].size(), lp["text_offset"].size());
  EXPECT_EQ(h.j()["usage"]["completion_tokens"], lp["tokens"].size());
  h = post(*server_, "/v1/chat/completions",
           R"({"messages": [{"role": "user", "content": "Hello there"}], "logprobs": true, "stream": true})", {"-N"});
  json streamed;
  for (const auto& e : sse_events(h.body)) {
    if (e == "[DONE]") continue;
    const json c = json::parse(e);
    if (!c["choices"].empty() && !c["choices"][0]["logprobs"].is_null()) streamed = c["choices"][0]["logprobs"];
  }
  ASSERT_EQ(streamed["content"].size(), n) << h.body;
  for (size_t i = 0; i < n; ++i)
    EXPECT_DOUBLE_EQ(streamed["content"][i]["logprob"].get<double>(), content[i]["logprob"].get<double>());
  // Without logprobs: null; top_logprobs alone is a 400.
  h = post(*server_, "/v1/completions", R"({"prompt": "Hi"})");
  EXPECT_TRUE(h.j()["choices"][0]["logprobs"].is_null());
  h = post(*server_, "/v1/chat/completions", R"({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2})");
  EXPECT_EQ(h.status, 400);
  EXPECT_EQ(h.j()["error"]["param"], "top_logprobs");
}

TEST(Serve, CorsOriginAndBearerInAnyCase) {
  ServeProcess s({"--model", data_path(kLlada), "--max-tokens", "8", "--block-length", "8", "--api-key", "k1",
                  "--cors-origin", "https://app.example", "--allow-host", "dllm.internal"});
  const std::string body = R"({"prompt": "Hi"})";
  // The preflight of the allowed origin, then its request.
  Http h = curl({"-X", "OPTIONS", "-H", "Origin: https://app.example", "-H",
                 "Access-Control-Request-Method: POST", s.url() + "/v1/completions"});
  EXPECT_EQ(h.status, 204);
  EXPECT_NE(h.headers.find("Access-Control-Allow-Origin: https://app.example"), std::string::npos) << h.headers;
  EXPECT_NE(h.headers.find("Authorization"), std::string::npos) << h.headers;
  h = post(s, "/v1/completions", body, {"-H", "Origin: https://app.example", "-H", "Authorization: bearer k1"});
  EXPECT_EQ(h.status, 200) << h.body;
  EXPECT_NE(h.headers.find("Access-Control-Allow-Origin: https://app.example"), std::string::npos) << h.headers;
  h = post(s, "/v1/completions", body, {"-H", "Origin: https://other.example", "-H", "Authorization: Bearer k1"});
  EXPECT_EQ(h.status, 403);
  h = post(s, "/v1/completions", body, {"-H", "Authorization: BEARER k1"});
  EXPECT_EQ(h.status, 200);
  h = post(s, "/v1/completions", body, {"-H", "Authorization: Basic k1"});
  EXPECT_EQ(h.status, 401);
  // A proxy's name, allowed by --allow-host; another name is refused (DNS rebinding).
  EXPECT_EQ(get(s, "/health", {"-H", "Host: dllm.internal:8080"}).status, 200);
  EXPECT_EQ(get(s, "/health", {"-H", "Host: rebound.example"}).status, 403);
  // Without --cors-origin (ServeLlada's server): no CORS header, preflights refused.
  EXPECT_EQ(s.stop(SIGTERM).exit_code, 0);
}

TEST_F(ServeLlada, MalformedRequestsDoNotCrash) {
  const std::vector<std::string> raw = {"GARBAGE\r\n\r\n", "POST /v1/completions HTTP/1.1\r\nContent-Length: 9999\r\n\r\n{",
                                        std::string("\x00\xff\xfe\r\n\r\n", 7),
                                        "POST /v1/chat/completions HTTP/1.1\r\nContent-Length: 3\r\n\r\n\xff\xfe{"};
  for (const std::string& r : raw) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    ASSERT_GE(fd, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(server_->port()));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    ASSERT_EQ(send(fd, r.data(), r.size(), MSG_NOSIGNAL), static_cast<ssize_t>(r.size()));
    shutdown(fd, SHUT_WR);
    char buf[4096];
    timeval tv{5, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    while (recv(fd, buf, sizeof buf, 0) > 0) {
    }
    close(fd);
  }
  EXPECT_EQ(get(*server_, "/health").status, 200);
  // The log names the client's address and port for a request that never parsed.
  EXPECT_TRUE(std::regex_search(server_->err(), std::regex(R"(127\.0\.0\.1:[0-9]+ - - -> 400, [0-9.]+ ms)")))
      << server_->err();
}

TEST_F(ServeLlada, MetricsArePrometheusText) {
  ASSERT_EQ(post(*server_, "/v1/completions", R"({"prompt": "Hi", "max_tokens": 8})").status, 200);
  const Http h = get(*server_, "/metrics");
  ASSERT_EQ(h.status, 200);
  EXPECT_NE(h.headers.find("text/plain"), std::string::npos);
  // Every sample line is NAME{labels} VALUE; every family has HELP and TYPE.
  const std::regex sample(R"(^[a-z_]+(\{[a-z_]+="[^"]*"(,[a-z_]+="[^"]*")*\})? -?[0-9.e+-]+$)");
  std::istringstream in(h.body);
  std::string line;
  std::map<std::string, double> values;
  while (std::getline(in, line)) {
    if (line.rfind("# ", 0) == 0) continue;
    EXPECT_TRUE(std::regex_match(line, sample)) << line;
    values[line.substr(0, line.rfind(' '))] = std::stod(line.substr(line.rfind(' ') + 1));
  }
  for (const char* name : {"dllm_prompt_tokens_total", "dllm_completion_tokens_total", "dllm_steps_total",
                           "dllm_queue_length", "dllm_batch_sequences", "dllm_batch_occupancy",
                           "dllm_step_seconds_count", "dllm_step_seconds_sum", "dllm_step_seconds_bucket{le=\"+Inf\"}"})
    EXPECT_TRUE(values.count(name)) << name << " missing in\n" << h.body;
  EXPECT_GE(values["dllm_steps_total"], 8);
  EXPECT_GE(values["dllm_completion_tokens_total"], 1);
  EXPECT_EQ(values["dllm_step_seconds_count"], values["dllm_steps_total"]);
  EXPECT_GE(values["dllm_requests_total{endpoint=\"/v1/completions\",code=\"200\"}"], 1);
  EXPECT_EQ(values["dllm_queue_length"], 0);
}

TEST(Serve, ApiKey) {
  ServeProcess s({"--model", data_path(kLlada), "--max-tokens", "8", "--block-length", "8", "--api-key", "sekrit"});
  const std::string body = R"({"prompt": "Hi"})";
  Http h = post(s, "/v1/completions", body);
  EXPECT_EQ(h.status, 401);
  EXPECT_EQ(h.j()["error"]["code"], "invalid_api_key");
  h = post(s, "/v1/completions", body, {"-H", "Authorization: Bearer wrong"});
  EXPECT_EQ(h.status, 401);
  EXPECT_EQ(get(s, "/v1/models").status, 401);
  h = post(s, "/v1/completions", body, {"-H", "Authorization: Bearer sekrit"});
  EXPECT_EQ(h.status, 200) << h.body;
  EXPECT_EQ(get(s, "/health").status, 200);  // open: for load balancers
  const RunResult r = s.stop(SIGTERM);
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

// A model whose numbers overflow (NaN router weights: no logit is a number): the request gets a 500 with the
// error (code model_error), a stream gets it as an error event before [DONE], and the server stays up.
TEST(Serve, NonFiniteWeightsAnswerAModelError) {
  const std::string path = poisoned_model_copy("moe/gguf/tiny-llada-moe-F32.gguf", "blk.0.ffn_gate_inp.weight",
                                               std::nanf(""));
  {
    ServeProcess s({"--model", path, "--max-tokens", "8", "--block-length", "8"});
    Http h = post(s, "/v1/completions", R"({"prompt": "Hi"})");
    EXPECT_EQ(h.status, 500) << h.body;
    EXPECT_EQ(h.j()["error"]["code"], "model_error") << h.body;
    EXPECT_NE(h.j()["error"]["message"].get<std::string>().find("no finite logit"), std::string::npos) << h.body;
    h = post(s, "/v1/completions", R"({"prompt": "Hi", "stream": true})");
    EXPECT_EQ(h.status, 200) << h.body;
    const std::vector<std::string> ev = sse_events(h.body);
    ASSERT_GE(ev.size(), 2u) << h.body;
    EXPECT_EQ(ev.back(), "[DONE]");
    EXPECT_EQ(json::parse(ev[ev.size() - 2])["error"]["code"], "model_error") << h.body;
    EXPECT_EQ(get(s, "/health").status, 200);
    const RunResult r = s.stop(SIGTERM);
    EXPECT_EQ(r.exit_code, 0) << r.err;
  }
  std::remove(path.c_str());
}

// A long generation (LLaDA, 1024 tokens, one step each) that keeps the one batch place busy for seconds.
const char* kLong = R"({"prompt": "Hi", "max_tokens": 1024, "block_length": 1024, "stream": true})";

TEST(Serve, FullQueueAndSigtermDrain) {
  ServeProcess s({"--model", data_path(kLlada), "--batch-size", "1", "--max-queue", "0", "--threads", "2",
                  "--shutdown-grace", "1"});
  // A streaming client holds the batch; the next request finds no room: 429 with Retry-After.
  std::string long_body;
  std::thread client([&] { long_body = post(s, "/v1/completions", kLong, {"-N"}).body; });
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (get(s, "/metrics").body.find("\ndllm_batch_sequences 1") == std::string::npos &&
         std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const Http h = post(s, "/v1/completions", R"({"prompt": "Hi", "max_tokens": 32})");
  EXPECT_EQ(h.status, 429) << h.body;
  EXPECT_EQ(h.j()["error"]["code"], "queue_full");
  EXPECT_NE(h.headers.find("Retry-After"), std::string::npos);
  // SIGTERM with the long request in flight: it may run for --shutdown-grace (1 s), then it is cancelled;
  // its stream ends with an error event and [DONE], and the server exits 0.
  const auto t0 = std::chrono::steady_clock::now();
  const RunResult r = s.stop(SIGTERM, 60);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  client.join();
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_FALSE(r.signaled);
  EXPECT_LT(secs, 10.0);
  EXPECT_NE(r.err.find("SIGTERM: no new requests"), std::string::npos) << r.err;
  const auto events = sse_events(long_body);
  ASSERT_GE(events.size(), 2u);
  EXPECT_EQ(events.back(), "[DONE]");
  EXPECT_EQ(json::parse(events[events.size() - 2])["error"]["code"], "shutting_down") << events[events.size() - 2];
}

TEST(Serve, FlagErrors) {
  RunResult r = run_dllm({"serve", "--model", data_path(kLlada), "--port", "70000"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--port must be at most 65535"), std::string::npos) << r.err;
  r = run_dllm({"serve", "--model", data_path(kLlada), "--max-tokens", "64", "--steps", "1"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--steps 1 is fewer than the block count 2"), std::string::npos) << r.err;
  ServeProcess s({"--model", data_path(kLlada)});
  r = run_dllm({"serve", "--model", data_path(kLlada), "--port", std::to_string(s.port())});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("cannot listen on 127.0.0.1:" + std::to_string(s.port())), std::string::npos) << r.err;
  EXPECT_EQ(s.stop(SIGINT).exit_code, 0);
}

// --- the Python parts (the official openai client, jinja2) ---

std::string venv_python() {
  const std::string p = std::string(DLLM_BUILD_DIR) + "/venv/bin/python";
  return fs::exists(p) ? p : std::string();
}

// Skips (with the reason) when the venv or its packages are missing: PyPI was not reachable at set-up.
#define REQUIRE_PYTHON_PACKAGES()                                                                             \
  const std::string py = venv_python();                                                                      \
  if (py.empty()) GTEST_SKIP() << "no " DLLM_BUILD_DIR "/venv: `./dllm test` creates it (pip install openai " \
                                  "jinja2); PyPI was not reachable?";                                          \
  if (run_program(py, {"-c", "import openai, jinja2"}).exit_code != 0)                                        \
  GTEST_SKIP() << "the venv lacks openai or jinja2 (PyPI was not reachable at set-up)"

void openai_check(const std::string& model, const std::vector<std::string>& flags) {
  REQUIRE_PYTHON_PACKAGES();
  std::vector<std::string> args = {"--model", data_path(model)};
  args.insert(args.end(), flags.begin(), flags.end());
  ServeProcess s(args);
  std::vector<std::string> a = {std::string(DLLM_SOURCE_DIR) + "/tests/serve/openai_check.py", "--url", s.url(),
                                "--dllm", DLLM_BINARY, "--model", data_path(model), "--templates",
                                data_path("chat_templates")};
  a.insert(a.end(), flags.begin(), flags.end());
  const RunResult r = run_program(py, a);
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("openai_check: all passed"), std::string::npos) << r.out << r.err;
  EXPECT_EQ(s.stop(SIGTERM).exit_code, 0);
}

TEST(ServeOpenAI, Llada) { openai_check(kLlada, {"--max-tokens", "16", "--block-length", "8"}); }
TEST(ServeOpenAI, Dream) { openai_check(kDream, {"--max-tokens", "16"}); }

TEST(ServeOpenAI, LoadWithDisconnects) {
  REQUIRE_PYTHON_PACKAGES();
  ServeProcess s({"--model", data_path(kLlada), "--max-tokens", "16", "--block-length", "8", "--batch-size", "8",
                  "--max-queue", "64"});
  const RunResult r = run_program(py, {std::string(DLLM_SOURCE_DIR) + "/tests/serve/load_check.py", "--url", s.url(),
                                       "--dllm", DLLM_BINARY, "--model", data_path(kLlada), "--pid",
                                       std::to_string(s.pid())});
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("load_check: all passed"), std::string::npos) << r.out << r.err;
  const RunResult stopped = s.stop(SIGTERM);
  EXPECT_EQ(stopped.exit_code, 0) << stopped.err;
}

// --- scale-out: nginx (deploy/nginx) in front of two replicas ---

// tests/serve/nginx_check.py: two replicas behind nginx on loopback, a bounded load with disconnects, one
// replica killed midway: every request gets an answer or a clean error, none hangs, affinity by conversation
// holds, and the survivor keeps serving.
TEST(ServeNginx, TwoReplicasOneKilled) {
#ifdef __SANITIZE_ADDRESS__
  GTEST_SKIP() << "the edge's timing checks run in the plain build (the sanitized server is several times slower)";
#endif
  const RunResult r = run_program("python3", {std::string(DLLM_SOURCE_DIR) + "/tests/serve/nginx_check.py", "--dllm",
                                              DLLM_BINARY, "--model", data_path(kLlada)});
  if (r.exit_code == 77) GTEST_SKIP() << r.out << r.err;
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("nginx_check: all passed"), std::string::npos) << r.out << r.err;
}

// --- the page, in headless Chromium ---

std::string chromium() {
  for (const char* p : {"/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome"})
    if (fs::exists(p)) return p;
  return "";
}

TEST(ServePage, DenoisesInHeadlessChromium) {
  const std::string browser = chromium();
  if (browser.empty()) GTEST_SKIP() << "no chromium (Debian package chromium; `./dllm test` installs it)";
  ServeProcess s({"--model", data_path(kDream), "--max-tokens", "24"});
  const std::string prompt = "What is the capital of France?";
  const json req = {{"messages", {{{"role", "user"}, {"content", prompt}}}}, {"max_tokens", 24}};
  const Http api = post(s, "/v1/chat/completions", req.dump());
  ASSERT_EQ(api.status, 200);
  const std::string answer = api.j()["choices"][0]["message"]["content"];
  // The test's output folder: the screenshot stays there for people to look at.
  const fs::path out_dir = fs::path(DLLM_BUILD_DIR) / "tests" / "test_serve_output";
  fs::remove(out_dir / "serve_page.png");
  const RunResult r = run_program("python3", {std::string(DLLM_SOURCE_DIR) + "/tests/serve/page_check.py", "--chromium",
                                              browser, "--url", s.url(), "--prompt", prompt, "--max-tokens", "24",
                                              "--out", out_dir.string()});
  fs::remove_all(out_dir / "chromium-profile");
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const json seen = json::parse(r.out);
  EXPECT_EQ(seen["state"], "done") << seen.dump();
  EXPECT_EQ(seen["answer"], answer);  // the page's final text is the API's
  ASSERT_EQ(seen["pieces"].size(), 24u);  // the canvas: one box per position, none masked at the end
  for (const auto& p : seen["pieces"]) EXPECT_FALSE(p.is_null());
  EXPECT_GT(seen["draws"].get<int>(), 2) << "the canvas was drawn as it denoised, not once";
  EXPECT_TRUE(fs::exists(out_dir / "serve_page.png"));
  EXPECT_GT(fs::file_size(out_dir / "serve_page.png"), 10000u);
  EXPECT_NE(seen["legend"].get<std::string>().find("not decided yet"), std::string::npos) << seen.dump();
  EXPECT_TRUE(seen["fits"].get<bool>()) << "a long answer widens the page";
  // On a phone's width (375 px) the page wraps instead of widening.
  const RunResult phone = run_program("python3", {std::string(DLLM_SOURCE_DIR) + "/tests/serve/page_check.py",
                                                  "--chromium", browser, "--url", s.url(), "--prompt", prompt,
                                                  "--max-tokens", "24", "--out", out_dir.string(), "--width", "375"});
  fs::remove_all(out_dir / "chromium-profile");
  ASSERT_EQ(phone.exit_code, 0) << phone.out << phone.err;
  const json small = json::parse(phone.out);
  EXPECT_EQ(small["state"], "done");
  EXPECT_TRUE(small["fits"].get<bool>()) << "the page is wider than a 375 px phone";
  EXPECT_EQ(s.stop(SIGTERM).exit_code, 0);
}

// A DiffusionGemma server's page: no masks; each step the open block's re-noised positions show as faded random
// tokens and the accepted ones flash, the legend says so, and the answer arrives block by block.
TEST(ServePage, ShowsAUniformStateCanvasSettle) {
  const std::string browser = chromium();
  if (browser.empty()) GTEST_SKIP() << "no chromium (Debian package chromium; `./dllm test` installs it)";
  ServeProcess s({"--model", data_path("diffusion-gemma/gguf/tiny-diffusion-gemma-A-Q8_0.gguf"), "--threads", "2"});
  const fs::path out_dir = fs::path(DLLM_BUILD_DIR) / "tests" / "test_serve_output";
  const RunResult r = run_program("python3", {std::string(DLLM_SOURCE_DIR) + "/tests/serve/page_check.py", "--chromium",
                                              browser, "--url", s.url(), "--prompt", "hi", "--max-tokens", "24",
                                              "--out", out_dir.string() + "/diffusion-gemma"});
  fs::remove_all(out_dir / "diffusion-gemma" / "chromium-profile");
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const json seen = json::parse(r.out);
  EXPECT_EQ(seen["state"], "done") << seen.dump();
  EXPECT_EQ(seen["sampler"], "uniform");
  EXPECT_NE(seen["legend"].get<std::string>().find("re-drawn each step"), std::string::npos) << seen.dump();
  EXPECT_EQ(seen["legend"].get<std::string>().find("masked"), std::string::npos) << seen.dump();
  EXPECT_GT(seen["noise_max"].get<int>(), 0) << "re-noised positions were shown";
  EXPECT_GT(seen["draws"].get<int>(), 2);
  // The page sends no seed: a stop token may end the answer early, and the last canvas is cut there.
  EXPECT_GE(seen["pieces"].size(), 1u) << seen.dump();
  EXPECT_LE(seen["pieces"].size(), 32u) << seen.dump();
  for (const auto& p : seen["pieces"]) EXPECT_FALSE(p.is_null()) << "a uniform-state canvas has no masks";
  EXPECT_NE(seen["status"].get<std::string>().find("done"), std::string::npos) << seen.dump();
  EXPECT_EQ(s.stop(SIGTERM).exit_code, 0);
}

// --- the streamed text's pieces ---

TEST(ServeText, CommittedPrefixStopsAtMaskAndEnd) {
  const int32_t M = 9, E = 7;
  const std::vector<int32_t> stops = {E};
  bool ended = false;
  std::vector<int32_t> g = {1, 2, M, 3};
  auto c = server::committed_answer(g, M, stops, &ended);
  EXPECT_EQ(std::vector<int32_t>(c.begin(), c.end()), (std::vector<int32_t>{1, 2}));
  EXPECT_FALSE(ended);
  g = {1, E, M, 3};
  c = server::committed_answer(g, M, stops, &ended);
  EXPECT_EQ(std::vector<int32_t>(c.begin(), c.end()), (std::vector<int32_t>{1}));
  EXPECT_TRUE(ended);
  g = {M, 1};
  EXPECT_TRUE(server::committed_answer(g, M, stops, &ended).empty());
}

TEST(ServeText, NeverSplitsACharacterOrAStopString) {
  server::TextStream t({"END"});
  EXPECT_EQ(t.feed("caf\xc3"), "caf");          // half of é held back
  EXPECT_EQ(t.feed("caf\xc3\xa9 E"), "\xc3\xa9 ");  // "E" may begin END
  EXPECT_EQ(t.feed("caf\xc3\xa9 EN"), "");
  EXPECT_EQ(t.feed("caf\xc3\xa9 ENX"), "ENX");
  EXPECT_FALSE(t.stopped());
  EXPECT_EQ(t.feed("caf\xc3\xa9 ENX yes END more"), " yes ");
  EXPECT_TRUE(t.stopped());
  EXPECT_EQ(t.finish("caf\xc3\xa9 ENX yes END more and more"), "");
  EXPECT_EQ(t.shown(), "caf\xc3\xa9 ENX yes ");
  // An invalid byte becomes U+FFFD; the final text flushes what was held.
  server::TextStream u({});
  EXPECT_EQ(u.feed("a\xff" "b\xe2\x82"), "a\xef\xbf\xbd" "b");
  EXPECT_EQ(u.finish("a\xff" "b\xe2\x82"), "\xef\xbf\xbd\xef\xbf\xbd");
  EXPECT_TRUE(is_valid_utf8(u.shown()));
}

TEST(ServeText, Utf8Helpers) {
  EXPECT_EQ(sanitize_utf8("ok \xc3\xa9"), "ok \xc3\xa9");
  EXPECT_EQ(sanitize_utf8("a\xb2z"), "a\xef\xbf\xbdz");
  EXPECT_EQ(utf8_complete_prefix("ab\xf0\x9f\xa6"), 2u);
  EXPECT_EQ(utf8_complete_prefix("ab\xf0\x9f\xa6\x99"), 6u);
}

// DiffusionGemma through the server: its sampler's settings in the body (the other samplers' refused, naming
// the field), and a stream whose text is the whole answer's, sent block by block: a block being denoised is
// noise, never streamed as answer.
TEST(ServeDiffusionGemma, StreamsEachFinishedBlockAndTakesItsSettings) {
  ServeProcess server({"--model", data_path("diffusion-gemma/gguf/tiny-diffusion-gemma-A-Q8_0.gguf"), "--threads", "2"});
  const std::string req = R"({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 40, "seed": 9,
      "eb_max_steps": 3, "eb_t_max": 0.9)";
  const Http whole = post(server, "/v1/chat/completions", req + "}");
  ASSERT_EQ(whole.status, 200) << whole.body;
  const std::string answer = whole.j()["choices"][0]["message"]["content"];
  EXPECT_EQ(whole.j()["usage"]["completion_tokens"], 40) << "no stop token: three blocks, the last cut";
  const Http h = post(server, "/v1/chat/completions", req + R"(, "stream": true})", {"-N"});
  ASSERT_EQ(h.status, 200) << h.body;
  std::string text;
  int chunks = 0;
  for (const std::string& e : sse_events(h.body)) {
    if (e == "[DONE]") continue;
    const json c = json::parse(e);
    const json& d = c["choices"][0]["delta"];
    if (d.contains("content") && !d["content"].get<std::string>().empty()) text += d["content"].get<std::string>(), ++chunks;
  }
  EXPECT_EQ(text, answer);
  EXPECT_LE(chunks, 3) << "one piece of text per finished block at most";
  // include_canvas: every step's whole canvas (no masks), the accepted and re-noised positions of the open block,
  // its block and temperature; the props show the sampler's defaults.
  const Http hc = post(server, "/v1/chat/completions",
                       req + R"(, "stream": true, "stream_options": {"include_canvas": true}})", {"-N"});
  ASSERT_EQ(hc.status, 200) << hc.body;
  int steps = 0, last_block = -1;
  for (const std::string& e : sse_events(hc.body)) {
    if (e == "[DONE]") continue;
    const json c = json::parse(e);
    if (!c.contains("dllm")) continue;
    const json& d = c["dllm"];
    ++steps;
    const int block = d["block"].get<int>();
    EXPECT_GE(block, last_block);
    last_block = block;
    const size_t n = d["canvas"].size();
    ASSERT_EQ(n, static_cast<size_t>(d["noise"].empty() ? std::min(16 * (block + 1), 40) : 16 * (block + 1))) << d.dump();
    for (const auto& p : d["canvas"]) EXPECT_FALSE(p.is_null());
    for (const auto& p : d["fresh"]) EXPECT_LT(p.get<size_t>(), n);
    if (!d["noise"].empty()) {
      EXPECT_EQ(d["fresh"].size() + d["noise"].size(), 16u) << "accepted and re-noised cover the open block: " << d.dump();
      EXPECT_GE(d["fresh"].size(), 1u);
    }
    for (const auto& p : d["noise"]) EXPECT_GE(p.get<int>(), 16 * block);
    EXPECT_GT(d["temperature"].get<double>(), 0.3);
    EXPECT_LE(d["temperature"].get<double>(), 0.9 + 1e-6);
  }
  EXPECT_EQ(last_block, 2);
  EXPECT_GE(steps, 3);
  const Http props = get(server, "/props");
  ASSERT_EQ(props.status, 200);
  EXPECT_EQ(props.j()["defaults"]["eb_max_steps"], 48) << props.body;
  EXPECT_EQ(props.j()["canvas_length"], 16);
  const Http page = get(server, "/");
  EXPECT_NE(page.body.find("data-sampler=\"uniform\""), std::string::npos);
  // An OpenAI client's habitual temperature is ignored (the sampler's schedule sets the temperatures), and the
  // opt-in approximate self-conditioning with K beyond the vocabulary is the exact path: both the same answer.
  EXPECT_EQ(props.j()["defaults"]["self_cond_top_k"], 0) << props.body;
  for (const char* extra : {R"(, "temperature": 0.7})", R"(, "self_cond_top_k": 100000})"}) {
    const Http same = post(server, "/v1/chat/completions", req + extra);
    ASSERT_EQ(same.status, 200) << same.body;
    EXPECT_EQ(same.j()["choices"][0]["message"]["content"], answer) << extra;
  }
  // Other samplers' settings, and this one's out of range, are refused naming the field.
  for (const auto& [field, body] : std::vector<std::pair<std::string, std::string>>{
           {"steps", R"("steps": 4)"}, {"eb_t_min", R"("eb_t_min": 2)"}, {"self_cond_top_k", R"("self_cond_top_k": -1)"}}) {
    const Http bad = post(server, "/v1/chat/completions", R"({"messages": [{"role": "user", "content": "hi"}], )" + body + "}");
    EXPECT_EQ(bad.status, 400) << body;
    EXPECT_EQ(bad.j()["error"]["param"], field) << bad.body;
  }
}

// The next turn of a chat reuses the first turn's encoded prompt (usage.prompt_tokens_details.cached_tokens)
// and answers as a cold server does; --prefix-cache-mib 0 turns the cache off.
TEST(ServeDiffusionGemma, FollowUpTurnReusesTheCachedPrefix) {
  const std::string model = data_path("diffusion-gemma/gguf/tiny-diffusion-gemma-A-Q8_0.gguf");
  ServeProcess warm({"--model", model, "--threads", "2"});
  ServeProcess cold({"--model", model, "--threads", "2", "--prefix-cache-mib", "0"});
  const json turn1 = {{"messages", {{{"role", "user"}, {"content", "hi there"}}}}, {"max_tokens", 24}, {"seed", 5},
                      {"eb_max_steps", 3}, {"return_tokens", true}};
  const Http a = post(warm, "/v1/chat/completions", turn1.dump());
  ASSERT_EQ(a.status, 200) << a.body;
  EXPECT_EQ(a.j()["usage"]["prompt_tokens_details"]["cached_tokens"], 0) << "nothing cached yet";
  const std::string answer = a.j()["choices"][0]["message"]["content"];
  const int64_t p1 = a.j()["usage"]["prompt_tokens"];
  json turn2 = turn1;
  turn2["messages"] = {{{"role", "user"}, {"content", "hi there"}},
                       {{"role", "assistant"}, {"content", answer}},
                       {{"role", "user"}, {"content", "and then?"}}};
  turn2["seed"] = 6;
  const Http b = post(warm, "/v1/chat/completions", turn2.dump());
  ASSERT_EQ(b.status, 200) << b.body;
  const int64_t cached = b.j()["usage"]["prompt_tokens_details"]["cached_tokens"];
  EXPECT_GE(cached, p1) << "the first turn's prompt at least: " << b.body;
  EXPECT_LT(cached, b.j()["usage"]["prompt_tokens"].get<int64_t>());
  const Http c = post(cold, "/v1/chat/completions", turn2.dump());
  ASSERT_EQ(c.status, 200) << c.body;
  EXPECT_EQ(c.j()["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
  EXPECT_EQ(b.j()["choices"][0]["message"]["content"], c.j()["choices"][0]["message"]["content"]);
  EXPECT_EQ(b.j()["choices"][0]["dllm"]["tokens"], c.j()["choices"][0]["dllm"]["tokens"]) << "token for token";
  // Streaming reports it too.
  json s2 = turn2;
  s2["stream"] = true;
  s2["stream_options"] = {{"include_usage", true}};
  const Http st = post(warm, "/v1/chat/completions", s2.dump(), {"-N"});
  ASSERT_EQ(st.status, 200);
  bool seen = false;
  for (const std::string& e : sse_events(st.body)) {
    if (e == "[DONE]") continue;
    const json j = json::parse(e);
    if (j.contains("usage") && !j["usage"].is_null()) {
      EXPECT_GE(j["usage"]["prompt_tokens_details"]["cached_tokens"].get<int64_t>(), cached) << e;
      seen = true;
    }
  }
  EXPECT_TRUE(seen);
}

}  // namespace
}  // namespace dllm::test
