// `dllm tokenize`: cmd_tokenize called with parsed settings, its stdout captured. Checks the plain and
// --json output against llama.cpp's prompt ids for the tiny models, --no-chat, and the errors for an
// architecture dllm cannot run and for a missing file.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/settings.h"
#include "common/error.h"
#include "support.h"

using dllm::cli::Settings;
using json = nlohmann::json;

namespace {

// Runs cmd_tokenize and returns what it printed on stdout.
std::string run(const Settings& s) {
  std::ostringstream captured;
  std::streambuf* old = std::cout.rdbuf(captured.rdbuf());
  try {
    const int rc = dllm::cli::cmd_tokenize(s);
    std::cout.rdbuf(old);
    EXPECT_EQ(rc, 0);
  } catch (...) {
    std::cout.rdbuf(old);
    throw;
  }
  return captured.str();
}

Settings settings(const std::string& model, const std::string& prompt) {
  Settings s;
  s.command = "tokenize";
  s.model = model;
  s.prompt = prompt;
  s.has_prompt = true;
  return s;
}

std::string llada() { return dllm::test::data_path("models/tiny-llada-Q8_0.gguf"); }
std::string dream() { return dllm::test::data_path("models/tiny-dream-Q4_K_M.gguf"); }

}  // namespace

TEST(TokenizeCommand, PrintsTheChatPromptIdsOnOneLine) {
  // From the llama.cpp runs in ../shared/fixtures/models/generations (tests/data/tokenizer/chat-prompts.jsonl).
  EXPECT_EQ(run(settings(llada(), "Hi")), "1012 1015 84 401 1016 282 39 72 1017 1015 405 82 363 397 1016 282\n");
  const std::string out = run(settings(dream(), "Why is water wet?"));
  EXPECT_EQ(out,
            "1017 82 911 198 412 469 257 373 68 75 79 69 416 388 82 363 397 13 1018 198 1017 84 401 198 "
            "54 71 88 327 279 702 279 703 30 1018 198 1017 405 82 363 397 198\n");
}

TEST(TokenizeCommand, NoChatPrintsTheTextWithTheVocabularysBos) {
  // The tiny LLaDA vocabulary sets add_bos_token (BOS 1012), as llama.cpp's diffusion CLI reads it.
  Settings s = settings(llada(), "Hi");
  s.no_chat = true;
  EXPECT_EQ(run(s), "1012 39 72\n");
  s.prompt = "";
  EXPECT_EQ(run(s), "1012\n");
  // A vocabulary-only GGUF of another architecture can be tokenized without the template.
  Settings q = settings(dllm::test::data_path("tokenizer/vocab-qwen.gguf"), "Hello world");
  q.no_chat = true;
  EXPECT_EQ(run(q), "9707 1879\n");
}

TEST(TokenizeCommand, JsonHasIdsAndPieces) {
  Settings s = settings(llada(), "Hi");
  s.json = true;
  const std::string out = run(s);
  ASSERT_FALSE(out.empty());
  EXPECT_EQ(out.back(), '\n');
  const json j = json::parse(out);
  EXPECT_EQ(j["ids"], json::parse("[1012, 1015, 84, 401, 1016, 282, 39, 72, 1017, 1015, 405, 82, 363, 397, 1016, 282]"));
  ASSERT_EQ(j["pieces"].size(), 16u);
  EXPECT_EQ(j["pieces"][0], "<|startoftext|>");
  EXPECT_EQ(j["pieces"][1], "<|start_header_id|>");
  EXPECT_EQ(j["pieces"][5], "\n\n");
  EXPECT_EQ(j["pieces"][6].get<std::string>() + j["pieces"][7].get<std::string>(), "Hi");
  // A piece that is half of a character is printed with U+FFFD for its bytes, keeping the JSON valid.
  Settings q = settings(dllm::test::data_path("tokenizer/vocab-qwen.gguf"), " \U0001F999");
  q.no_chat = true;
  q.json = true;
  const json jq = json::parse(run(q));
  EXPECT_EQ(jq["ids"], json::parse("[11162, 99, 247]"));  // " \xf0\x9f", "\xa6", "\x99"
  const std::string first = jq["pieces"][0];
  EXPECT_EQ(first.substr(0, 4), " \uFFFD");
}

TEST(TokenizeCommand, ErrorsNameTheProblem) {
  try {
    run(settings(dllm::test::data_path("tokenizer/vocab-qwen.gguf"), "Hi"));
    FAIL() << "no error";
  } catch (const dllm::Error& e) {
    EXPECT_STREQ(e.what(), "unsupported model architecture: qwen2 (supported: llada, dream, llada-moe, rnd1, diffusion-gemma)");
    EXPECT_EQ(e.exit_code(), 1);
  }
  try {
    run(settings("/nonexistent/model.gguf", "Hi"));
    FAIL() << "no error";
  } catch (const dllm::Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot open model file /nonexistent/model.gguf"), std::string::npos);
  }
}

