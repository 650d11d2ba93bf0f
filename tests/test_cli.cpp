// The command-line contract: every message of the spec's Errors table, help precedence, exit codes, and that
// every flag reaches the Settings struct.
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>

#include "cli/args.h"
#include "common/error.h"
#include "hub/hub.h"
#include "model/arch.h"
#include "model/generate.h"
#include "support.h"

using dllm::Error;
using dllm::cli::parse_command_line;
using dllm::cli::Settings;
using dllm::test::run_dllm;

namespace {

// Parses and expects a usage error with exactly this message.
void expect_usage_error(const std::vector<std::string>& args, const std::string& message,
                        const std::string& hint_prefix = "") {
  std::string help;
  try {
    parse_command_line(args, &help);
    ADD_FAILURE() << "no error for: " << ::testing::PrintToString(args);
  } catch (const Error& e) {
    EXPECT_EQ(e.what(), message);
    EXPECT_EQ(e.exit_code(), 2);
    if (!hint_prefix.empty()) {
      EXPECT_EQ(e.hint().rfind(hint_prefix, 0), 0u) << e.hint();
    }
  }
}

Settings parse_ok(const std::vector<std::string>& args) {
  std::string help;
  Settings s = parse_command_line(args, &help);
  EXPECT_TRUE(help.empty());
  return s;
}

const char* kMissing = "/nonexistent-dir/model.gguf";

}  // namespace

TEST(Cli, HelpListsEveryCommandOnOneLineAndEveryArchitecture) {
  for (auto args : {std::vector<std::string>{}, {"help"}, {"--help"}, {"-h"}}) {
    auto r = run_dllm(args);
    EXPECT_EQ(r.exit_code, 0);
    EXPECT_TRUE(r.err.empty());
    // One line each: "  NAME  what it does"; the flags are the command's own --help.
    for (const std::string c : {"run", "serve", "tokenize", "inspect", "logits", "synth", "doctor", "pull", "kernels",
                                "bench", "help", "version"}) {
      const size_t at = r.out.find("\n  " + c + " ");
      ASSERT_NE(at, std::string::npos) << c << "\n" << r.out;
      EXPECT_EQ(r.out.find("\n  " + c + " ", at + 1), std::string::npos) << c;
    }
    for (const char* flag : {"--max-tokens", "--prompt TEXT", "--tensor", "--arch", "--isa"})
      EXPECT_EQ(r.out.find(flag), std::string::npos) << flag;
    EXPECT_LE(std::count(r.out.begin(), r.out.end(), '\n'), 24) << r.out;
    // Every architecture of the table, by its label and its general.architecture name.
    ASSERT_EQ(dllm::model::arch_specs().size(), 5u);
    for (const dllm::model::ArchSpec* a : dllm::model::arch_specs())
      EXPECT_NE(r.out.find(std::string(a->label) + " (" + a->name + ")"), std::string::npos) << a->name;
  }
  // The details stay with each command.
  auto run_help = run_dllm({"help", "run"});
  EXPECT_EQ(run_help.exit_code, 0);
  EXPECT_NE(run_help.out.find("--max-tokens"), std::string::npos);
}

// The version is CMake's project(VERSION), with the checkout's git describe when the build saw one.
TEST(Cli, VersionIsTheProjectVersion) {
  const std::string cmake = dllm::test::read_file(std::string(DLLM_SOURCE_DIR) + "/CMakeLists.txt");
  const std::string key = "project(dllm VERSION ";
  const size_t at = cmake.find(key);
  ASSERT_NE(at, std::string::npos);
  const std::string version = cmake.substr(at + key.size(), cmake.find(' ', at + key.size()) - at - key.size());
  for (auto args : {std::vector<std::string>{"--version"}, {"version"}}) {
    auto r = run_dllm(args);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_TRUE(r.err.empty()) << r.err;
    const std::string head = "dllm " + version;
    EXPECT_TRUE(r.out == head + "\n" || (r.out.rfind(head + " (git ", 0) == 0 && r.out.ends_with(")\n"))) << r.out;
    EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
  }
  auto help = run_dllm({"version", "--help"});
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_EQ(help.out.rfind("usage: dllm version (or dllm --version)\n", 0), 0u) << help.out;
  expect_usage_error({"version", "extra"}, "unexpected argument 'extra' for 'version'");
  expect_usage_error({"--version", "run"}, "unexpected argument 'run' for 'version'");
}

