// Request bodies and response JSON of the OpenAI-compatible endpoints (api.h).
#include "server/api.h"

#include <cmath>

#include "common/printable.h"
#include "model/generate.h"

namespace dllm::server {

ApiError::ApiError(int status_, std::string message, std::string type_, std::string param_, std::string code_)
    : std::runtime_error(std::move(message)),
      status(status_),
      type(std::move(type_)),
      param(std::move(param_)),
      code(std::move(code_)) {}

json error_body(const ApiError& e) {
  return {{"error",
           {{"message", sanitize_utf8(e.what())},
            {"type", e.type},
            {"param", e.param.empty() ? json(nullptr) : json(e.param)},
            {"code", e.code.empty() ? json(nullptr) : json(e.code)}}}};
}

namespace {

std::string shown_json(const json& v) {
  std::string s = v.dump(-1, ' ', false, json::error_handler_t::replace);
  return s.size() > 40 ? s.substr(0, 37) + "..." : s;
}

ApiError field_error(const std::string& field, const std::string& what) {
  return ApiError(400, "'" + field + "' " + what, "invalid_request_error", field, "invalid_value");
}

int64_t integer(const std::string& key, const json& v, int64_t min, int64_t max) {
  if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX)))
    throw field_error(key, "needs an integer, got " + shown_json(v));
  const int64_t x = v.get<int64_t>();
  if (x < min) throw field_error(key, "must be at least " + std::to_string(min) + ", got " + std::to_string(x));
  if (x > max) throw field_error(key, "must be at most " + std::to_string(max) + ", got " + std::to_string(x));
  return x;
}

double number(const std::string& key, const json& v, double lo, double hi) {
  if (!v.is_number() || !std::isfinite(v.get<double>())) throw field_error(key, "needs a number, got " + shown_json(v));
  const double x = v.get<double>();
  if (x < lo || x > hi) {
    char buf[160];
    std::snprintf(buf, sizeof buf, "must be between %g and %g, got %g", lo, hi, x);
    throw field_error(key, buf);
  }
  return x;
}

bool boolean(const std::string& key, const json& v) {
  if (!v.is_boolean()) throw field_error(key, "needs true or false, got " + shown_json(v));
  return v.get<bool>();
}

std::string string(const std::string& key, const json& v) {
  if (!v.is_string()) throw field_error(key, "needs a string, got " + shown_json(v));
  return v.get<std::string>();
}

// A message's content: a string, or an array of {"type": "text", "text": ...} parts (joined).
std::string content_of(const std::string& key, const json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_null()) return "";
  if (!v.is_array()) throw field_error(key, "needs a string or an array of text parts, got " + shown_json(v));
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) {
    const json& part = v[i];
    const std::string pk = key + "[" + std::to_string(i) + "]";
    if (!part.is_object() || part.value("type", json()) != "text" || !part.contains("text"))
      throw field_error(pk, "needs a text part {\"type\": \"text\", \"text\": ...} (this model reads text only)");
    out += string(pk + ".text", part["text"]);
  }
  return out;
}

std::vector<model::ChatMessage> messages_of(const json& v) {
  if (!v.is_array() || v.empty()) throw field_error("messages", "needs a non-empty array of messages");
  std::vector<model::ChatMessage> out;
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string key = "messages[" + std::to_string(i) + "]";
    const json& m = v[i];
    if (!m.is_object()) throw field_error(key, "needs an object {\"role\", \"content\"}, got " + shown_json(m));
    if (!m.contains("role")) throw field_error(key + ".role", "is missing");
    std::string role = string(key + ".role", m["role"]);
    if (role == "developer") role = "system";  // OpenAI's newer name for the system turn
    if (role != "system" && role != "user" && role != "assistant")
      throw field_error(key + ".role", "must be system, user or assistant, got " + shown_json(m["role"]));
    if (!m.contains("content")) throw field_error(key + ".content", "is missing");
    out.push_back({role, content_of(key + ".content", m["content"])});
  }
  return out;
}

}  // namespace

