// The command-line contract. Each command's flags are declared once in a table; cxxopts is built from that
// table to render help, and parse_command_line() walks argv against it so that every usage error has the exact
// wording of the spec and happens before any file is opened. Order of precedence:
//   1. --help / -h anywhere (except as a flag's value) prints that command's usage, exit 0;
//   2. the first structural problem, left to right (unknown flag, `--flag=value`, missing value, stray argument);
//   3. value problems (not a number, out of range), then missing required flags, then cross-flag rules.
#include "cli/args.h"

#include <cxxopts.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <map>
#include <set>

#include "cli/commands.h"
#include "cli/commands_gpu.h"
#include "cli/commands_hub.h"
#include "cli/commands_jit.h"
#include "cli/run_config.h"
#include "engine/request.h"
#include "hub/hub.h"
#include "model/sampler.h"
#include "common/error.h"
#include "model/arch.h"

namespace dllm::cli {

namespace {

enum class Kind {
  Bool,     // a switch, no value
  Count,    // integer >= 1
  UInt,     // integer >= 0
  Float0,   // finite number >= 0
  Unit,     // finite number in [0, 1]
  String,   // any text
  Ids,      // comma-separated integers >= 0
  Choice,   // one of a fixed list
};

struct Flag {
  const char* name;     // without the leading dashes
  const char* metavar;  // "N", "PATH", ... (unused for Bool)
  const char* def;      // default shown in help ("" = none)
  const char* help;
  Kind kind;
  const char* choices = "";  // Choice: comma-separated allowed values
};

struct Command {
  const char* name;
  const char* synopsis;  // the usage line after "dllm "
  const char* line;      // what it does, in one line of `dllm --help`
  const char* summary;
  std::vector<Flag> flags;
  std::vector<const char*> required;  // flags that must be given
  bool takes_path = false;            // inspect PATH
};

const Flag kModel{"model", "PATH", "", "LLaDA, Dream, LLaDA-MoE, RND1 or DiffusionGemma GGUF file, or a Hugging Face id owner/repo[:QUANT]",
                  Kind::String};
const std::string kRunModelDefault = "$DLLM_MODEL, else " + std::string(hub::kDefaultModel);
const Flag kRunModel{"model", "PATH", kRunModelDefault.c_str(),
                     "LLaDA, Dream, LLaDA-MoE, RND1 or DiffusionGemma GGUF file, or a Hugging Face id owner/repo[:QUANT] (downloaded once)",
                     Kind::String};
const Flag kPrompt{"prompt", "TEXT", "", "the user message", Kind::String};
const Flag kPromptFile{"prompt-file", "PATH", "",
                       "the user message from a file ('-': standard input), for texts past the 128 KiB a command-line "
                       "argument may hold; instead of --prompt",
                       Kind::String};
const Flag kThreads{"threads", "N", "all logical CPUs",
                    "worker threads; more than the hardware threads are capped to them, with a warning", Kind::Count};
const Flag kDevice{"device", "D", "auto",
                   "auto (a usable GPU, else the CPU), cpu, or gpu for an NVIDIA GPU with compute capability 8.0+",
                   Kind::Choice, "cpu,gpu,auto"};
const Flag kSelfCondTopK{
    "self-cond-top-k", "K", "0 (every token)",
    "DiffusionGemma, an opt-in approximation: self-conditioning takes only each canvas row's K most probable tokens "
    "(faster when the distributions are broad; off by at most the dropped probability mass)",
    Kind::UInt};
const Flag kNoChat{"no-chat", "", "off", "skip the chat template (BOS/EOS still as the vocabulary says)", Kind::Bool};
const Flag kJson{"json", "", "off", "print one JSON object", Kind::Bool};
const Flag kVerbose{"verbose", "", "off", "timings and memory after the output", Kind::Bool};

// The generation flags: run's settings, serve's defaults for every request.
const std::vector<Flag> kGenerationFlags = {
    {"max-tokens", "N", "128", "tokens to generate (the masked canvas), at most 16777216", Kind::Count},
    {"steps", "N", "--max-tokens",
     "denoising steps, at most --max-tokens; LLaDA: at least the block count, shared out over the blocks in "
     "proportion to their lengths",
     Kind::Count},
    {"block-length", "N", "32",
     "LLaDA's semi-autoregressive block size; the last block is shorter when it does not divide --max-tokens. "
     "Dream ignores it",
     Kind::Count},
    {"temperature", "T", "0", "0 is greedy; above 0 adds Gumbel noise as LLaDA does", Kind::Float0},
    {"remasking", "S", "low_confidence",
     "LLaDA: low_confidence or random. Dream: entropy (the default), maskgit_plus, topk_margin", Kind::Choice,
     "low_confidence,random,entropy,maskgit_plus,topk_margin"},
    {"threshold", "P", "0 (off)",
     "LLaDA: each step also commits every masked token whose confidence is at least P", Kind::Unit},
    {"dual-cache", "", "off",
     "LLaDA: cache keys/values and recompute only the current block's rows inside a block", Kind::Bool},
    {"seed", "N", "42", "seeds this program's PRNG", Kind::UInt},
    {"eb-max-steps", "N", "the file's (48)", "DiffusionGemma: denoising steps per block, at most", Kind::Count},
    {"eb-t-max", "T", "the file's (0.8)", "DiffusionGemma: the first step's temperature", Kind::Float0},
    {"eb-t-min", "T", "the file's (0.4)",
     "DiffusionGemma: the temperature the steps go down towards (t_min + (t_max - t_min) * steps left / steps)",
     Kind::Float0},
    {"eb-entropy-bound", "B", "the file's (0.1)",
     "DiffusionGemma: each step keeps the lowest-entropy positions while the entropies before each sum to at most "
     "B, and re-noises the rest",
     Kind::Float0},
    {"eb-stability", "N", "the file's (1)",
     "DiffusionGemma: a block stops once its argmax canvas held for N steps and the step is confident", Kind::UInt},
    {"eb-confidence", "C", "the file's (0.005)", "DiffusionGemma: confident = the mean entropy is below C",
     Kind::Float0},
    kSelfCondTopK,
};

// base's flags, then more.
std::vector<Flag> with_flags(std::vector<Flag> base, const std::vector<Flag>& more) {
  base.insert(base.end(), more.begin(), more.end());
  return base;
}

const std::vector<Command>& commands() {
  static const std::vector<Command> cmds = {
      {"run",
       "run --model PATH --prompt TEXT [options]",
       "generate an answer to a prompt (--prompts-file: many at once)",
       "Generates an answer by denoising a masked canvas with the model's own sampler.",
       with_flags(with_flags({kRunModel,
        kPrompt,
        kPromptFile,
        {"prompt-tokens", "IDS", "", "comma-separated prompt ids used verbatim (no template); instead of --prompt",
         Kind::Ids},
        {"prompts-file", "PATH", "",
         "many requests, one JSON object a line ('-': standard input): {\"prompt\": ...} or {\"prompt_tokens\": "
         "[...]}, optional \"id\", \"system\", \"no_chat\" and the generation flags as keys (\"max_tokens\", "
         "...), the flags being the defaults; answers in input order. Instead of --prompt",
         Kind::String},
        {"batch-size", "N", "8", "--prompts-file: requests generated at once, at most 1024", Kind::Count}},
       kGenerationFlags),
       {kThreads,
        kDevice,
        kNoChat,
        {"full-logits", "", "off", "compute logits for every position (for benchmarking)", Kind::Bool},
        {"no-early-stop", "", "off", "run every step even after the answer is final", Kind::Bool},
        {"visual", "", "off", "redraw the canvas after every step", Kind::Bool},
        kVerbose,
        {"dump-step-stats", "", "off", "one line per denoising step", Kind::Bool},
        {"json", "", "off", "one JSON object with timings, tokens and text", Kind::Bool},
        {"top-logprobs", "N", "off",
         "with --json: a \"logprobs\" array, each answer token's log-probability and its N most probable "
         "alternatives (0 to 20)",
         Kind::UInt}}),
       {}},
      {"serve",
       "serve --model PATH [--host H] [--port P] [--api-key K] [--batch-size N] [--max-queue Q] [options]",
       "an OpenAI-compatible HTTP server, with a page that shows the canvas denoise",
       "Serves the model over an OpenAI-compatible HTTP API (/v1/chat/completions, /v1/completions, /v1/models,\n"
       "/tokenize, /detokenize, /props, /health, /metrics) with a page at / that shows the canvas denoise. The generation flags are the defaults\n"
       "of every request. SIGINT / SIGTERM: no new requests, the ones in flight finish (--shutdown-grace), exit 0.",
       with_flags({kRunModel,
                   {"host", "H", "127.0.0.1", "address to listen on (0.0.0.0: every interface)", Kind::String},
                   {"port", "P", "8080", "TCP port; 0 picks a free one (printed)", Kind::UInt},
                   {"api-key", "K", "none",
                    "requests to /v1/ need the header 'Authorization: Bearer K' (else 401)", Kind::String},
                   {"batch-size", "N", "8", "sequences generated at once, at most 1024", Kind::Count},
                   {"max-queue", "Q", "64", "sequences waiting for a place in the batch, at most (beyond: 429)",
                    Kind::UInt},
                   {"prefix-cache-mib", "MIB", "512",
                    "DiffusionGemma: the encoded prompts of recent requests kept for the next turn of a chat, at "
                    "most this many MiB (least recently used out; 0: off)",
                    Kind::UInt},
                   {"shutdown-grace", "S", "10",
                    "on SIGINT / SIGTERM, seconds the requests in flight may still run before they are cancelled",
                    Kind::UInt},
                   {"max-tokens-limit", "N", "4096", "the largest max_tokens a request may ask (beyond: 400)",
                    Kind::Count},
                   {"max-steps-limit", "N", "4096", "the most denoising steps a request may ask (beyond: 400)",
                    Kind::Count},
                   {"max-n", "N", "16", "the most choices (n) one request may ask, at most 1024 (beyond: 400)",
                    Kind::Count},
                   {"max-connections", "N", "512", "connections open at once (beyond: 503 and closed)", Kind::Count},
                   {"cors-origin", "ORIGINS", "none",
                    "browser origins allowed to call the API, comma-separated (e.g. https://app.example; *: any); "
                    "others get 403",
                    Kind::String},
                   {"allow-host", "NAMES", "none",
                    "Host names a loopback server answers besides localhost and loopback addresses (a proxy's "
                    "name), comma-separated",
                    Kind::String},
                   kThreads,
                   kDevice},
                  kGenerationFlags),
       {}},
      {"tokenize",
       "tokenize --model PATH --prompt TEXT [--no-chat] [--json]   (or --messages FILE instead of --prompt)",
       "the prompt's token ids, as run feeds them",
       "Prints the token ids of the chat-formatted prompt, the same ids run feeds the model, or of a whole\n"
       "conversation rendered with the file's chat template (--messages).",
       {kModel, kPrompt, kPromptFile, kNoChat,
        {"messages", "FILE", "",
         "a conversation instead of --prompt: a JSON array of {\"role\", \"content\"} messages (system, user, "
         "assistant) as OpenAI's chat API takes them ('-': standard input), rendered with the generation prompt",
         Kind::String},
        {"json", "", "off", "print {\"ids\": [...], \"pieces\": [...]}", Kind::Bool}},
       {"model"}},
      {"inspect",
       "inspect PATH [--json] [--tensor NAME --out FILE]",
       "a GGUF file's metadata, tensor types and shapes; one tensor dumped as f32",
       "Prints GGUF metadata, a count per tensor type, and every tensor's type and shape.",
       {kJson,
        {"tensor", "NAME", "", "write this tensor dequantized to f32 (needs --out)", Kind::String},
        {"out", "FILE", "", "output file for --tensor: little-endian f32, row-major, ne0 fastest", Kind::String}},
       {},
       true},
      {"logits",
       "logits --model PATH --tokens IDS --rows POSITIONS --out FILE [--threads N] [--device D] "
       "[--no-prompt-cache] [--self-cond FILE --self-cond-temperature T --self-cond-top-k K]",
       "one forward pass: the f32 logits of some canvas positions, into a file",
       "Runs one forward pass over the given ids and writes f32 logits [rows, vocab], row major, to a file. "
       "DiffusionGemma: --tokens is the prompt then the canvas (its last canvas_length ids), --rows are absolute "
       "positions inside the canvas; the prompt is encoded once into a key/value cache and the canvas run against "
       "it, unless --no-prompt-cache runs one unified pass.",
       {kModel,
        {"tokens", "IDS", "", "comma-separated token ids (the canvas; DiffusionGemma: prompt then canvas)", Kind::Ids},
        {"rows", "POSITIONS", "", "comma-separated canvas positions whose logits are written", Kind::Ids},
        {"out", "FILE", "", "output file", Kind::String},
        {"no-prompt-cache", "", "", "DiffusionGemma: one unified pass over prompt and canvas instead of the cached prompt",
         Kind::Bool},
        {"self-cond", "FILE", "", "DiffusionGemma: the previous step's raw canvas logits, f32 [canvas_length, vocab]",
         Kind::String},
        {"self-cond-temperature", "T", "1", "DiffusionGemma: temperature of the self-conditioning probabilities",
         Kind::Float0},
        kSelfCondTopK,
        kThreads,
        kDevice,
        kVerbose},
       {"model", "tokens", "rows", "out"}},
      {"synth",
       "synth --arch llada|dream|llada-moe|rnd1|diffusion-gemma --out FILE [--layers N] [--quant Q4_K_M|Q8_0] [--seed S] [--dense]",
       "a random-weight GGUF with a real model's shapes (benchmarks)",
       "Writes a random-weight GGUF with the real LLaDA-8B / Dream-7B / LLaDA-MoE-7B-A1B / RND1-30B-A3B (24 layers) / "
       "DiffusionGemma-26B-A4B shapes, metadata, tokenizer and quant mix (for benchmarks).",
       {{"arch", "A", "", "llada, dream, llada-moe, rnd1 or diffusion-gemma", Kind::Choice,
         "llada,dream,llada-moe,rnd1,diffusion-gemma"},
        {"out", "FILE", "", "the GGUF file to write", Kind::String},
        {"layers", "N", "the real model's (32 / 28 / 16 / 24 / 30)", "fewer layers of the same widths, for quick runs",
         Kind::Count},
        {"quant", "Q", "Q4_K_M", "Q4_K_M (the tensor-type mix of a real download) or Q8_0", Kind::Choice,
         "Q4_K_M,Q8_0"},
        {"seed", "S", "42", "seed of the random weights", Kind::UInt},
        {"dense", "", "off",
         "for llada-moe or rnd1: its dense twin instead (a llada with the same active parameters and attention types)",
         Kind::Bool}},
       {"arch", "out"}},
      {"doctor",
       "doctor",
       "what this machine offers dllm (CPU, GPU, NVRTC, the default model), each problem with its fix",
       "Reports the CPU's features and kernel family, the GPU and NVRTC (optional), each problem with its fix.",
       {},
       {}},
  };
  return cmds;
}

// dllm kernels: the CPU kernels (cmd_kernels), or with --gpu-arch sm_XX the generated CUDA sources, PTX and
// CUBIN (cmd_kernels_gpu, no GPU needed).
int kernels_dispatch(const std::vector<std::string>& args) {
  if (std::find(args.begin(), args.end(), "--gpu-arch") == args.end()) return cmd_kernels(args);
  std::string arch, model, out;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    std::string* dst = a == "--gpu-arch" ? &arch : (a == "--model" || a == "-m") ? &model : a == "--out" ? &out : nullptr;
    if (!dst) throw usage_error("unknown flag " + a + " for 'kernels --gpu-arch' (it takes --gpu-arch, --model, --out)",
                                "see: dllm kernels --help");
    if (i + 1 >= args.size()) throw usage_error("flag " + a + " needs a value");
    *dst = args[++i];
  }
  if (model.empty()) throw usage_error("missing required flag --model for 'kernels'", "see: dllm kernels --help");
  if (out.empty()) throw usage_error("missing required flag --out for 'kernels'", "see: dllm kernels --help");
  return cmd_kernels_gpu(model, arch, out);
}

std::string kernels_dispatch_usage() {
  return kernels_usage() +
         "\n  dllm kernels --gpu-arch sm_XX --model PATH --out DIR\n"
         "      writes the CUDA kernels generated for the model (.cu), their PTX and CUBIN and a manifest,\n"
         "      compiled by NVRTC for that architecture (sm_80 or newer); needs no GPU\n";
}

// Commands that declare and parse their own flags (with the same error conventions); the parser only
// routes to them and gives their usage for --help.
struct Passthrough {
  const char* name;
  const char* line;  // what it does, in one line of `dllm --help`
  std::string (*usage)();
  int (*run)(const std::vector<std::string>&);
};

const std::vector<Passthrough>& passthrough_commands() {
  static const std::vector<Passthrough> p = {
      {"pull", "download a model from Hugging Face into the cache", pull_usage, cmd_pull},
      {"kernels", "write the CPU (or CUDA) kernels generated for a model's matrices", kernels_dispatch_usage,
       kernels_dispatch},
      {"bench", "the machine's int8 peak and bandwidth; GEMM throughput against them", bench_usage, cmd_bench},
  };
  return p;
}

const Passthrough* find_passthrough(const std::string& name) {
  for (const auto& p : passthrough_commands())
    if (name == p.name) return &p;
  return nullptr;
}

const Command* find_command(const std::string& name) {
  for (const auto& c : commands())
    if (name == c.name) return &c;
  return nullptr;
}

const Flag* find_flag(const Command& c, const std::string& name) {
  for (const auto& f : c.flags)
    if (name == f.name) return &f;
  return nullptr;
}

// The flag an argument names: "--steps" -> steps; the one short alias "-m" -> model.
const Flag* flag_of_arg(const Command& c, const std::string& arg) {
  if (arg.rfind("--", 0) == 0) return find_flag(c, arg.substr(2));
  if (arg == "-m") return find_flag(c, "model");
  return nullptr;
}

std::string help_text(const Command& c) {
  cxxopts::Options opts(std::string("dllm ") + c.name, c.summary);
  const std::string synopsis = c.synopsis;
  opts.custom_help(synopsis.size() > std::strlen(c.name) ? synopsis.substr(std::strlen(c.name) + 1) : "");
  opts.set_width(100);
  auto adder = opts.add_options();
  for (const auto& f : c.flags) {
    std::string desc = f.help;
    std::string names = f.name == std::string("model") ? "m,model" : f.name;
    if (f.kind == Kind::Bool) {
      adder(names, desc);
    } else {
      if (*f.def) desc += " (default: " + std::string(f.def) + ")";
      adder(names, desc, cxxopts::value<std::string>(), f.metavar);
    }
  }
  adder("h,help", "print this usage and exit");
  if (c.takes_path) opts.positional_help("");
  return opts.help();
}

Error unknown_flag_error(const Command& c, const std::string& arg) {
  std::string name = arg.substr(arg.find_first_not_of('-'));
  std::string suggestion;
  size_t best = 3;
  for (const auto& f : c.flags) {
    size_t d = edit_distance(name, f.name);
    if (d < best) best = d, suggestion = f.name;
  }
  std::string msg = "unknown flag " + arg + " for '" + c.name + "'";
  if (!suggestion.empty()) msg += " (did you mean --" + suggestion + "?)";
  return usage_error(msg, std::string("see: dllm ") + c.name + " --help");
}

int64_t parse_int(const std::string& flag, const std::string& v) {
  int64_t x = 0;
  auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
  if (v.empty() || ec != std::errc() || p != v.data() + v.size())
    throw usage_error("flag --" + flag + " needs an integer, got '" + v + "'");
  return x;
}

double parse_number(const std::string& flag, const std::string& v) {
  double x = 0;
  auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
  if (v.empty() || ec != std::errc() || p != v.data() + v.size() || !std::isfinite(x))
    throw usage_error("flag --" + flag + " needs a finite number, got '" + v + "'");
  return x;
}

std::vector<int64_t> parse_ids(const std::string& flag, const std::string& v) {
  std::vector<int64_t> ids;
  size_t start = 0;
  for (;;) {
    size_t comma = v.find(',', start);
    std::string item = v.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    int64_t x = 0;
    auto [p, ec] = std::from_chars(item.data(), item.data() + item.size(), x);
    if (item.empty() || ec != std::errc() || p != item.data() + item.size())
      throw usage_error("flag --" + flag + " needs comma-separated integers, got '" + v + "'");
    if (x < 0) throw usage_error("flag --" + flag + " needs non-negative integers, got " + std::to_string(x));
    ids.push_back(x);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return ids;
}

// "a, b,c" -> {"a", "b", "c"} (empty items dropped).
std::vector<std::string> split_list(const std::string& v) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= v.size()) {
    size_t comma = v.find(',', start);
    if (comma == std::string::npos) comma = v.size();
    std::string item = v.substr(start, comma - start);
    item.erase(0, item.find_first_not_of(' '));
    item.erase(item.find_last_not_of(' ') + 1);
    if (!item.empty()) out.push_back(item);
    start = comma + 1;
  }
  return out;
}