// doctor names the family that runs: the best the CPU has, or the one DLLM_ISA caps it to (every machine dllm
// supports has avx2), with the best named beside it.
TEST(Cli, DoctorNamesTheFamilyThatRunsUnderDllmIsa) {
  const char* old = std::getenv("DLLM_ISA");
  const std::optional<std::string> saved = old ? std::optional<std::string>(old) : std::nullopt;
  ::setenv("DLLM_ISA", "avx2", 1);
  auto capped = run_dllm({"doctor"});
  ::unsetenv("DLLM_ISA");
  auto plain = run_dllm({"doctor"});
  saved ? ::setenv("DLLM_ISA", saved->c_str(), 1) : ::unsetenv("DLLM_ISA");
  EXPECT_NE(capped.out.find("\n  ok       CPU kernels: avx2"), std::string::npos) << capped.out;
  EXPECT_NE(capped.out.find("\nkernel family: avx2"), std::string::npos) << capped.out;
  EXPECT_NE(capped.out.find("DLLM_ISA=avx2 -> avx2"), std::string::npos) << capped.out;
  const bool wider = capped.out.find("(capped by DLLM_ISA; best is ") != std::string::npos;
  EXPECT_EQ(wider, plain.out.find("\nkernel family: avx2\n") == std::string::npos) << plain.out;
  EXPECT_NE(plain.out.find("(the best this CPU has)"), std::string::npos) << plain.out;
}

// The default model only matters to `run` and `serve` without --model: doctor reports it as optional, and a
// machine whose only gap is the default model is healthy (exit 0).
TEST(Cli, DoctorCallsTheDefaultModelOptional) {
  char tpl[] = "/tmp/dllm-doctor-XXXXXX";
  ASSERT_NE(::mkdtemp(tpl), nullptr);
  const std::string cache = tpl;
  std::vector<std::pair<std::string, std::optional<std::string>>> saved;
  auto set = [&](const char* k, const char* v) {
    const char* old = std::getenv(k);
    saved.emplace_back(k, old ? std::optional<std::string>(old) : std::nullopt);
    v ? ::setenv(k, v, 1) : ::unsetenv(k);
  };
  set("DLLM_CACHE", cache.c_str());
  set("DLLM_MODEL", nullptr);
  set("DLLM_ISA", nullptr);
  auto missing = run_dllm({"doctor"});
  // A cached default model (DLLM_MODEL names another one) is ok.
  std::filesystem::create_directories(cache + "/models/owner/repo");
  std::ofstream(cache + "/models/owner/repo/m.Q8_0.gguf").put('x');
  ::setenv("DLLM_MODEL", "owner/repo:Q8_0", 1);
  auto cached = run_dllm({"doctor"});
  for (const auto& [k, v] : saved) v ? ::setenv(k.c_str(), v->c_str(), 1) : ::unsetenv(k.c_str());
  std::filesystem::remove_all(cache);

  EXPECT_NE(missing.out.find(std::string("\n  optional default model ") + dllm::hub::kDefaultModel +
                             ": not in the cache (only for `dllm run` and `dllm serve` without --model; fix: dllm pull)\n"),
            std::string::npos)
      << missing.out;
  const bool needed_missing = missing.out.find("MISSING") != std::string::npos ||
                              missing.out.find("PROBLEM") != std::string::npos;
  EXPECT_EQ(missing.exit_code, needed_missing ? 1 : 0) << missing.out;
  EXPECT_NE(cached.out.find("\n  ok       default model owner/repo:Q8_0: " + cache + "/models/owner/repo/m.Q8_0.gguf\n"),
            std::string::npos)
      << cached.out;
  EXPECT_EQ(cached.exit_code, missing.exit_code);
}

