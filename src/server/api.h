// The OpenAI-compatible wire format: request bodies of /v1/chat/completions and /v1/completions read into
// the engine's requests (every known field checked; fields asking for what this server does not do, such
// as tools or top_p, refused naming the field; other unknown fields ignored as OpenAI clients expect), the
// bodies of /tokenize and /detokenize, and the JSON of answers, stream chunks and errors
// ({"error": {"message", "type", "param", "code"}}). Bodies are parsed with bounded nesting and a bounded
// number of values, so that no body costs much more memory than its size or any stack.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/engine.h"

namespace dllm::server {

using json = nlohmann::ordered_json;

// An error answered with an HTTP status and OpenAI's error body.
struct ApiError : std::runtime_error {
  ApiError(int status, std::string message, std::string type = "invalid_request_error", std::string param = "",
           std::string code = "");
  int status;
  std::string type, param, code;
};
json error_body(const ApiError& e);

// A JSON body with nesting deeper than this, or more values than kMaxJsonValues, is refused (400).
inline constexpr int kMaxJsonDepth = 32;
inline constexpr int64_t kMaxJsonValues = 1 << 18;

// The server's caps on what one request may ask (serve's --max-tokens-limit, --max-steps-limit, --max-n).
struct ApiLimits {
  int64_t max_tokens = 4096;
  int64_t max_steps = 4096;
  int64_t max_n = 16;       // choices of one request
  int64_t max_prompts = 16; // prompts of one /v1/completions request (each gets n choices)
};

// Parses a JSON body within kMaxJsonDepth and kMaxJsonValues; ApiError 400 otherwise.
json parse_json_body(const std::string& body);
// A value as error messages show it: bounded in length, never recursive ("an array of 3 values").
std::string shown_json(const json& v);

struct ApiRequest {
  bool chat = true;          // /v1/chat/completions (messages) or /v1/completions (prompt)
  // The server's defaults with the body's fields applied: one request per prompt (chat: one).
  std::vector<engine::Request> requests;
  bool seed_given = false;   // without a seed every request gets a fresh one
  bool logprobs = false;     // the answer tokens' log-probabilities
  int64_t top_logprobs = 0;  // and that many alternatives for each
  int64_t n = 1;
  bool stream = false, include_usage = false, include_canvas = false;
  bool return_tokens = false;  // extension: the ids of the prompt and of each answer in the response
  std::vector<std::string> stop;
  std::string model;         // as given ("" when absent)
};

// Parses and checks a body. defaults: the server's generation flags. Throws ApiError (400, naming the field
// in param) for a body that is not a JSON object, a missing prompt / messages, or a bad value of a known field.
ApiRequest parse_request(const std::string& body, bool chat, const engine::Sampling& defaults,
                         const ApiLimits& limits = {});

// The engine's refusal of a request as an ApiError: 400 naming the field; a prompt that does not fit in the
// model's context with the answer is context_length_exceeded naming messages (chat) or prompt.
ApiError request_error(const engine::RequestError& e, bool chat);

// One choice's result as the response tells it.
struct ChoiceResult {
  std::string text;
  std::string finish_reason;  // "stop" or "length"
  std::vector<int32_t> tokens;  // up to the stop (string or token)
  json logprobs;                // null unless asked for
  int64_t cached_tokens = 0;    // prompt tokens taken from the prefix cache (DiffusionGemma), not encoded
};

// The first tokens whose text covers `text` (an answer cut at a stop string): what completion_tokens
// counts. All of them when text is their whole text.
std::vector<int32_t> tokens_for_text(const model::Tokenizer& tok, const std::vector<int32_t>& tokens,
                                     const std::string& text);
// The logprobs of a choice's first `count` answer tokens in OpenAI's form (chat: {"content": [{token,
// logprob, bytes, top_logprobs}]}; completions: {tokens, token_logprobs, top_logprobs, text_offset}); null
// when the request did not ask.
json choice_logprobs(const model::Tokenizer& tok, const engine::Answer& a, size_t count, const ApiRequest& r);

// POST /tokenize: {"content": TEXT, "add_special": bool, "parse_special": bool, "with_pieces": bool}.
struct TokenizeRequest {
  std::string content;
  bool add_special = false, parse_special = true, with_pieces = false;
};
TokenizeRequest parse_tokenize(const std::string& body);
// POST /detokenize: {"tokens": [ids]}; ids outside the vocabulary are refused naming "tokens".
std::vector<int32_t> parse_detokenize(const std::string& body, int64_t vocab_size);

// A whole (not streamed) response.
json completion_body(const ApiRequest& r, const std::string& id, int64_t created, const std::string& model,
                     const std::vector<ChoiceResult>& choices, int64_t prompt_tokens,
                     const std::vector<int32_t>& prompt_ids);
// usage: {"prompt_tokens", "completion_tokens", "total_tokens"}.
// usage, with prompt_tokens_details.cached_tokens (the prompt tokens a prefix cache held, OpenAI's field).
json usage_json(int64_t prompt_tokens, int64_t completion_tokens, int64_t cached_tokens);
// A stream chunk of one choice: delta text (chat: delta.content, the first chunk with role; completions:
// text) and finish_reason (null when empty).
// final: the choice's result on its last chunk (its logprobs go there).
json chunk_body(const ApiRequest& r, const std::string& id, int64_t created, const std::string& model, int choice,
                const std::string* text, bool first, const std::string& finish_reason,
                const ChoiceResult* final = nullptr);

}  // namespace dllm::server
