// Every command's effective settings in one struct. args.cpp fills it from argv in one function
// (parse_command_line); the commands read only this struct.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/request.h"

namespace dllm::cli {

// The largest --max-tokens (the engine's bound: prompt + canvas sums stay far from overflow).
inline constexpr int64_t kMaxCanvasTokens = engine::kMaxCanvasTokens;
// The largest --batch-size.
inline constexpr int64_t kMaxBatchSize = 1024;

struct Settings {
  std::string command;  // run, tokenize, inspect, logits, ...

  // model / input
  std::string model;                  // --model (path or owner/repo[:QUANT])
  std::string prompt;                 // --prompt, or the contents of --prompt-file
  bool has_prompt = false;
  std::string prompt_file;            // --prompt-file ("-": standard input), read by run_command
  bool has_prompt_file = false;
  std::string messages_file;          // tokenize --messages (a JSON array of messages; "-": standard input)
  bool has_messages = false;
  std::vector<int64_t> prompt_tokens; // --prompt-tokens (run)
  bool has_prompt_tokens = false;
  bool no_chat = false;               // --no-chat
  bool dense = false;                 // synth --dense
  std::string prompts_file;           // --prompts-file (JSON Lines of requests; "-": standard input)
  bool has_prompts_file = false;
  int64_t batch_size = 8;             // --batch-size: requests in flight at once (--prompts-file, serve)

  // generation (run)
  int64_t max_tokens = 128;           // --max-tokens (at most kMaxCanvasTokens)
  int64_t steps = 0;                  // --steps; 0 = not given (defaults to max_tokens)
  int64_t block_length = 32;          // --block-length
  bool has_block_length = false;      // given explicitly (Dream's --verbose notes that it ignores it)
  double temperature = 0.0;           // --temperature
  std::string remasking;              // --remasking; "" = the architecture's default
  double threshold = 0.0;             // --threshold (0 = off)
  bool dual_cache = false;            // --dual-cache
  uint64_t seed = 42;                 // --seed
  bool full_logits = false;           // --full-logits
  bool no_early_stop = false;         // --no-early-stop
  // DiffusionGemma's entropy-bound sampler (--eb-*; unset: the file's diffusion.eb_* values)
  std::optional<int64_t> eb_max_steps, eb_stability, self_cond_top_k;
  std::optional<double> eb_t_min, eb_t_max, eb_entropy_bound, eb_confidence;

  // execution
  int64_t threads = 0;                // --threads; 0 = all logical CPUs
  std::string device = "auto";        // --device (auto: a usable GPU, else the CPU)

  // serve
  std::string host = "127.0.0.1";     // --host
  int64_t port = 8080;                // --port (0: any free port)
  std::string api_key;                // --api-key
  int64_t max_queue = 64;             // --max-queue
  int64_t prefix_cache_mib = 512;     // --prefix-cache-mib
  int64_t shutdown_grace_s = 10;      // --shutdown-grace
  int64_t max_tokens_limit = 4096;    // --max-tokens-limit
  int64_t max_steps_limit = 4096;     // --max-steps-limit
  int64_t max_n = 16;                 // --max-n
  int64_t max_connections = 512;      // --max-connections
  std::vector<std::string> cors_origins;  // --cors-origin
  std::vector<std::string> allow_hosts;   // --allow-host

  // output
  bool visual = false;                // --visual
  bool verbose = false;               // --verbose
  bool dump_step_stats = false;       // --dump-step-stats
  bool json = false;                  // --json
  int64_t top_logprobs = -1;          // --top-logprobs (-1: off)

  // logits
  std::vector<int64_t> tokens;        // --tokens
  std::vector<int64_t> rows;          // --rows
  bool no_prompt_cache = false;       // --no-prompt-cache (logits, diffusion-gemma)
  std::string self_cond_file;         // --self-cond FILE (logits, diffusion-gemma)
  double self_cond_temperature = 1;   // --self-cond-temperature
  bool has_self_cond_temperature = false;
  std::string out;                    // --out

  // inspect
  std::string path;                   // positional PATH
  std::string tensor;                 // --tensor NAME

  // commands that parse their own flags (bench, kernels, pull): the words after the command name
  std::vector<std::string> rest;

  // synth
  std::string arch;                   // --arch llada|dream
  int64_t layers = 0;                 // --layers; 0 = the real model's count
  std::string quant = "Q4_K_M";       // --quant Q4_K_M|Q8_0
};

}  // namespace dllm::cli