// Stores one flag's value into the settings: the only place where flags reach Settings.
void apply_flag(Settings& s, const Flag& f, const std::string& v) {
  const std::string name = f.name;
  switch (f.kind) {
    case Kind::Count: {
      int64_t x = parse_int(name, v);
      if (x < 1) throw usage_error("flag --" + name + " must be at least 1, got " + std::to_string(x));
      if (name == "max-tokens") s.max_tokens = x;
      else if (name == "steps") s.steps = x;
      else if (name == "block-length") s.block_length = x, s.has_block_length = true;
      else if (name == "threads") s.threads = x;
      else if (name == "layers") s.layers = x;
      else if (name == "batch-size") s.batch_size = x;
      else if (name == "max-tokens-limit") s.max_tokens_limit = x;
      else if (name == "max-steps-limit") s.max_steps_limit = x;
      else if (name == "eb-max-steps") s.eb_max_steps = x;
      else if (name == "max-n") {
        if (x > 1024) throw usage_error("flag --max-n must be at most 1024, got " + std::to_string(x));
        s.max_n = x;
      } else if (name == "max-connections") s.max_connections = x;
      return;
    }
    case Kind::UInt: {
      int64_t x = parse_int(name, v);
      if (x < 0) throw usage_error("flag --" + name + " must be at least 0, got " + std::to_string(x));
      if (name == "seed") s.seed = static_cast<uint64_t>(x);
      else if (name == "eb-stability") s.eb_stability = x;
      else if (name == "self-cond-top-k") {
        if (x > model::kMaxSelfCondTopK) {
          throw usage_error("flag --self-cond-top-k must be at most " + std::to_string(model::kMaxSelfCondTopK) + ", got " +
                            std::to_string(x));
        }
        s.self_cond_top_k = x;
      }
      else if (name == "max-queue") s.max_queue = x;
      else if (name == "prefix-cache-mib") s.prefix_cache_mib = x;
      else if (name == "top-logprobs") {
        if (x > model::kMaxTopLogprobs) {
          throw usage_error("flag --top-logprobs must be at most " + std::to_string(model::kMaxTopLogprobs) +
                            ", got " + std::to_string(x));
        }
        s.top_logprobs = x;
      }
      else if (name == "shutdown-grace") s.shutdown_grace_s = x;
      else if (name == "port") {
        if (x > 65535) throw usage_error("flag --port must be at most 65535, got " + std::to_string(x));
        s.port = x;
      }
      return;
    }
    case Kind::Float0: {
      double x = parse_number(name, v);
      if (x < 0) throw usage_error("flag --" + name + " must be at least 0, got " + format_number(x));
      if (name == "temperature") s.temperature = x;
      else if (name == "eb-t-min") s.eb_t_min = x;
      else if (name == "eb-t-max") s.eb_t_max = x;
      else if (name == "eb-entropy-bound") s.eb_entropy_bound = x;
      else if (name == "eb-confidence") s.eb_confidence = x;
      else if (name == "self-cond-temperature") s.self_cond_temperature = x, s.has_self_cond_temperature = true;
      return;
    }
    case Kind::Unit: {
      double x = parse_number(name, v);
      if (x < 0 || x > 1)
        throw usage_error("flag --" + name + " must be between 0 and 1, got " + format_number(x));
      if (name == "threshold") s.threshold = x;
      return;
    }
    case Kind::Choice: {
      std::string list = f.choices;
      bool ok = false;
      for (size_t a = 0; a <= list.size();) {
        size_t b = list.find(',', a);
        if (b == std::string::npos) b = list.size();
        if (list.compare(a, b - a, v) == 0 && b - a == v.size()) ok = true;
        a = b + 1;
      }
      if (!ok) {
        std::string shown = list;
        std::replace(shown.begin(), shown.end(), ',', '|');
        throw usage_error("flag --" + name + " must be one of " + shown + ", got '" + v + "'");
      }
      if (name == "device") s.device = v;
      else if (name == "arch") s.arch = v;
      else if (name == "quant") s.quant = v;
      else if (name == "remasking") s.remasking = v;
      return;
    }
    case Kind::Ids: {
      auto ids = parse_ids(name, v);
      if (name == "tokens") s.tokens = ids;
      else if (name == "rows") s.rows = ids;
      else if (name == "prompt-tokens") s.prompt_tokens = ids, s.has_prompt_tokens = true;
      return;
    }
    case Kind::String:
      if (name == "model") s.model = v;
      else if (name == "prompt") s.prompt = v, s.has_prompt = true;
      else if (name == "prompt-file") s.prompt_file = v, s.has_prompt_file = true;
      else if (name == "messages") s.messages_file = v, s.has_messages = true;
      else if (name == "prompts-file") s.prompts_file = v, s.has_prompts_file = true;
      else if (name == "out") s.out = v;
      else if (name == "tensor") s.tensor = v;
      else if (name == "self-cond") s.self_cond_file = v;
      else if (name == "host") s.host = v;
      else if (name == "api-key") s.api_key = v;
      else if (name == "cors-origin") s.cors_origins = split_list(v);
      else if (name == "allow-host") s.allow_hosts = split_list(v);
      return;
    case Kind::Bool:
      if (name == "no-chat") s.no_chat = true;
      else if (name == "dual-cache") s.dual_cache = true;
      else if (name == "full-logits") s.full_logits = true;
      else if (name == "no-early-stop") s.no_early_stop = true;
      else if (name == "visual") s.visual = true;
      else if (name == "verbose") s.verbose = true;
      else if (name == "dump-step-stats") s.dump_step_stats = true;
      else if (name == "json") s.json = true;
      else if (name == "dense") s.dense = true;
      else if (name == "no-prompt-cache") s.no_prompt_cache = true;
      return;
  }
}

