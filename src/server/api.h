// The OpenAI-compatible wire format: request bodies of /v1/chat/completions and /v1/completions read into
// the engine's requests (every known field checked, unknown fields ignored as OpenAI clients expect), and
// the JSON of answers, stream chunks and errors ({"error": {"message", "type", "param", "code"}}).
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

// The largest n (sequences of one request).
inline constexpr int64_t kMaxChoices = 16;

struct ApiRequest {
  bool chat = true;          // /v1/chat/completions (messages) or /v1/completions (prompt)
  engine::Request request;   // the server's defaults with the body's fields applied
  int64_t n = 1;
  bool stream = false, include_usage = false, include_canvas = false;
  bool return_tokens = false;  // extension: the ids of the prompt and of each answer in the response
  std::vector<std::string> stop;
  std::string model;         // as given ("" when absent)
};

// Parses and checks a body. defaults: the server's generation flags. Throws ApiError (400, naming the field
// in param) for a body that is not a JSON object, a missing prompt / messages, or a bad value of a known field.
ApiRequest parse_request(const std::string& body, bool chat, const engine::Sampling& defaults);

// The engine's refusal of a request as an ApiError: 400 naming the field, 413 when the prompt and the canvas
// do not fit in the model's context.
ApiError request_error(const engine::RequestError& e);

// One choice's result as the response tells it.
struct ChoiceResult {
  std::string text;
  std::string finish_reason;  // "stop" or "length"
  std::vector<int32_t> tokens;
};

// A whole (not streamed) response.
json completion_body(const ApiRequest& r, const std::string& id, int64_t created, const std::string& model,
                     const std::vector<ChoiceResult>& choices, int64_t prompt_tokens,
                     const std::vector<int32_t>& prompt_ids);
// usage: {"prompt_tokens", "completion_tokens", "total_tokens"}.
json usage_json(int64_t prompt_tokens, int64_t completion_tokens);
// A stream chunk of one choice: delta text (chat: delta.content, the first chunk with role; completions:
// text) and finish_reason (null when empty).
json chunk_body(const ApiRequest& r, const std::string& id, int64_t created, const std::string& model, int choice,
                const std::string* text, bool first, const std::string& finish_reason);

}  // namespace dllm::server
