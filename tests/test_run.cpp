// `dllm run`: every run flag of the spec's table reaches the generation loop (settings -> config in one
// function), and end-to-end runs of the binary on the tiny models: --json against the reference
// generations, plain text, --verbose, --dump-step-stats, --visual, --prompt-tokens, the architecture's
// usage errors, --device gpu, and Ctrl-C with the partial canvas and exit status 130.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "cli/args.h"
#include "cli/run_config.h"
#include "cli/run_output.h"
#include "jit/cpu_features.h"
#include "common/error.h"
#include "model/gguf.h"
#include "common/thread_pool.h"
#include "support.h"

namespace dllm::cli {
namespace {

using nlohmann::json;
using test::data_path;
using test::run_dllm;

const std::string kLlada = data_path("models/tiny-llada-F32.gguf");
const std::string kDream = data_path("models/tiny-dream-F32.gguf");

// The reference executor for every binary run: the outputs are compared with reference generations.
class ReferenceExecutorEnv : public ::testing::Environment {
 public:
  void SetUp() override { setenv("DLLM_EXECUTOR", "reference", 1); }
};
const auto* const kEnv = ::testing::AddGlobalTestEnvironment(new ReferenceExecutorEnv);

json reference(const std::string& name) { return json::parse(test::read_file(data_path("generations/" + name))); }

std::string hex_bytes(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) out += static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16));
  return out;
}

// --- settings -> generation config ---

model::HParams hparams_of(const std::string& path) { return model::read_hparams(*gguf::File::open(path)); }

model::GenerateConfig config_for(std::vector<std::string> args, const std::string& model_path) {
  std::vector<std::string> argv = {"run", "--model", model_path, "--prompt", "hi"};
  argv.insert(argv.end(), args.begin(), args.end());
  std::string help;
  const Settings s = parse_command_line(argv, &help);
  return generation_config(s, hparams_of(model_path), {7, 8});
}

TEST(RunConfig, DefaultsOfTheSpec) {
  const auto l = config_for({}, kLlada);
  EXPECT_EQ(l.arch, model::Arch::LLaDA);
  EXPECT_EQ(l.max_tokens, 128);
  EXPECT_EQ(l.steps, 128);  // --steps defaults to --max-tokens
  EXPECT_EQ(l.block_length, 32);
  EXPECT_EQ(l.temperature, 0.0);
  EXPECT_EQ(l.remasking, model::Remasking::LowConfidence);
  EXPECT_EQ(l.threshold, 0.0);
  EXPECT_FALSE(l.dual_cache);
  EXPECT_EQ(l.seed, 42u);
  EXPECT_FALSE(l.full_logits);
  EXPECT_TRUE(l.early_stop);
  EXPECT_EQ(l.mask_id, 1014);
  EXPECT_EQ(l.stop_ids, (std::vector<int32_t>{7, 8}));
  EXPECT_EQ(l.context_length, 4096);
  const auto d = config_for({"--max-tokens", "64"}, kDream);
  EXPECT_EQ(d.arch, model::Arch::Dream);
  EXPECT_EQ(d.remasking, model::Remasking::Entropy);
  EXPECT_EQ(d.steps, 64);
  EXPECT_EQ(d.mask_id, 1019);
}

TEST(RunConfig, EveryGenerationFlagReachesTheLoop) {
  const auto c = config_for({"--max-tokens", "64", "--steps", "16", "--block-length", "16", "--temperature", "0.7",
                             "--remasking", "random", "--threshold", "0.9", "--dual-cache", "--seed", "7",
                             "--no-early-stop"},
                            kLlada);
  EXPECT_EQ(c.max_tokens, 64);
  EXPECT_EQ(c.steps, 16);
  EXPECT_EQ(c.block_length, 16);
  EXPECT_EQ(c.temperature, 0.7);
  EXPECT_EQ(c.remasking, model::Remasking::Random);
  EXPECT_EQ(c.threshold, 0.9);
  EXPECT_TRUE(c.dual_cache);
  EXPECT_EQ(c.seed, 7u);
  EXPECT_FALSE(c.early_stop);
  EXPECT_TRUE(config_for({"--full-logits"}, kLlada).full_logits);
  for (const char* r : {"entropy", "maskgit_plus", "topk_margin"})
    EXPECT_EQ(model::remasking_name(config_for({"--remasking", r}, kDream).remasking), std::string(r));
}