bool is_flag_like(const std::string& a) { return a.size() > 1 && a[0] == '-'; }

}  // namespace

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string format_number(double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%g", x);
  return buf;
}

std::string global_usage() {
  // One line per command (the flags are each command's --help), and the architectures the table knows.
  std::string archs;
  for (const model::ArchSpec* a : model::arch_specs())
    archs += (archs.empty() ? "" : ", ") + std::string(a->label) + " (" + a->name + ")";
  std::string u = "dllm - diffusion language models from GGUF files, on the CPU or an NVIDIA GPU\n"
                  "architectures (general.architecture): " + archs + "\n\n"
                  "Usage: dllm COMMAND [options]\n\nCommands:\n";
  auto line = [&](const std::string& name, const char* what) {
    u += "  " + name + std::string(name.size() < 10 ? 10 - name.size() : 1, ' ') + what + "\n";
  };
  for (const auto& c : commands()) line(c.name, c.line);
  for (const auto& p : passthrough_commands()) line(p.name, p.line);
  line("help", "this list; help COMMAND: that command's usage");
  line("version", "the version (also --version)");
  u += "\ndllm COMMAND --help (or -h) prints that command's usage and flags.\n";
  return u;
}

std::string version_text(std::string_view git_describe) {
  std::string v = std::string("dllm ") + DLLM_VERSION;
  if (!git_describe.empty()) v += " (git " + std::string(git_describe) + ")";
  return v + "\n";
}

