// A generation request in the engine's terms, the rules that need no model (check_sampling), and the
// error every request check throws: RequestError names the field at fault (max_tokens, prompt_tokens,
// ...) and keeps the message's setting names as placeholders, so that each front end names them its own
// way: the CLI as its flags (--max-tokens), a request file or a server as its keys ("max_tokens").
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.h"
#include "model/chat.h"

namespace dllm::engine {

// The largest max_tokens (16 Mi tokens, beyond any model's context): prompt + canvas sums stay far from overflow.
inline constexpr int64_t kMaxCanvasTokens = int64_t{1} << 24;

// DiffusionGemma's entropy-bound settings a request gives (unset: the file's diffusion.eb_* values).
struct EbSettings {
  std::optional<int64_t> max_steps, stability, self_cond_top_k;
  std::optional<double> t_min, t_max, entropy_bound, confidence;
  // The first given setting's field name ("eb_max_steps", ...), or "" when none is given.
  std::string first_given() const;
};

// The sampler's settings of one request (the run flags without dashes).
struct Sampling {
  int64_t max_tokens = 128;
  int64_t steps = 0;           // 0: max_tokens
  int64_t block_length = 32;   // LLaDA
  bool has_block_length = false;  // given by the request (DiffusionGemma refuses it)
  double temperature = 0;
  // The temperature is an OpenAI request's (serve): clients send one by habit, so a sampler with its own
  // temperatures (DiffusionGemma's schedule) ignores it instead of refusing the request.
  bool temperature_is_a_hint = false;
  std::string remasking;       // "": the architecture's default
  double threshold = 0;        // LLaDA; 0 = off
  bool dual_cache = false;     // LLaDA
  uint64_t seed = 42;
  bool full_logits = false;
  bool early_stop = true;
  int top_logprobs = -1;       // -1: no log-probabilities; 0..20: each answer token's, with that many
                               // alternatives (model::GenerateConfig::top_logprobs, Answer::logprobs)
  EbSettings eb;               // DiffusionGemma
};

struct Request {
  std::string prompt;                                // the user message (when no prompt_tokens)
  std::optional<std::vector<int64_t>> prompt_tokens; // ids used verbatim (no template)
  std::optional<std::string> system;                 // a system turn for the chat template
  std::vector<model::ChatMessage> messages;          // when not empty: the whole conversation through the
                                                     // chat template (prompt and system unused)
  bool chat = true;                                  // false: the text without the template
  Sampling sampling;
};

// A request the engine refuses. key(): the field at fault; text(): the message with settings as
// {field} placeholders and the word for a setting as {setting} / {settings} (model::check_settings's
// convention). what() renders the fields as they are named ("max_tokens"), for any front end that has
// no names of its own. Usage errors (exit 2) unless kind says otherwise.
class RequestError : public Error {
 public:
  RequestError(std::string key, std::string text, Kind kind = kUsage);
  const std::string& key() const { return key_; }
  const std::string& text() const { return text_; }
  // The message with every placeholder named by name_of (model::name_settings).
  std::string message(const std::function<std::string(std::string_view)>& name_of) const;
  // The same error with the CLI's flag names, as dllm::Error of the same kind.
  Error as_flags() const;

 private:
  std::string key_, text_;
};

// The field names as they are: {setting} -> "setting", {max_tokens} -> "max_tokens".
std::string plain_name(std::string_view name);

// The rules among the sampler's settings that need no model: max_tokens within kMaxCanvasTokens, steps at
// most max_tokens (every step commits at least one token), dual_cache without full_logits. Throws
// RequestError.
void check_sampling(const Sampling& s);

}  // namespace dllm::engine