TEST(TokenizeCommand, BinaryEndToEnd) {
  const auto r = dllm::test::run_dllm({"tokenize", "--model", llada(), "--prompt", "Hi", "--no-chat", "--json"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(json::parse(r.out)["ids"], json::parse("[1012, 39, 72]"));
  const auto bad = dllm::test::run_dllm({"tokenize", "--model", dllm::test::data_path("tokenizer/vocab-qwen.gguf"),
                                         "--prompt", "Hi"});
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_EQ(bad.out, "");
  EXPECT_NE(bad.err.find("ERROR: unsupported model architecture: qwen2 (supported: llada, dream, llada-moe, rnd1, diffusion-gemma)"), std::string::npos);
}

TEST(TokenizeCommand, PromptFileAndStandardInput) {
  char tpl[] = "/tmp/dllm-prompt-XXXXXX";
  const int fd = mkstemp(tpl);
  ASSERT_GE(fd, 0);
  const std::string path = tpl;
  auto write_prompt = [&](const std::string& text) {
    FILE* f = std::fopen(path.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    std::fwrite(text.data(), 1, text.size(), f);
    std::fclose(f);
  };
  auto ids_of = [](const dllm::test::RunResult& r) {
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return r.exit_code == 0 ? json::parse(r.out)["ids"] : json();
  };
  // The same bytes through --prompt and --prompt-file: the same ids, invalid UTF-8 included.
  const std::string text = "Caf\xc3\xa9 \xff\xfe end\n";
  write_prompt(text);
  const auto from_file = ids_of(dllm::test::run_dllm({"tokenize", "--model", llada(), "--prompt-file", path, "--json"}));
  const auto from_arg = ids_of(dllm::test::run_dllm({"tokenize", "--model", llada(), "--prompt", text, "--json"}));
  EXPECT_EQ(from_file, from_arg);
  // Past the 128 KiB one argument may hold, with a NUL byte (an argument cannot carry one).
  std::string big = std::string(200000, 'a') + std::string(1, '\0') + "b";
  write_prompt(big);
  const auto big_ids = ids_of(dllm::test::run_dllm({"tokenize", "--model", llada(), "--prompt-file", path, "--no-chat",
                                                     "--json"}));
  ASSERT_TRUE(big_ids.is_array());
  EXPECT_GT(big_ids.size(), 2u);
  // Standard input.
  write_prompt(text);
  const std::string cmd = std::string(DLLM_BINARY) + " tokenize --model '" + llada() + "' --prompt-file - --json < '" +
                          path + "'";
  FILE* p = ::popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  EXPECT_EQ(::pclose(p), 0);
  EXPECT_EQ(json::parse(out)["ids"], from_arg);
  ::unlink(path.c_str());
  // Errors: a missing file (exit 1, named), and two prompts at once (exit 2, before anything is opened).
  const auto missing = dllm::test::run_dllm({"tokenize", "--model", llada(), "--prompt-file", "/nonexistent/p.txt"});
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_EQ(missing.err, "ERROR: cannot read --prompt-file /nonexistent/p.txt: No such file or directory\n");
  const auto both = dllm::test::run_dllm({"run", "--model", "/nonexistent/m.gguf", "--prompt", "x", "--prompt-file", "y"});
  EXPECT_EQ(both.exit_code, 2);
  EXPECT_EQ(both.err, "ERROR: flags --prompt and --prompt-file cannot be combined: give one of them\n");
}

// ---- --messages: a whole conversation ---------------------------------------------------------------

namespace {

std::string gemma4_vocab() { return dllm::test::data_path("diffusion-gemma/tiny-diffusion-gemma-A-vocab.gguf"); }

// A temporary file holding text, removed when the test ends.
struct TempFile {
  std::string path;
  explicit TempFile(const std::string& text) {
    char tpl[] = "/tmp/dllm-messages-XXXXXX";
    const int fd = mkstemp(tpl);
    EXPECT_GE(fd, 0);
    path = tpl;
    FILE* f = fdopen(fd, "wb");
    std::fwrite(text.data(), 1, text.size(), f);
    std::fclose(f);
  }
  ~TempFile() { std::remove(path.c_str()); }
};

std::string ids_line(const std::vector<int32_t>& ids) {
  std::string s;
  for (int32_t id : ids) s += (s.empty() ? "" : " ") + std::to_string(id);
  return s + "\n";
}

}  // namespace

// The fork's conversations (tests/data/diffusion-gemma/chat.jsonl) through the binary: every one rendered with the
// generation prompt gives exactly its ids, from a file and from standard input.
TEST(TokenizeCommand, MessagesGiveTheForksConversationIds) {
  std::istringstream in(dllm::test::read_file(dllm::test::data_path("diffusion-gemma/chat.jsonl")));
  int n = 0;
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    const json c = json::parse(line);
    if (!c["add_generation_prompt"].get<bool>()) continue;  // tokenize always adds it
    const std::string want = ids_line(c["ids"].get<std::vector<int32_t>>());
    const TempFile f(c["messages"].dump());
    const auto r = dllm::test::run_dllm({"tokenize", "--model", gemma4_vocab(), "--messages", f.path});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out, want) << c["id"];
    EXPECT_EQ(r.err, "") << c["id"];
    const auto s = dllm::test::run_dllm({"tokenize", "--model", gemma4_vocab(), "--messages", "-"}, c["messages"].dump());
    EXPECT_EQ(s.exit_code, 0) << s.err;
    EXPECT_EQ(s.out, want) << c["id"];
    ++n;
  }
  EXPECT_EQ(n, 3);
  // --prompt on the same file: the one-user-message conversation (chat.jsonl single_user).
  const auto p = dllm::test::run_dllm({"tokenize", "--model", gemma4_vocab(), "--prompt", "Hello"});
  EXPECT_EQ(p.exit_code, 0) << p.err;
  EXPECT_EQ(p.out, "2 6 916 600 32 366 647 637 7 32 6 321 787 32\n");
}

// Every architecture: one user message through --messages is --prompt's conversation; a system turn and earlier
// turns render as the file's template says.
TEST(TokenizeCommand, MessagesOnEveryArchitecture) {
  for (const std::string& model : {llada(), dream(), dllm::test::data_path("moe/gguf/tiny-llada-moe-Q8_0.gguf"),
                                   dllm::test::data_path("moe/gguf/tiny-rnd1-Q8_0.gguf"), gemma4_vocab()}) {
    const TempFile one(R"([{"role": "user", "content": "Why is water wet?"}])");
    const auto m = dllm::test::run_dllm({"tokenize", "--model", model, "--messages", one.path});
    const auto p = dllm::test::run_dllm({"tokenize", "--model", model, "--prompt", "Why is water wet?"});
    EXPECT_EQ(m.exit_code, 0) << model << ": " << m.err;
    EXPECT_EQ(m.out, p.out) << model;
    const TempFile conv(R"([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                            {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Why?"}])");
    const auto c = dllm::test::run_dllm({"tokenize", "--model", model, "--messages", conv.path, "--json"});
    EXPECT_EQ(c.exit_code, 0) << model << ": " << c.err;
    if (c.exit_code != 0) continue;
    const json out = json::parse(c.out);
    std::string text;
    for (const json& piece : out["pieces"]) text += piece.get<std::string>();
    EXPECT_NE(text.find("Be brief."), std::string::npos) << model << ": " << text;
    EXPECT_NE(text.find("Hello."), std::string::npos) << model << ": " << text;
  }
}