std::string command_usage(const std::string& command) {
  if (const Passthrough* p = find_passthrough(command)) return p->usage();
  const Command* c = find_command(command);
  return c ? help_text(*c) : std::string();
}

Settings parse_command_line(const std::vector<std::string>& args, std::string* help) {
  Settings s;
  if (args.empty() || args[0] == "help" || args[0] == "--help" || args[0] == "-h") {
    if (args.size() >= 2 && args[0] == "help" && !command_usage(args[1]).empty()) {
      *help = command_usage(args[1]);
    } else {
      *help = global_usage();
    }
    s.command = "help";
    return s;
  }
  if (args[0] == "--version" || args[0] == "version") {
    if (args.size() == 2 && (args[1] == "--help" || args[1] == "-h")) {
      *help = "usage: dllm version (or dllm --version)\n\nPrints dllm's version (X.Y.Z, and the git describe of "
              "the checkout it was built from) and exits.\n";
      s.command = "help";
      return s;
    }
    if (args.size() > 1) throw usage_error("unexpected argument '" + args[1] + "' for 'version'");
    s.command = "version";
    return s;
  }
  if (const Passthrough* p = find_passthrough(args[0])) {
    s.command = p->name;
    s.rest.assign(args.begin() + 1, args.end());
    for (const auto& a : s.rest)
      if (a == "--help" || a == "-h") {
        *help = p->usage();
        break;
      }
    return s;
  }
  const Command* cmd = find_command(args[0]);
  if (!cmd) {
    if (is_flag_like(args[0])) throw usage_error("unknown flag " + args[0], "see: dllm --help");
    throw usage_error("unknown command: " + args[0], "see: dllm --help");
  }
  s.command = cmd->name;

  // Pass 1: help wins over everything, wherever it appears (a value of a flag does not count).
  for (size_t i = 1; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--help" || a == "-h") {
      *help = help_text(*cmd);
      return s;
    }
    const Flag* f = flag_of_arg(*cmd, a);
    if (f && f->kind != Kind::Bool) ++i;  // skip its value
  }

  // Pass 2: structure, left to right; values are stored (and checked) after the walk.
  std::vector<std::pair<const Flag*, std::string>> given;
  std::set<std::string> seen;
  for (size_t i = 1; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (!is_flag_like(a)) {
      if (cmd->takes_path && s.path.empty()) {
        s.path = a;
        continue;
      }
      throw usage_error("unexpected argument '" + a + "' for '" + cmd->name + "'");
    }
    const Flag* f = flag_of_arg(*cmd, a);
    if (!f) {
      size_t eq = a.find('=');
      if (a.rfind("--", 0) == 0 && eq != std::string::npos && find_flag(*cmd, a.substr(2, eq - 2))) {
        throw usage_error("unknown flag " + a + " for '" + cmd->name + "'",
                          "flags take their value as the next argument: " + a.substr(0, eq) + " " +
                              a.substr(eq + 1));
      }
      throw unknown_flag_error(*cmd, a);
    }
    if (!seen.insert(f->name).second)
      throw usage_error("flag --" + std::string(f->name) + " is given more than once");
    if (f->kind == Kind::Bool) {
      given.emplace_back(f, "");
      continue;
    }
    if (i + 1 >= args.size()) throw usage_error("flag --" + std::string(f->name) + " needs a value");
    given.emplace_back(f, args[++i]);
  }
  for (const auto& [f, v] : given) apply_flag(s, *f, v);

  // Required flags and arguments.
  if (cmd->takes_path && s.path.empty())
    throw usage_error(std::string("missing model path for '") + cmd->name + "'", help_text(*cmd));
  for (const char* r : cmd->required) {
    if (seen.count(r)) continue;
    // run takes its prompt from --prompt or --prompt-tokens (checked below).
    throw usage_error("missing required flag --" + std::string(r) + " for '" + cmd->name + "'", help_text(*cmd));
  }

  // Cross-flag rules that need no model file.
  if (s.command == "run" && s.has_prompts_file) {
    // A file of requests takes the place of the one prompt, and of the one canvas --visual redraws.
    for (auto [given, flag] : {std::pair{s.has_prompt, "--prompt"}, std::pair{s.has_prompt_file, "--prompt-file"},
                               std::pair{s.has_prompt_tokens, "--prompt-tokens"}, std::pair{s.visual, "--visual"}}) {
      if (given) throw usage_error(std::string("flags --prompts-file and ") + flag + " cannot be combined");
    }
    if (s.prompts_file.empty()) throw usage_error("flag --prompts-file needs a value");
  } else if (s.command == "run" && seen.count("batch-size")) {
    throw usage_error("flag --batch-size needs --prompts-file");
  } else if (s.command == "tokenize" && s.has_messages) {
    // A conversation takes the place of the one user message; it has no meaning without the template.
    for (auto [given, flag] : {std::pair{s.has_prompt, "--prompt"}, std::pair{s.has_prompt_file, "--prompt-file"},
                               std::pair{s.no_chat, "--no-chat"}}) {
      if (given) throw usage_error(std::string("flags --messages and ") + flag + " cannot be combined");
    }
    if (s.messages_file.empty()) throw usage_error("flag --messages needs a value");
  } else if (s.command == "run" || s.command == "tokenize") {
    const int prompts = int(s.has_prompt) + int(s.has_prompt_file) + int(s.has_prompt_tokens);
    if (prompts > 1) {
      throw usage_error(std::string("flags ") + (s.has_prompt ? "--prompt" : "--prompt-file") + " and " +
                        (s.has_prompt_tokens ? "--prompt-tokens" : "--prompt-file") +
                        " cannot be combined: give one of them");
    }
    if (prompts == 0) throw usage_error("missing required flag --prompt for '" + s.command + "'", help_text(*cmd));
    if (s.has_prompt_file && s.prompt_file.empty()) throw usage_error("flag --prompt-file needs a value");
  }
  if (s.command == "run" && seen.count("top-logprobs") && !s.json)
    throw usage_error("flag --top-logprobs needs --json");
  if (s.command == "run" || s.command == "serve") {
    try {
      engine::check_sampling(sampling_of(s));  // the settings' rules that need no model
    } catch (const engine::RequestError& e) {
      throw e.as_flags();
    }
    if (s.batch_size > kMaxBatchSize)
      throw usage_error("flag --batch-size must be at most " + std::to_string(kMaxBatchSize) + ", got " +
                        std::to_string(s.batch_size));
  }
  if (s.command == "inspect" && (!s.tensor.empty()) != (!s.out.empty()))
    throw usage_error(s.tensor.empty() ? "flag --out needs --tensor for 'inspect'"
                                       : "flag --tensor needs --out for 'inspect'");
  return s;
}