ApiRequest parse_request(const std::string& body, bool chat, const engine::Sampling& defaults) {
  json obj;
  try {
    obj = json::parse(body);
  } catch (const json::parse_error& e) {
    std::string why = e.what();
    if (const size_t p = why.find("parse error"); p != std::string::npos) why = why.substr(p);
    throw ApiError(400, "the body is not valid JSON (" + why + ")");
  }
  if (!obj.is_object()) throw ApiError(400, "the body needs a JSON object, got " + shown_json(obj));
  ApiRequest r;
  r.chat = chat;
  engine::Sampling& s = r.request.sampling;
  s = defaults;
  bool has_prompt = false;
  for (const auto& [key, v] : obj.items()) {
    if (key == "model") {
      r.model = string(key, v);
    } else if (key == "messages" && chat) {
      r.request.messages = messages_of(v);
      has_prompt = true;
    } else if (key == "prompt" && !chat) {
      // A string, an array of one string, or an array of token ids (used verbatim).
      if (v.is_string()) {
        r.request.prompt = v.get<std::string>();
      } else if (v.is_array() && v.size() == 1 && v[0].is_string()) {
        r.request.prompt = v[0].get<std::string>();
      } else if (v.is_array() && !v.empty() && v[0].is_number_integer()) {
        std::vector<int64_t> ids;
        for (const json& id : v) ids.push_back(integer("prompt", id, 0, INT64_MAX));
        r.request.prompt_tokens = std::move(ids);
      } else {
        throw field_error(key, "needs a string, an array of one string or an array of token ids, got " + shown_json(v));
      }
      r.request.chat = false;
      has_prompt = true;
    } else if (key == "max_tokens" || key == "max_completion_tokens") {
      if (!v.is_null()) s.max_tokens = integer(key, v, 1, engine::kMaxCanvasTokens);
    } else if (key == "temperature") {
      if (!v.is_null()) s.temperature = number(key, v, 0, 1e6);
    } else if (key == "seed") {
      if (!v.is_null()) {
        if (!v.is_number_integer() || (!v.is_number_unsigned() && v.get<int64_t>() < 0))
          throw field_error(key, "needs an integer of at least 0, got " + shown_json(v));
        s.seed = v.get<uint64_t>();
      }
    } else if (key == "stop") {
      if (v.is_string()) {
        r.stop = {v.get<std::string>()};
      } else if (v.is_array()) {
        if (v.size() > 4) throw field_error(key, "takes at most 4 strings");
        for (const json& x : v) r.stop.push_back(string(key, x));
      } else if (!v.is_null()) {
        throw field_error(key, "needs a string or an array of strings, got " + shown_json(v));
      }
      for (const std::string& x : r.stop)
        if (x.empty()) throw field_error(key, "needs non-empty strings");
    } else if (key == "stream") {
      if (!v.is_null()) r.stream = boolean(key, v);
    } else if (key == "stream_options") {
      if (v.is_null()) continue;
      if (!v.is_object()) throw field_error(key, "needs an object, got " + shown_json(v));
      if (v.contains("include_usage")) r.include_usage = boolean("stream_options.include_usage", v["include_usage"]);
      if (v.contains("include_canvas"))
        r.include_canvas = boolean("stream_options.include_canvas", v["include_canvas"]);
    } else if (key == "n") {
      if (!v.is_null()) r.n = integer(key, v, 1, kMaxChoices);
    } else if (key == "user") {
      if (!v.is_null()) string(key, v);
    } else if (key == "steps") {
      s.steps = integer(key, v, 1, engine::kMaxCanvasTokens);
    } else if (key == "block_length") {
      s.block_length = integer(key, v, 1, engine::kMaxCanvasTokens);
    } else if (key == "remasking") {
      s.remasking = string(key, v);
      if (!model::parse_remasking(s.remasking))
        throw field_error(key, "must be one of low_confidence, random, entropy, maskgit_plus, topk_margin, got " +
                                   shown_json(v));
    } else if (key == "threshold") {
      s.threshold = number(key, v, 0, 1);
    } else if (key == "dual_cache") {
      s.dual_cache = boolean(key, v);
    } else if (key == "return_tokens") {
      r.return_tokens = boolean(key, v);
    }
    // Anything else (top_p, logprobs, tools, ...) is ignored, as OpenAI clients expect.
  }
  if (!has_prompt) {
    const char* need = chat ? "messages" : "prompt";
    throw ApiError(400, std::string("'") + need + "' is required", "invalid_request_error", need, "missing_field");
  }
  if (r.include_canvas && !r.stream) r.include_canvas = false;
  try {
    engine::check_sampling(s);
  } catch (const engine::RequestError& e) {
    throw request_error(e);
  }
  return r;
}