TEST(RunConfig, StopIdsAreTheVocabularysEndOfTextAndEndOfTurn) {
  for (auto [path, eos, eot] : {std::tuple{kLlada, 1013, 1017}, std::tuple{kDream, 1016, 1018}}) {
    const auto f = gguf::File::open(path);
    const model::Tokenizer tok(*f);
    EXPECT_EQ(stop_ids(tok), (std::vector<int32_t>{eos, eot}));
  }
  // gemma4 (DiffusionGemma): <eos>, and <turn|> and <|tool_response>, found by their text.
  const auto g = gguf::File::open(test::data_path("diffusion-gemma/tiny-diffusion-gemma-A-vocab.gguf"));
  const model::Tokenizer gtok(*g);
  EXPECT_EQ(stop_ids(gtok), (std::vector<int32_t>{1, 7, 13}));
}

TEST(RunConfig, PromptIdsFromTextChatTemplateOrVerbatimTokens) {
  const auto f = gguf::File::open(kLlada);
  const model::HParams hp = model::read_hparams(*f);
  const model::Tokenizer tok(*f);
  std::string help;
  const json ref = reference("llada_b8_L32_N16_writeahaikuabout__tiny-llada-F32__greedy.json");
  Settings s = parse_command_line({"run", "--model", kLlada, "--prompt", ref["prompt"]}, &help);
  EXPECT_EQ(prompt_ids(s, hp, tok), ref["prompt_ids"].get<std::vector<int32_t>>());
  s = parse_command_line({"run", "--model", kLlada, "--prompt", "Hello there", "--no-chat"}, &help);
  EXPECT_EQ(prompt_ids(s, hp, tok), tok.encode("Hello there", true, true));  // with the vocabulary's BOS
  EXPECT_EQ(prompt_ids(s, hp, tok).front(), tok.bos());
  s = parse_command_line({"run", "--model", kLlada, "--prompt-tokens", "5,1012,9"}, &help);
  EXPECT_EQ(prompt_ids(s, hp, tok), (std::vector<int32_t>{5, 1012, 9}));
  s = parse_command_line({"run", "--model", kLlada, "--prompt-tokens", "5,1024"}, &help);
  try {
    prompt_ids(s, hp, tok);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "--prompt-tokens: id 1024 at position 1 is out of range: the model's vocabulary has 1024 tokens (ids "
              "0..1023)");
  }
}

// --- the binary ---