TEST(Cli, CommandHelpWinsWherever) {
  for (auto args : std::vector<std::vector<std::string>>{
           {"run", "--help"},
           {"run", "-h"},
           {"run", "--stpes", "3", "--help"},
           {"run", "--steps", "0", "-h"},
           {"run", "stray", "--help"},
           {"run", "--model=x", "--help"},
           {"logits", "--tokens", "a,b", "--help"},
           {"inspect", "-h"},
           {"tokenize", "--help", "--prompt"}}) {
    auto r = run_dllm(args);
    EXPECT_EQ(r.exit_code, 0) << args[1];
    EXPECT_NE(r.out.find("dllm " + args[0]), std::string::npos);
    EXPECT_NE(r.out.find("--help"), std::string::npos);
    EXPECT_TRUE(r.err.empty()) << r.err;
  }
}

TEST(Cli, HelpAsAFlagValueIsAValue) {
  Settings s = parse_ok({"run", "--model", "m.gguf", "--prompt", "--help"});
  EXPECT_EQ(s.prompt, "--help");
  Settings t = parse_ok({"tokenize", "--model", "-h", "--prompt", "x"});
  EXPECT_EQ(t.model, "-h");
}

TEST(Cli, UnknownFlagWithSuggestion) {
  auto r = run_dllm({"run", "--stpes", "3"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err, "ERROR: unknown flag --stpes for 'run' (did you mean --steps?)\nsee: dllm run --help\n");
  EXPECT_TRUE(r.out.empty());
  // more than 2 edits away: no suggestion
  expect_usage_error({"run", "--frobnicate"}, "unknown flag --frobnicate for 'run'", "see: dllm run --help");
  // a flag another command declares is unknown here
  expect_usage_error({"inspect", "x.gguf", "--steps", "3"},
                     "unknown flag --steps for 'inspect'", "see: dllm inspect --help");
}

TEST(Cli, MissingRequiredFlagPrintsUsage) {
  // run has a default model (issue 9), so the spec's example is shown with tokenize.
  auto r = run_dllm({"tokenize", "--prompt", "hi"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err.rfind("ERROR: missing required flag --model for 'tokenize'\n", 0), 0u) << r.err;
  EXPECT_NE(r.err.find("dllm tokenize --model PATH --prompt TEXT"), std::string::npos);
  expect_usage_error({"run", "--model", "m"}, "missing required flag --prompt for 'run'");
  expect_usage_error({"run"}, "missing required flag --prompt for 'run'");
  expect_usage_error({"logits", "--model", "m", "--tokens", "1", "--out", "o"},
                     "missing required flag --rows for 'logits'");
}

TEST(Cli, MissingModelPathForInspect) {
  auto r = run_dllm({"inspect"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err.rfind("ERROR: missing model path for 'inspect'\n", 0), 0u) << r.err;
  EXPECT_NE(r.err.find("dllm inspect PATH"), std::string::npos);
}

TEST(Cli, UnknownCommand) {
  auto r = run_dllm({"bogus"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err, "ERROR: unknown command: bogus\nsee: dllm --help\n");
}

TEST(Cli, UnexpectedArgument) {
  expect_usage_error({"run", "x", "--model", "m"}, "unexpected argument 'x' for 'run'");
  expect_usage_error({"logits", "--model", "m", "extra"}, "unexpected argument 'extra' for 'logits'");
  expect_usage_error({"inspect", "a.gguf", "b.gguf"}, "unexpected argument 'b.gguf' for 'inspect'");
}

TEST(Cli, FlagEqualsValue) {
  auto r = run_dllm({"run", "--model=x", "--prompt", "p"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err,
            "ERROR: unknown flag --model=x for 'run'\n"
            "flags take their value as the next argument: --model x\n");
}

TEST(Cli, FlagNeedsAValue) {
  expect_usage_error({"run", "--model", "m", "--prompt"}, "flag --prompt needs a value");
  expect_usage_error({"logits", "--model"}, "flag --model needs a value");
}

TEST(Cli, NumbersAreChecked) {
  const std::vector<std::string> base = {"run", "--model", kMissing, "--prompt", "p"};
  auto with = [&](std::vector<std::string> extra) {
    auto a = base;
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  };
  expect_usage_error(with({"--steps", "abc"}), "flag --steps needs an integer, got 'abc'");
  expect_usage_error(with({"--steps", "99999999999999999999"}),
                     "flag --steps needs an integer, got '99999999999999999999'");
  expect_usage_error(with({"--max-tokens", "1.5"}), "flag --max-tokens needs an integer, got '1.5'");
  expect_usage_error(with({"--steps", ""}), "flag --steps needs an integer, got ''");
  expect_usage_error(with({"--seed", "12x"}), "flag --seed needs an integer, got '12x'");
  expect_usage_error(with({"--temperature", "nan"}), "flag --temperature needs a finite number, got 'nan'");
  expect_usage_error(with({"--temperature", "inf"}), "flag --temperature needs a finite number, got 'inf'");
  expect_usage_error(with({"--temperature", "1e999"}), "flag --temperature needs a finite number, got '1e999'");
  expect_usage_error(with({"--threshold", "x"}), "flag --threshold needs a finite number, got 'x'");
  expect_usage_error({"logits", "--model", kMissing, "--tokens", "1,,2", "--rows", "0", "--out", "o"},
                     "flag --tokens needs comma-separated integers, got '1,,2'");
  expect_usage_error({"logits", "--model", kMissing, "--tokens", "1,2", "--rows", "0 1", "--out", "o"},
                     "flag --rows needs comma-separated integers, got '0 1'");
  expect_usage_error({"logits", "--model", kMissing, "--tokens", "1,2,", "--rows", "0", "--out", "o"},
                     "flag --tokens needs comma-separated integers, got '1,2,'");
}

TEST(Cli, StepsAreBoundedByMaxTokensBeforeTheModelIsOpened) {
  // A step count past --max-tokens would run for ever (Dream) or skip its way through 2^63 steps (LLaDA).
  auto r = run_dllm({"run", "--model", kMissing, "--prompt", "p", "--steps", "9223372036854775807"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err, "ERROR: flag --steps must be at most --max-tokens 128, got 9223372036854775807 (every step "
                   "commits at least one token)\n");
  expect_usage_error({"run", "--model", kMissing, "--prompt", "p", "--max-tokens", "8", "--steps", "9"},
                     "flag --steps must be at most --max-tokens 8, got 9 (every step commits at least one token)");
  EXPECT_EQ(parse_ok({"run", "--model", kMissing, "--prompt", "p", "--max-tokens", "8", "--steps", "8"}).steps, 8);
}

TEST(Cli, MaxTokensNearTwoToThe63IsAUsageErrorNotAnOverflow) {
  auto r = run_dllm({"run", "--model", kMissing, "--prompt", "p", "--max-tokens", "9223372036854775807"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err, "ERROR: flag --max-tokens must be at most 16777216, got 9223372036854775807\n");
  EXPECT_EQ(parse_ok({"run", "--model", kMissing, "--prompt", "p", "--max-tokens", "16777216"}).max_tokens, 16777216);
  // The generation's own check (library callers, no parser) compares without overflowing: prompt + max_tokens
  // wrapped negative and slipped past the context check into a vector of 2^63 elements.
  dllm::model::GenerateConfig c;
  c.arch = dllm::model::Arch::Dream;
  c.remasking = dllm::model::default_remasking(c.arch);
  c.max_tokens = INT64_MAX;
  c.context_length = 4096;
  std::string e;
  try {
    dllm::model::validate(c, 15);
  } catch (const Error& err) {
    e = err.what();
    EXPECT_EQ(err.exit_code(), 2);
  }
  EXPECT_EQ(e, "the canvas of 15 prompt tokens + --max-tokens 9223372036854775807 is longer than the model's context "
               "length 4096");
}

TEST(Cli, RangesCheckedBeforeTheModelIsOpened) {
  // The model path does not exist: a usage error (exit 2) must come first.
  for (const char* flag : {"--max-tokens", "--steps", "--block-length", "--threads"}) {
    auto r = run_dllm({"run", "--model", kMissing, "--prompt", "p", flag, "0"});
    EXPECT_EQ(r.exit_code, 2) << flag;
    EXPECT_EQ(r.err, std::string("ERROR: flag ") + flag + " must be at least 1, got 0\n");
  }
  expect_usage_error({"run", "--model", kMissing, "--prompt", "p", "--steps", "-3"},
                     "flag --steps must be at least 1, got -3");
  expect_usage_error({"run", "--model", kMissing, "--prompt", "p", "--temperature", "-0.5"},
                     "flag --temperature must be at least 0, got -0.5");
  expect_usage_error({"run", "--model", kMissing, "--prompt", "p", "--threshold", "1.5"},
                     "flag --threshold must be between 0 and 1, got 1.5");
  expect_usage_error({"logits", "--model", kMissing, "--tokens", "1", "--rows", "0", "--out", "o", "--threads", "0"},
                     "flag --threads must be at least 1, got 0");
  expect_usage_error({"run", "--model", kMissing, "--prompt", "p", "--device", "tpu"},
                     "flag --device must be one of cpu|gpu|auto, got 'tpu'");
  expect_usage_error({"run", "--model", kMissing, "--prompt", "p", "--remasking", "best"},
                     "flag --remasking must be one of low_confidence|random|entropy|maskgit_plus|topk_margin, got 'best'");
}

TEST(Cli, CrossFlagRules) {
  expect_usage_error({"run", "--model", "m", "--prompt", "p", "--prompt-tokens", "1,2"},
                     "flags --prompt and --prompt-tokens cannot be combined: give one of them");
  expect_usage_error({"run", "--model", "m", "--prompt", "p", "--dual-cache", "--full-logits"},
                     "flags --dual-cache and --full-logits cannot be combined");
  expect_usage_error({"run", "--model", "m", "--prompt", "p", "--steps", "4", "--steps", "8"},
                     "flag --steps is given more than once");
  expect_usage_error({"inspect", "x.gguf", "--tensor", "t"}, "flag --tensor needs --out for 'inspect'");
}

TEST(Cli, EveryFlagReachesSettings) {
  Settings s = parse_ok({"run", "--model", "m.gguf", "--prompt", "hello", "--max-tokens", "64", "--steps", "16",
                         "--block-length", "8", "--temperature", "0.7", "--remasking", "random", "--threshold",
                         "0.9", "--dual-cache", "--seed", "7", "--threads", "3", "--device", "gpu", "--no-chat",
                         "--no-early-stop", "--visual", "--verbose", "--dump-step-stats", "--json"});
  EXPECT_EQ(s.command, "run");
  EXPECT_EQ(s.model, "m.gguf");
  EXPECT_EQ(s.prompt, "hello");
  EXPECT_TRUE(s.has_prompt);
  EXPECT_EQ(s.max_tokens, 64);
  EXPECT_EQ(s.steps, 16);
  EXPECT_EQ(s.block_length, 8);
  EXPECT_DOUBLE_EQ(s.temperature, 0.7);
  EXPECT_EQ(s.remasking, "random");
  EXPECT_DOUBLE_EQ(s.threshold, 0.9);
  EXPECT_TRUE(s.dual_cache);
  EXPECT_EQ(s.seed, 7u);
  EXPECT_EQ(s.threads, 3);
  EXPECT_EQ(s.device, "gpu");
  EXPECT_TRUE(s.no_chat);
  EXPECT_TRUE(s.no_early_stop);
  EXPECT_TRUE(s.visual);
  EXPECT_TRUE(s.verbose);
  EXPECT_TRUE(s.dump_step_stats);
  EXPECT_TRUE(s.json);
  EXPECT_FALSE(s.full_logits);

  Settings f = parse_ok({"run", "--model", "m", "--prompt-tokens", "5,6,7", "--full-logits"});
  EXPECT_TRUE(f.full_logits);
  EXPECT_TRUE(f.has_prompt_tokens);
  EXPECT_EQ(f.prompt_tokens, (std::vector<int64_t>{5, 6, 7}));

  Settings d = parse_ok({"run", "--model", "m", "--prompt", "x"});
  EXPECT_EQ(d.max_tokens, 128);
  EXPECT_EQ(d.steps, 0);  // = max_tokens, resolved by the sampler
  EXPECT_EQ(d.block_length, 32);
  EXPECT_EQ(d.temperature, 0.0);
  EXPECT_EQ(d.seed, 42u);
  EXPECT_EQ(d.device, "auto");  // a usable GPU, else the CPU (issue 8)
  EXPECT_EQ(d.threads, 0);

  Settings l = parse_ok({"logits", "--model", "m", "--tokens", "1,2,3", "--rows", "0,2", "--out", "o.f32",
                         "--threads", "2", "--device", "cpu", "--verbose"});
  EXPECT_EQ(l.tokens, (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(l.rows, (std::vector<int64_t>{0, 2}));
  EXPECT_EQ(l.out, "o.f32");
  EXPECT_EQ(l.threads, 2);
  EXPECT_TRUE(l.verbose);

  Settings t = parse_ok({"tokenize", "--model", "m", "--prompt", "p", "--no-chat", "--json"});
  EXPECT_TRUE(t.no_chat);
  EXPECT_TRUE(t.json);

  Settings i = parse_ok({"inspect", "--json", "f.gguf", "--tensor", "w", "--out", "w.f32"});
  EXPECT_EQ(i.path, "f.gguf");
  EXPECT_TRUE(i.json);
  EXPECT_EQ(i.tensor, "w");
  EXPECT_EQ(i.out, "w.f32");
}

// Errors that come from opening the model file (exit 1).
TEST(Cli, ModelFileErrors) {
  auto r = run_dllm({"inspect", kMissing});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err, std::string("ERROR: cannot open model file ") + kMissing +
                       ": No such file or directory\nto download a model, run: ./dllm pull\n");

  auto nd = run_dllm({"inspect", "/etc/passwd/model.gguf"});
  EXPECT_EQ(nd.exit_code, 1);
  EXPECT_EQ(nd.err, "ERROR: cannot open model file /etc/passwd/model.gguf: Not a directory\n");

  auto dir = run_dllm({"inspect", "/tmp"});
  EXPECT_EQ(dir.exit_code, 1);
  EXPECT_EQ(dir.err, "ERROR: is a directory: /tmp\n");

  std::string html = dllm::test::data_path("gguf/malformed/html-page.gguf");
  auto bad = run_dllm({"inspect", html});
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_EQ(bad.err.rfind("ERROR: " + html + " is not a GGUF file (bad magic).\n", 0), 0u) << bad.err;
  EXPECT_NE(bad.err.find("./dllm pull"), std::string::npos);
}

TEST(Cli, ShortModelAlias) {
  Settings s = parse_ok({"run", "-m", "owner/repo:Q4_K_M", "--prompt", "p"});
  EXPECT_EQ(s.model, "owner/repo:Q4_K_M");
  Settings h = parse_ok({"tokenize", "-m", "-h", "--prompt", "p"});  // -h as the value of -m
  EXPECT_EQ(h.model, "-h");
  expect_usage_error({"run", "-m"}, "flag --model needs a value");
  expect_usage_error({"run", "-m", "a", "--model", "b", "--prompt", "p"}, "flag --model is given more than once");
}
