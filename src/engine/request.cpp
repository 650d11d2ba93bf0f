// Requests and their errors (request.h).
#include "engine/request.h"

#include "model/generate.h"

namespace dllm::engine {

RequestError::RequestError(std::string key, std::string text, Kind kind)
    : Error(model::name_settings(text, plain_name), kind), key_(std::move(key)), text_(std::move(text)) {}

std::string RequestError::message(const std::function<std::string(std::string_view)>& name_of) const {
  return model::name_settings(text_, name_of);
}

Error RequestError::as_flags() const { return Error(message(model::flag_name), kind()); }

std::string plain_name(std::string_view name) { return std::string(name); }

std::string EbSettings::first_given() const {
  if (max_steps) return "eb_max_steps";
  if (t_min) return "eb_t_min";
  if (t_max) return "eb_t_max";
  if (entropy_bound) return "eb_entropy_bound";
  if (stability) return "eb_stability";
  if (confidence) return "eb_confidence";
  if (self_cond_top_k) return "self_cond_top_k";
  return {};
}

void check_sampling(const Sampling& s) {
  if (s.dual_cache && s.full_logits)
    throw RequestError("dual_cache", "{settings} {dual_cache} and {full_logits} cannot be combined");
  // A bound that keeps the canvas arithmetic (prompt + max_tokens) far from overflow.
  if (s.max_tokens > kMaxCanvasTokens) {
    throw RequestError("max_tokens", "{setting} {max_tokens} must be at most " + std::to_string(kMaxCanvasTokens) +
                                         ", got " + std::to_string(s.max_tokens));
  }
  // Every step commits at least one token: more steps than tokens would only loop (for ever, near 2^63).
  if (s.steps > s.max_tokens) {
    throw RequestError("steps", "{setting} {steps} must be at most {max_tokens} " + std::to_string(s.max_tokens) +
                                    ", got " + std::to_string(s.steps) + " (every step commits at least one token)");
  }
}

}  // namespace dllm::engine