std::vector<std::string> run_args(const std::string& model, std::vector<std::string> extra) {
  std::vector<std::string> a = {"run", "--model", model};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

TEST(RunBinary, JsonMatchesTheLladaReferenceGeneration) {
  const json ref = reference("llada_b8_L32_N16_writeahaikuabout__tiny-llada-F32__greedy.json");
  auto r = run_dllm(run_args(kLlada, {"--prompt", ref["prompt"], "--max-tokens", "32", "--block-length", "8",
                                      "--steps", "16", "--no-early-stop", "--json"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json j = json::parse(r.out);  // exactly one JSON object on stdout
  EXPECT_EQ(j["prompt_ids"], ref["prompt_ids"]);
  EXPECT_EQ(j["output_ids"], ref["generated_ids"]);
  EXPECT_EQ(j["steps_run"], 16);
  EXPECT_EQ(j["forward_passes"], 16);
  EXPECT_EQ(j["stopped_early"], false);
  EXPECT_EQ(j["interrupted"], false);
  for (const char* k : {"load_ms", "step_mean_ms", "total_ms"}) EXPECT_GT(j["timings"][k].get<double>(), 0) << k;
  EXPECT_GT(j["tokens_per_s"].get<double>(), 0);
  EXPECT_GT(j["peak_rss_bytes"].get<uint64_t>(), 1u << 20);
  const json& s = j["settings"];
  EXPECT_EQ(s["max_tokens"], 32);
  EXPECT_EQ(s["steps"], 16);
  EXPECT_EQ(s["block_length"], 8);
  EXPECT_EQ(s["remasking"], "low_confidence");
  EXPECT_EQ(s["temperature"], 0.0);
  EXPECT_EQ(s["threshold"], 0.0);
  EXPECT_EQ(s["seed"], 42);
  EXPECT_EQ(s["dual_cache"], false);
  EXPECT_EQ(s["full_logits"], false);
  EXPECT_EQ(s["early_stop"], false);
  EXPECT_EQ(s["chat_template"], true);
  EXPECT_EQ(s["device"], "cpu");
  EXPECT_GE(s["threads"].get<int>(), 1);
  EXPECT_EQ(s["top_logprobs"], nullptr);
  EXPECT_EQ(j["logprobs"], nullptr);
  EXPECT_EQ(j["model"]["architecture"], "llada");
  EXPECT_EQ(j["device"]["executor"], "reference");
  // Plain mode prints the same answer's bytes (here invalid UTF-8 from a random model), then a newline.
  auto plain = run_dllm(run_args(kLlada, {"--prompt", ref["prompt"], "--max-tokens", "32", "--block-length", "8",
                                          "--steps", "16", "--no-early-stop"}));
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  EXPECT_EQ(plain.out, hex_bytes(ref["generated_text_hex"]) + "\n");
  EXPECT_EQ(plain.err, "");
}

TEST(RunBinary, JsonMatchesTheDreamReferenceGeneration) {
  const json ref = reference("dream_L32_N16_whatisthecapital__tiny-dream-F32__greedy__confidence.json");
  auto r = run_dllm(run_args(kDream, {"--prompt", ref["prompt"], "--max-tokens", "32", "--steps", "16",
                                      "--remasking", "maskgit_plus", "--json"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json j = json::parse(r.out);
  EXPECT_EQ(j["prompt_ids"], ref["prompt_ids"]);
  EXPECT_EQ(j["output_ids"], ref["generated_ids"]);
  EXPECT_EQ(j["settings"]["remasking"], "maskgit_plus");
  EXPECT_EQ(j["settings"]["block_length"], nullptr);  // Dream ignores it
  EXPECT_EQ(j["settings"]["block_length_ignored"], 32);
  EXPECT_EQ(j["model"]["architecture"], "dream");
}

TEST(RunBinary, TopLogprobsLeaveTheGenerationAsItIs) {
  const json ref = reference("llada_b8_L32_N16_writeahaikuabout__tiny-llada-F32__greedy.json");
  auto r = run_dllm(run_args(kLlada, {"--prompt", ref["prompt"], "--max-tokens", "32", "--block-length", "8",
                                      "--steps", "16", "--no-early-stop", "--json", "--top-logprobs", "3"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json j = json::parse(r.out);
  EXPECT_EQ(j["output_ids"], ref["generated_ids"]);
  EXPECT_EQ(j["settings"]["top_logprobs"], 3);
  const json& lp = j["logprobs"];
  ASSERT_EQ(lp.size(), j["answer_length"].get<size_t>());
  for (size_t i = 0; i < lp.size(); ++i) {
    EXPECT_EQ(lp[i]["id"], j["output_ids"][i]);
    ASSERT_EQ(lp[i]["top_logprobs"].size(), 3u);
    EXPECT_EQ(lp[i]["top_logprobs"][0]["id"], lp[i]["id"]);  // greedy: the most probable token
    EXPECT_EQ(lp[i]["top_logprobs"][0]["logprob"], lp[i]["logprob"]);
    EXPECT_LE(lp[i]["logprob"].get<double>(), 0.0);
    EXPECT_GE(lp[i]["top_logprobs"][0]["logprob"].get<double>(), lp[i]["top_logprobs"][2]["logprob"].get<double>());
  }
  for (const auto& [args, err] :
       {std::pair{std::vector<std::string>{"--prompt", "x", "--top-logprobs", "2"}, "flag --top-logprobs needs --json"},
        std::pair{std::vector<std::string>{"--prompt", "x", "--json", "--top-logprobs", "21"},
                  "flag --top-logprobs must be at most 20, got 21"}}) {
    auto bad = run_dllm(run_args(kLlada, args));
    EXPECT_EQ(bad.exit_code, 2);
    EXPECT_EQ(bad.err.substr(0, bad.err.find('\n')), "ERROR: " + std::string(err));
  }
}

TEST(RunBinary, AnyMaxTokensWithTheDefaultBlockLength) {
  // 16 and 100 with blocks of 32: one block of 16; blocks of 32, 32, 32 and 4 (steps in proportion).
  for (const char* n : {"1", "16", "100"}) {
    auto r = run_dllm(run_args(kLlada, {"--prompt", "Hi", "--max-tokens", n, "--no-early-stop", "--json"}));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const json j = json::parse(r.out);
    EXPECT_EQ(j["output_ids"].size(), static_cast<size_t>(std::stoi(n)));
    EXPECT_EQ(j["steps_total"], std::stoi(n));
  }
}

TEST(RunBinary, PromptTokensAreUsedVerbatim) {
  const json ref = reference("llada_b16_L32_N16_hi__tiny-llada-F32__greedy.json");
  std::string ids;
  for (const auto& id : ref["prompt_ids"]) {
    if (!ids.empty()) ids += ',';
    ids += std::to_string(id.get<int>());
  }
  auto r = run_dllm(run_args(kLlada, {"--prompt-tokens", ids, "--max-tokens", "32", "--block-length", "16",
                                      "--steps", "16", "--no-early-stop", "--json"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json j = json::parse(r.out);
  EXPECT_EQ(j["prompt_ids"], ref["prompt_ids"]);
  EXPECT_EQ(j["output_ids"], ref["generated_ids"]);
  EXPECT_EQ(j["settings"]["chat_template"], false);
  auto bad = run_dllm(run_args(kLlada, {"--prompt-tokens", "1,2,99999"}));
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_EQ(bad.err,
            "ERROR: --prompt-tokens: id 99999 at position 2 is out of range: the model's vocabulary has 1024 tokens "
            "(ids 0..1023)\n");
}

TEST(RunBinary, VerboseStepStatsAndVisualGoWhereTheyBelong) {
  auto r = run_dllm(run_args(kDream, {"--prompt", "Hi", "--max-tokens", "8", "--steps", "4", "--verbose",
                                      "--dump-step-stats", "--visual", "--no-early-stop"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // stderr: one stats line per step, then the verbose report with Dream's note.
  size_t lines = 0;
  for (size_t p = r.err.find("step="); p != std::string::npos; p = r.err.find("step=", p + 1)) ++lines;
  EXPECT_EQ(lines, 4u);
  EXPECT_NE(r.err.find("step=0 steps=4 block=0 scheduled=1 committed=1 masked=7 ms="), std::string::npos) << r.err;
  // No --block-length given: nothing to note (the default is nobody's mistake).
  EXPECT_EQ(r.err.find("--block-length"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("timings: load "), std::string::npos);
  EXPECT_NE(r.err.find("peak resident memory: "), std::string::npos);
  EXPECT_NE(r.err.find("steps: 4 of 4 run, 4 forward passes"), std::string::npos) << r.err;
  // stdout (not a terminal): one plain frame per step, a blank line, then the answer.
  EXPECT_EQ(r.out.find("step 1/4, 1 committed, 7 masked: "), 0u) << r.out;  // Dream's schedule: 1, 2, 2, 3
  EXPECT_NE(r.out.find("\nstep 4/4, 3 committed, 0 masked: "), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("\x1b["), std::string::npos);  // no ANSI sequences in plain lines
  auto json_run = run_dllm(run_args(kDream, {"--prompt", "Hi", "--max-tokens", "8", "--steps", "4", "--json",
                                             "--no-early-stop"}));
  const std::string text = json::parse(json_run.out)["text"];  // the answer, invalid UTF-8 replaced
  const std::string last = r.out.substr(r.out.rfind("\n\n") + 2);
  EXPECT_EQ(sanitize_utf8(last), text + "\n");
}

// --verbose names the CPU path's kernel family (the best the CPU has without DLLM_ISA) and, under amx, what
// its matrices run where.
TEST(RunBinary, VerboseNamesTheKernelFamily) {
  const std::string saved_exec = std::getenv("DLLM_EXECUTOR") ? std::getenv("DLLM_EXECUTOR") : "";
  const std::string saved_isa = std::getenv("DLLM_ISA") ? std::getenv("DLLM_ISA") : "";
  unsetenv("DLLM_EXECUTOR");
  unsetenv("DLLM_ISA");
  auto r = run_dllm({"run", "--model", data_path("models/tiny-llada-Q4_K_M.gguf"), "--prompt", "Hi", "--max-tokens",
                     "8", "--steps", "2", "--device", "cpu", "--verbose"});
  setenv("DLLM_EXECUTOR", saved_exec.c_str(), 1);
  if (!saved_isa.empty()) setenv("DLLM_ISA", saved_isa.c_str(), 1);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const jit::Isa best = jit::cpu_features().best();
  const std::string rule = best == jit::Isa::Amx ? std::string(" (") + jit::kAmxRule + ")" : "";
  EXPECT_NE(r.err.find(std::string("executor jit-") + jit::isa_name(best)), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(std::string("kernel family ") + jit::isa_name(best) + rule + ")"), std::string::npos) << r.err;
}

TEST(RunBinary, DreamNotesAGivenBlockLengthOnly) {
  auto given = run_dllm(run_args(kDream, {"--prompt", "Hi", "--max-tokens", "8", "--steps", "4", "--block-length",
                                          "4", "--verbose"}));
  ASSERT_EQ(given.exit_code, 0) << given.err;
  EXPECT_EQ(given.err.rfind("note: --block-length is ignored for Dream models\n", 0), 0u) << given.err;
  auto llada = run_dllm(run_args(kLlada, {"--prompt", "Hi", "--max-tokens", "8", "--steps", "4", "--block-length",
                                          "4", "--verbose"}));
  ASSERT_EQ(llada.exit_code, 0) << llada.err;
  EXPECT_EQ(llada.err.find("note: "), std::string::npos) << llada.err;  // LLaDA uses it
  EXPECT_NE(llada.err.find(", block length 4"), std::string::npos) << llada.err;
}

// A model's answer on a terminal cannot drive it: this reference answer holds SO (0x0e), ESC and invalid UTF-8.
// Piped, stdout carries it byte for byte; on a pseudo-terminal (raw mode, so the line discipline changes
// nothing) the same answer arrives with those bytes escaped.
TEST(RunBinary, AnswerOnATerminalIsEscapedPipedUnchanged) {
  const json ref = reference("dream_L32_N16_whyiswaterwet__tiny-dream-F32__greedy__margin.json");
  const std::string answer = hex_bytes(ref["generated_text_hex"]);
  ASSERT_NE(answer.find('\x1b'), std::string::npos);
  const auto args = run_args(kDream, {"--prompt", ref["prompt"], "--max-tokens", "32", "--steps", "16",
                                      "--remasking", "topk_margin", "--no-early-stop"});
  auto piped = run_dllm(args);
  ASSERT_EQ(piped.exit_code, 0) << piped.err;
  EXPECT_EQ(piped.out, answer + "\n");

  const char* on_pty =
      "import os, pty, subprocess, sys, tty\n"
      "master, slave = pty.openpty()\n"
      "tty.setraw(slave)\n"
      "p = subprocess.Popen(sys.argv[1:], stdin=subprocess.DEVNULL, stdout=slave)\n"
      "os.close(slave)\n"
      "out = b''\n"
      "while True:\n"
      "    try:\n"
      "        chunk = os.read(master, 65536)\n"
      "    except OSError:\n"  // EIO: the child closed the terminal
      "        break\n"
      "    if not chunk:\n"
      "        break\n"
      "    out += chunk\n"
      "sys.stdout.buffer.write(out)\n"
      "sys.exit(p.wait())\n";
  std::vector<std::string> py = {"-c", on_pty, DLLM_BINARY};
  py.insert(py.end(), args.begin(), args.end());
  auto tty = test::run_program("python3", py);
  ASSERT_EQ(tty.exit_code, 0) << tty.err;
  EXPECT_EQ(tty.out, escape_terminal_controls(answer) + "\n");
  EXPECT_EQ(tty.out.find('\x1b'), std::string::npos);
  EXPECT_NE(tty.out.find("then\\x1b no"), std::string::npos) << tty.out;
}

TEST(RunBinary, JsonKeepsStdoutToItselfWhateverElseIsOn) {
  for (const char* device : {"cpu", "auto"}) {
    auto r = run_dllm(run_args(kLlada, {"--prompt", "Hi", "--max-tokens", "8", "--block-length", "4", "--steps", "4",
                                        "--json", "--visual", "--verbose", "--dump-step-stats", "--device", device}));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const json j = json::parse(r.out);  // throws unless stdout is exactly one JSON value
    EXPECT_EQ(j["settings"]["device"], "cpu");
    EXPECT_EQ(j["settings"]["visual"], true);
    EXPECT_EQ(j["settings"]["verbose"], true);
    EXPECT_EQ(j["settings"]["dump_step_stats"], true);
    // The frames, the step lines and the report went to stderr.
    EXPECT_NE(r.err.find("step 1/4, "), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("step=0 steps=4 block=0 scheduled=2 committed=2 masked=6"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("timings: load "), std::string::npos) << r.err;
  }
}

TEST(RunBinary, ArchitectureChecksAreUsageErrorsNamingBothFlags) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {run_args(kLlada, {"--prompt", "x", "--max-tokens", "100", "--steps", "3"}),
       "ERROR: --steps 3 is fewer than the block count 4 (--max-tokens 100 / --block-length 32, rounded up): every "
       "block needs at least one step\n"},
      {run_args(kLlada, {"--prompt", "x", "--remasking", "entropy"}),
       "ERROR: --remasking entropy is not available for LLaDA models (use low_confidence or random)\n"},
      {run_args(kDream, {"--prompt", "x", "--remasking", "random"}),
       "ERROR: --remasking random is not available for Dream models (use entropy, maskgit_plus or topk_margin)\n"},
      {run_args(kDream, {"--prompt", "x", "--threshold", "0.9"}),
       "ERROR: --threshold is for LLaDA models only (this model is Dream)\n"},
      {run_args(kDream, {"--prompt", "x", "--dual-cache"}),
       "ERROR: --dual-cache is for LLaDA models only (this model is Dream)\n"},
      {run_args(kLlada, {"--prompt", "x", "--max-tokens", "4096"}),
       "ERROR: the canvas of 15 prompt tokens + --max-tokens 4096 is longer than the model's context length 4096\n"},
  };
  for (const auto& [args, err] : cases) {
    auto r = run_dllm(args);
    EXPECT_EQ(r.exit_code, 2) << err;
    EXPECT_EQ(r.err, err);
    EXPECT_EQ(r.out, "");
  }
  // Dream ignores --block-length, so its steps need not reach a block count.
  auto ok = run_dllm(run_args(kDream, {"--prompt", "x", "--max-tokens", "6", "--steps", "1", "--block-length", "2"}));
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
}

TEST(RunBinary, ThreadsPastTheHardwareAreCappedWithAWarning) {
  const int hw = dllm::ThreadPool::hardware_threads();
  auto r = run_dllm(run_args(kDream, {"--prompt", "x", "--max-tokens", "4", "--threads", "100000", "--device", "cpu"}));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("dllm: warning: --threads 100000 is more than the " + std::to_string(hw) +
                       " hardware threads: using " + std::to_string(hw) + "\n"),
            std::string::npos)
      << r.err;
  auto quiet = run_dllm(run_args(kDream, {"--prompt", "x", "--max-tokens", "4", "--threads", "1", "--device", "cpu"}));
  EXPECT_EQ(quiet.err.find("warning"), std::string::npos) << quiet.err;
  auto help = run_dllm({"run", "--help"});
  EXPECT_NE(help.out.find("more than the hardware threads are capped to them"), std::string::npos)
      << help.out;
}

TEST(RunBinary, GpuWithoutAGpuIsTheSpecsError) {
  auto r = run_dllm(run_args(kLlada, {"--prompt", "x", "--device", "gpu"}));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err,
            "ERROR: no GPU found: the GPU backend needs an NVIDIA GPU with compute capability 8.0 or newer (run with "
            "--device cpu)\n");
}

TEST(RunBinary, SameAnswerWhateverTheThreadsFullLogitsAndEarlyStop) {
  const std::vector<std::string> base = {"--prompt", "Tell me a story", "--max-tokens", "16", "--block-length", "8",
                                         "--steps", "8", "--temperature", "0.9", "--json"};
  auto run = [&](std::vector<std::string> extra) {
    std::vector<std::string> a = base;
    a.insert(a.end(), extra.begin(), extra.end());
    auto r = run_dllm(run_args(kLlada, a));
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return json::parse(r.out);
  };
  const json one = run({"--seed", "5", "--threads", "1", "--no-early-stop"});
  EXPECT_EQ(one["settings"]["threads"], 1);
  const json two = run({"--seed", "5", "--threads", "2", "--no-early-stop", "--full-logits"});
  EXPECT_EQ(two["output_ids"], one["output_ids"]);
  EXPECT_EQ(two["settings"]["full_logits"], true);
  const json early = run({"--seed", "5"});
  EXPECT_EQ(early["text"], one["text"]);
  const json other_seed = run({"--seed", "6", "--no-early-stop"});
  EXPECT_NE(other_seed["output_ids"], one["output_ids"]);
}

TEST(RunBinary, ThresholdAndDualCacheRun) {
  auto r = run_dllm(run_args(kLlada, {"--prompt", "x", "--max-tokens", "16", "--block-length", "8", "--steps", "16",
                                      "--threshold", "0.5", "--dual-cache", "--no-early-stop", "--json",
                                      "--dump-step-stats"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err.find("step=0 steps=16 block=0 scheduled=1 committed="), 0u) << r.err;  // the refresh pass
  EXPECT_NE(r.err.find(" cached\n"), std::string::npos) << r.err;                         // block-only passes
  const json j = json::parse(r.out);
  EXPECT_EQ(j["settings"]["threshold"], 0.5);
  EXPECT_EQ(j["settings"]["dual_cache"], true);
  EXPECT_LE(j["forward_passes"].get<int>(), 16);
  EXPECT_GE(j["forward_passes"].get<int>(), 2);  // at least one refresh per block
  for (const auto& id : j["output_ids"]) EXPECT_NE(id, 1014);  // every mask filled
}

// --- Ctrl-C ---

TEST(RunBinary, InterruptStopsBetweenStepsWithThePartialCanvasAndStatus130) {
  // Ctrl-C after the first step (the handler is installed by then).
  const auto r = test::run_dllm_interrupted(
      run_args(kLlada, {"--prompt", "x", "--max-tokens", "512", "--steps", "512", "--json", "--dump-step-stats"}),
      "step=");
  ASSERT_FALSE(r.signaled) << "killed by a signal: the handler did not run";
  EXPECT_EQ(r.exit_code, 130);
  const json j = json::parse(r.out);
  EXPECT_EQ(j["interrupted"], true);
  EXPECT_GE(j["steps_run"].get<int>(), 1);
  EXPECT_LT(j["steps_run"].get<int>(), 512);
  const auto ids = j["output_ids"].get<std::vector<int32_t>>();
  EXPECT_EQ(ids.size(), 512u);
  EXPECT_GT(std::count(ids.begin(), ids.end(), 1014), 0);  // the masks left are reported
  EXPECT_NE(r.err.find("interrupted: stopped after "), std::string::npos) << r.err;
}

// --- renderers ---

TEST(RunOutput, SanitizeReplacesEveryInvalidByte) {
  EXPECT_EQ(sanitize_utf8("ok \xc3\xa9"), "ok \xc3\xa9");
  EXPECT_EQ(sanitize_utf8("a\xb2z"), "a\xef\xbf\xbdz");
  EXPECT_EQ(sanitize_utf8("\xe2\x82"), "\xef\xbf\xbd\xef\xbf\xbd");       // truncated sequence
  EXPECT_EQ(sanitize_utf8("\xed\xa0\x80"), "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd");  // surrogate
  EXPECT_EQ(sanitize_utf8("\xf0\x9f\x98\x80"), "\xf0\x9f\x98\x80");
}

TEST(RunOutput, TerminalEscapesControlsOnlyAndOnlyOnATerminal) {
  // C0 controls but newline and tab, DEL, C1 controls (U+009B: CSI) and bytes of invalid UTF-8 (an 8-bit
  // terminal's C1) are escaped; quotes, backslashes, other scripts and bidi marks are the answer's own.
  EXPECT_EQ(escape_terminal_controls("a\x1b]0;title\x07" "b\x1b[2J"), "a\\x1b]0;title\\x07b\\x1b[2J");
  EXPECT_EQ(escape_terminal_controls("line\n\tcol\rover\b\x7f"), "line\n\tcol\\x0dover\\x08\\x7f");
  EXPECT_EQ(escape_terminal_controls(std::string("nul\0", 4)), "nul\\x00");
  EXPECT_EQ(escape_terminal_controls("\xc2\x9b" "31m \xc2\x85 \xc2\xa0"), "\\u009b31m \\u0085 \xc2\xa0");
  EXPECT_EQ(escape_terminal_controls("\x9b" "31m \xff \xe2\x82"), "\\x9b31m \\xff \\xe2\\x82");
  const std::string own = "\"q\" \\x1b caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac \xe2\x80\x8f \xf0\x9f\x98\x80";
  EXPECT_EQ(escape_terminal_controls(own), own);
  // Only a terminal gets the escapes: a pipe or a file gets the bytes.
  const std::string answer = "x\x1b[31my\xff\n";
  EXPECT_EQ(answer_for_output(answer, false), answer);
  EXPECT_EQ(answer_for_output(answer, true), "x\\x1b[31my\\xff\n");
}

TEST(RunOutput, CanvasRendering) {
  const auto f = gguf::File::open(kLlada);
  const model::Tokenizer tok(*f);
  const int32_t a = tok.encode("Hi")[0], nl = tok.encode("\n")[0];
  std::vector<int32_t> canvas = {1012, a, nl, 1014, 1017};
  std::vector<int64_t> committed = {2};
  model::StepEvent ev;
  ev.canvas = canvas;
  ev.prompt_length = 1;
  ev.committed = committed;
  const std::string piece = tok.token_piece(a);
  EXPECT_EQ(render_canvas(ev, tok, 1014, false), piece + "\\n\xe2\x96\x88<|eot_id|>");
  EXPECT_EQ(render_canvas(ev, tok, 1014, true), piece +
                                                    "\x1b[1;38;5;208m\n\x1b[0m"
                                                    "\x1b[38;5;30m\xe2\x96\x88\x1b[0m"
                                                    "\x1b[2m<|eot_id|>\x1b[0m");
  // On a terminal a piece's own escape sequence is shown, not obeyed: only the frame's colours act.
  const std::vector<int32_t> esc = tok.encode("\x1b[2J");
  std::string pieces;
  for (int32_t t : esc) pieces += tok.token_piece(t);
  ASSERT_EQ(pieces, "\x1b[2J");
  std::vector<int32_t> esc_canvas = {1012};
  esc_canvas.insert(esc_canvas.end(), esc.begin(), esc.end());
  model::StepEvent esc_ev;
  esc_ev.canvas = esc_canvas;
  esc_ev.prompt_length = 1;
  EXPECT_EQ(render_canvas(esc_ev, tok, 1014, true), "\\x1b[2J");
  // A uniform-state (DiffusionGemma) canvas: a finished block plain, then the open block's accepted position
  // marked and its re-noised positions shown as their random tokens (terminal) or as light shades (plain).
  std::vector<int32_t> uniform = {1012, a, a, nl, a};
  std::vector<int64_t> accepted = {3};
  model::StepEvent u;
  u.canvas = uniform;
  u.prompt_length = 1;
  u.open_begin = 2;
  u.committed = accepted;
  u.temperature = 0.8;
  EXPECT_EQ(render_canvas(u, tok, 1014, false), piece + "\xe2\x96\x91\\n\xe2\x96\x91");
  EXPECT_EQ(render_canvas(u, tok, 1014, true), piece + "\x1b[2;38;5;30m" + piece + "\x1b[0m\x1b[1;38;5;208m\n\x1b[0m"
                                               "\x1b[2;38;5;30m" + piece + "\x1b[0m");
  u.open_begin = -1;  // the block's last step: its tokens are answer
  u.committed = {};
  EXPECT_EQ(render_canvas(u, tok, 1014, false), piece + piece + "\\n" + piece);
  EXPECT_EQ(step_stats_line(ev), "step=0 steps=0 block=0 scheduled=0 committed=1 masked=0 ms=0.000");
  ev.step = 3;
  ev.total_steps = 8;
  ev.committed = {};
  ev.skipped = true;
  EXPECT_EQ(step_stats_line(ev), "step=3 steps=8 block=0 scheduled=0 committed=0 masked=0 ms=0.000 skipped");
}

}  // namespace
}  // namespace dllm::cli