TEST(TokenizeCommand, MessagesErrorsNameTheFileAndTheField) {
  auto error_of = [](const std::string& content) {
    const TempFile f(content);
    const auto r = dllm::test::run_dllm({"tokenize", "--model", gemma4_vocab(), "--messages", f.path});
    EXPECT_EQ(r.exit_code, 1) << content;
    EXPECT_EQ(r.out, "");
    const std::string prefix = "ERROR: --messages " + f.path + ": ";
    EXPECT_EQ(r.err.rfind(prefix, 0), 0u) << r.err;
    return r.err.substr(std::min(r.err.size(), prefix.size()));
  };
  EXPECT_EQ(error_of("[]").rfind("needs a non-empty JSON array of messages", 0), 0u);
  EXPECT_EQ(error_of(R"({"role": "user", "content": "x"})").rfind("needs a non-empty JSON array", 0), 0u);
  EXPECT_EQ(error_of("[{").rfind("not valid JSON (", 0), 0u);
  EXPECT_EQ(error_of(R"([{"role": "user", "content": "x"}, "hi"])"), "messages[1] is not an object {\"role\", \"content\"}\n");
  EXPECT_EQ(error_of(R"([{"role": "user", "content": "x"}, {"content": "y"}])"), "messages[1].role is missing\n");
  EXPECT_EQ(error_of(R"([{"role": 3, "content": "x"}])"), "messages[0].role is not a string\n");
  EXPECT_EQ(error_of(R"([{"role": "tool", "content": "x"}])"),
            "messages[0].role must be system, user or assistant, got 'tool'\n");
  EXPECT_EQ(error_of(R"([{"role": "user"}])"), "messages[0].content is missing\n");
  EXPECT_EQ(error_of(R"([{"role": "user", "content": ["x"]}])"), "messages[0].content is not a string\n");

  const auto missing = dllm::test::run_dllm({"tokenize", "--model", gemma4_vocab(), "--messages", "/nonexistent/m.json"});
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_NE(missing.err.find("cannot read --messages /nonexistent/m.json"), std::string::npos) << missing.err;
  // Usage: one source of the conversation, and a template to render it with.
  for (const auto& extra : {std::vector<std::string>{"--prompt", "x"}, std::vector<std::string>{"--no-chat"}}) {
    std::vector<std::string> args = {"tokenize", "--model", gemma4_vocab(), "--messages", "-"};
    args.insert(args.end(), extra.begin(), extra.end());
    const auto r = dllm::test::run_dllm(args, "[]");
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_NE(r.err.find("flags --messages and " + extra[0] + " cannot be combined"), std::string::npos) << r.err;
  }
}