ApiError request_error(const engine::RequestError& e) {
  const std::string msg = e.message([](std::string_view name) {
    if (name == "setting") return std::string("field");
    if (name == "settings") return std::string("fields");
    return "'" + std::string(name) + "'";
  });
  if (msg.find("context length") != std::string::npos)
    return ApiError(413, msg, "invalid_request_error", e.key(), "context_length_exceeded");
  return ApiError(e.kind() == Error::kUsage ? 400 : 400, msg, "invalid_request_error", e.key(), "invalid_value");
}

json usage_json(int64_t prompt_tokens, int64_t completion_tokens) {
  return {{"prompt_tokens", prompt_tokens},
          {"completion_tokens", completion_tokens},
          {"total_tokens", prompt_tokens + completion_tokens}};
}

json completion_body(const ApiRequest& r, const std::string& id, int64_t created, const std::string& model,
                     const std::vector<ChoiceResult>& choices, int64_t prompt_tokens,
                     const std::vector<int32_t>& prompt_ids) {
  json out = {{"id", id}, {"object", r.chat ? "chat.completion" : "text_completion"}, {"created", created},
              {"model", model}};
  json list = json::array();
  int64_t completion = 0;
  for (size_t i = 0; i < choices.size(); ++i) {
    const ChoiceResult& c = choices[i];
    completion += static_cast<int64_t>(c.tokens.size());
    json ch = {{"index", i}};
    if (r.chat) {
      ch["message"] = {{"role", "assistant"}, {"content", c.text}};
      ch["logprobs"] = nullptr;
    } else {
      ch["text"] = c.text;
      ch["logprobs"] = nullptr;
    }
    ch["finish_reason"] = c.finish_reason;
    if (r.return_tokens) ch["dllm"] = {{"tokens", c.tokens}};
    list.push_back(std::move(ch));
  }
  out["choices"] = std::move(list);
  out["usage"] = usage_json(prompt_tokens * static_cast<int64_t>(choices.size() > 0 ? 1 : 0), completion);
  if (r.return_tokens) out["dllm"] = {{"prompt_tokens", prompt_ids}};
  return out;
}

json chunk_body(const ApiRequest& r, const std::string& id, int64_t created, const std::string& model, int choice,
                const std::string* text, bool first, const std::string& finish_reason) {
  json ch = {{"index", choice}};
  if (r.chat) {
    json delta = json::object();
    if (first) delta["role"] = "assistant";
    if (text) delta["content"] = *text;
    ch["delta"] = std::move(delta);
  } else {
    ch["text"] = text ? *text : std::string();
  }
  ch["logprobs"] = nullptr;
  ch["finish_reason"] = finish_reason.empty() ? json(nullptr) : json(finish_reason);
  return {{"id", id},
          {"object", r.chat ? "chat.completion.chunk" : "text_completion"},
          {"created", created},
          {"model", model},
          {"choices", json::array({std::move(ch)})}};
}

}  // namespace dllm::server