// --prompt-file: the file (or standard input) read whole, bytes as they are (invalid UTF-8 and NUL bytes are
// tokenized as --prompt's would be).
std::string read_prompt_file(const std::string& path, const std::string& flag) {
  constexpr size_t kMaxPromptFileBytes = size_t{64} << 20;
  const bool std_in = path == "-";
  const int fd = std_in ? STDIN_FILENO : ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  const std::string what = std_in ? flag + " - (standard input)" : flag + " " + path;
  if (fd < 0) throw Error("cannot read " + what + ": " + std::strerror(errno));
  std::string text;
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      if (!std_in) ::close(fd);
      throw Error("cannot read " + what + ": " + std::strerror(err));
    }
    if (n == 0) break;
    text.append(buf, static_cast<size_t>(n));
    if (text.size() > kMaxPromptFileBytes) {
      if (!std_in) ::close(fd);
      throw Error(what + " is larger than " + std::to_string(kMaxPromptFileBytes >> 20) + " MiB");
    }
  }
  if (!std_in) ::close(fd);
  return text;
}

int run_command(Settings s) {
  // --model: a path is used as it is; a Hugging Face id is looked up in the cache (downloaded when missing).
  if (s.has_prompt_file) s.prompt = read_prompt_file(s.prompt_file, "--prompt-file"), s.has_prompt = true;
  if ((s.command == "run" || s.command == "serve") && s.model.empty()) s.model = hub::default_model_id();
  if (!s.model.empty() &&
      (s.command == "run" || s.command == "serve" || s.command == "tokenize" || s.command == "logits"))
    s.model = hub::resolve_model(s.model);
  if (s.command == "run") return cmd_run(s);
  if (s.command == "serve") return cmd_serve(s);
  if (s.command == "tokenize") return cmd_tokenize(s);
  if (s.command == "inspect") return cmd_inspect(s);
  if (s.command == "logits") return cmd_logits(s);
  if (s.command == "synth") return cmd_synth(s);
  if (s.command == "doctor") return cmd_doctor(s);
  if (const Passthrough* p = find_passthrough(s.command)) return p->run(s.rest);
  throw Error("no handler for command '" + s.command + "'");
}

int main_entry(int argc, char** argv, std::string_view git_describe) {
  std::vector<std::string> args(argv + 1, argv + argc);
  try {
    std::string help;
    Settings s = parse_command_line(args, &help);
    if (!help.empty()) {
      std::cout << help;
      return 0;
    }
    if (s.command == "version") {
      std::cout << version_text(git_describe);
      return 0;
    }
    return run_command(s);
  } catch (const Error& e) {
    std::cout.flush();
    std::fprintf(stderr, "ERROR: %s\n", e.what());
    if (!e.hint().empty()) std::fprintf(stderr, "%s\n", e.hint().c_str());
    return e.exit_code();
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "ERROR: out of memory\n");
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ERROR: %s\n", e.what());
    return 1;
  }
}

}  // namespace dllm::cli
