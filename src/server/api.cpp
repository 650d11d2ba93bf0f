// Request bodies and response JSON of the OpenAI-compatible endpoints (api.h).
#include "server/api.h"

#include <cmath>
#include <limits>

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

std::string shown_json(const json& v) {
  // Containers by their size only: no walk into them (a value may nest as deep as the parse allowed).
  const std::string plural = v.size() == 1 ? "" : "s";
  if (v.is_array()) return v.empty() ? "[]" : "an array of " + std::to_string(v.size()) + " value" + plural;
  if (v.is_object()) return v.empty() ? "{}" : "an object of " + std::to_string(v.size()) + " field" + plural;
  if (v.is_string()) {
    const std::string& s = v.get_ref<const std::string&>();
    const json shown = s.size() > 37 ? s.substr(0, utf8_complete_prefix(std::string_view(s).substr(0, 34))) + "..." : s;
    return shown.dump(-1, ' ', false, json::error_handler_t::replace);
  }
  return v.dump(-1, ' ', false, json::error_handler_t::replace);  // a number, a boolean, null
}

namespace {

// A first pass over a body that builds nothing: it counts values and nesting and stops at the first bound
// passed (json's own parse callback is quadratic on long arrays, so the bounds are checked here).
struct BoundsCheck : nlohmann::json_sax<json> {
  int depth = 0;
  int64_t values = 0;
  bool too_deep = false, too_many = false;
  bool value() {
    too_many = ++values > kMaxJsonValues;
    return !too_many;
  }
  bool open() {
    too_deep = ++depth > kMaxJsonDepth;
    return !too_deep && value();
  }
  bool null() override { return value(); }
  bool boolean(bool) override { return value(); }
  bool number_integer(number_integer_t) override { return value(); }
  bool number_unsigned(number_unsigned_t) override { return value(); }
  bool number_float(number_float_t, const string_t&) override { return value(); }
  bool string(string_t&) override { return value(); }
  bool binary(binary_t&) override { return value(); }
  bool start_object(std::size_t) override { return open(); }
  bool key(string_t&) override { return true; }
  bool end_object() override { return --depth, true; }
  bool start_array(std::size_t) override { return open(); }
  bool end_array() override { return --depth, true; }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override { return false; }
};

}  // namespace

json parse_json_body(const std::string& body) {
  BoundsCheck bounds;
  json::sax_parse(body, &bounds, json::input_format_t::json, false);
  if (bounds.too_deep)
    throw ApiError(400, "the body nests JSON deeper than " + std::to_string(kMaxJsonDepth) + " levels",
                   "invalid_request_error", "", "invalid_json");
  if (bounds.too_many)
    throw ApiError(400, "the body has more than " + std::to_string(kMaxJsonValues) + " JSON values",
                   "invalid_request_error", "", "invalid_json");
  try {
    return json::parse(body);
  } catch (const json::exception& e) {
    // Syntax errors and numbers out of range (1e999): the parser's position, never its internals.
    std::string why = e.what();
    if (const size_t p = why.find("parse error"); p != std::string::npos) why = why.substr(p);
    else if (const size_t q = why.find("number overflow"); q != std::string::npos) why = why.substr(q);
    else why = "invalid JSON";
    throw ApiError(400, "the body is not valid JSON (" + sanitize_utf8(why.substr(0, 200)) + ")",
                   "invalid_request_error", "", "invalid_json");
  }
}

namespace {

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


// Fields that ask for what this server does not do: refused naming the field unless their value asks for nothing
// (null, or the neutral values some clients always send). True when key is one of them.
bool unsupported_field(const std::string& key, const json& v) {
  const auto number_is = [&](double x) { return v.is_number() && v.get<double>() == x; };
  bool neutral = false;
  const char* why = nullptr;
  if (key == "response_format") {
    neutral = v.is_object() && v.size() == 1 && v.value("type", json()) == "text";
    why = "answers are plain text (no JSON mode or schema)";
  } else if (key == "tools" || key == "functions") {
    neutral = v.is_array() && v.empty();
    why = "no tool or function calling";
  } else if (key == "tool_choice" || key == "function_call") {
    neutral = v == "none";
    why = "no tool or function calling";
  } else if (key == "parallel_tool_calls") {
    neutral = true;  // meaningless without tools
  } else if (key == "top_p" || key == "typical_p") {
    neutral = number_is(1.0);
    why = "the diffusion samplers have no nucleus sampling (temperature is supported)";
  } else if (key == "top_k" || key == "min_p") {
    neutral = number_is(0.0);  // 0: off
    why = "the diffusion samplers have no top-k / min-p truncation (temperature is supported)";
  } else if (key == "frequency_penalty" || key == "presence_penalty") {
    neutral = number_is(0.0);
    why = "the diffusion samplers have no repetition penalties";
  } else if (key == "repetition_penalty" || key == "repeat_penalty") {
    neutral = number_is(1.0);
    why = "the diffusion samplers have no repetition penalties";
  } else if (key == "logit_bias") {
    neutral = v.is_object() && v.empty();
    why = "the diffusion samplers take no logit bias";
  } else if (key == "best_of") {
    neutral = v == 1;
    why = "use n for several answers";
  } else if (key == "echo" || key == "suffix") {
    neutral = v == false || (v.is_string() && v.get_ref<const std::string&>().empty());
    why = "not implemented";
  } else if (key == "audio" || key == "modalities" || key == "prediction") {
    neutral = key == "modalities" && v == json::array({"text"});
    why = "this model reads and writes text only";
  } else {
    return false;
  }
  if (!v.is_null() && !neutral)
    throw ApiError(400, "'" + key + "' is not supported by this server: " + why, "invalid_request_error", key,
                   "unsupported_field");
  return true;
}

// /v1/completions' prompt: a string, an array of token ids (verbatim), or an array of either (one choice
// set per prompt).
std::vector<engine::Request> prompts_of(const json& v, const engine::Request& base, int64_t max_prompts) {
  auto one = [&](const json& p, const std::string& key) {
    engine::Request r = base;
    r.chat = false;
    if (p.is_string()) {
      r.prompt = p.get<std::string>();
    } else if (p.is_array() && !p.empty() && p[0].is_number_integer()) {
      std::vector<int64_t> ids;
      for (const json& id : p) ids.push_back(integer(key, id, 0, INT64_MAX));
      r.prompt_tokens = std::move(ids);
    } else {
      throw field_error(key, "needs a string or an array of token ids, got " + shown_json(p));
    }
    return r;
  };
  if (v.is_string() || (v.is_array() && !v.empty() && v[0].is_number_integer())) return {one(v, "prompt")};
  if (!v.is_array() || v.empty())
    throw field_error("prompt", "needs a string, an array of token ids or a non-empty array of those, got " +
                                    shown_json(v));
  if (static_cast<int64_t>(v.size()) > max_prompts)
    throw field_error("prompt", "takes at most " + std::to_string(max_prompts) + " prompts, got " +
                                    std::to_string(v.size()));
  std::vector<engine::Request> out;
  for (size_t i = 0; i < v.size(); ++i) out.push_back(one(v[i], "prompt[" + std::to_string(i) + "]"));
  return out;
}

}  // namespace

ApiRequest parse_request(const std::string& body, bool chat, const engine::Sampling& defaults,
                         const ApiLimits& limits) {
  const json obj = parse_json_body(body);
  if (!obj.is_object()) throw ApiError(400, "the body needs a JSON object, got " + shown_json(obj));
  ApiRequest r;
  r.chat = chat;
  engine::Request request;
  engine::Sampling& s = request.sampling;
  s = defaults;
  const json* prompt = nullptr;
  bool has_prompt = false;
  for (const auto& [key, v] : obj.items()) {
    if (unsupported_field(key, v)) {
      continue;
    } else if (key == "model") {
      r.model = string(key, v);
    } else if (key == "messages" && chat) {
      request.messages = messages_of(v);
      has_prompt = true;
    } else if (key == "prompt" && !chat) {
      prompt = &v;
      has_prompt = true;
    } else if (key == "logprobs") {
      if (v.is_null()) continue;
      if (chat) {
        r.logprobs = boolean(key, v);
      } else {  // completions: the number of alternatives (0..5)
        r.top_logprobs = integer(key, v, 0, 5);
        r.logprobs = true;
      }
    } else if (key == "top_logprobs") {
      if (!v.is_null()) r.top_logprobs = integer(key, v, 0, 20);
    } else if (key == "max_tokens" || key == "max_completion_tokens") {
      if (!v.is_null()) s.max_tokens = integer(key, v, 1, std::min<int64_t>(limits.max_tokens, engine::kMaxCanvasTokens));
    } else if (key == "temperature") {
      if (!v.is_null()) s.temperature = number(key, v, 0, 1e6), s.temperature_is_a_hint = true;
    } else if (key == "seed") {
      if (!v.is_null()) {
        if (!v.is_number_integer() || (!v.is_number_unsigned() && v.get<int64_t>() < 0))
          throw field_error(key, "needs an integer of at least 0, got " + shown_json(v));
        s.seed = v.get<uint64_t>();
        r.seed_given = true;
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
      if (!v.is_null()) r.n = integer(key, v, 1, limits.max_n);
    } else if (key == "user") {
      if (!v.is_null()) string(key, v);
    } else if (key == "steps") {
      s.steps = integer(key, v, 1, std::min<int64_t>(limits.max_steps, engine::kMaxCanvasTokens));
    } else if (key == "block_length") {
      s.block_length = integer(key, v, 1, engine::kMaxCanvasTokens);
      s.has_block_length = true;
    } else if (key == "remasking") {
      s.remasking = string(key, v);
      if (!model::parse_remasking(s.remasking))
        throw field_error(key, "must be one of low_confidence, random, entropy, maskgit_plus, topk_margin, got " +
                                   shown_json(v));
    } else if (key == "threshold") {
      s.threshold = number(key, v, 0, 1);
    } else if (key == "dual_cache") {
      s.dual_cache = boolean(key, v);
    } else if (key == "eb_max_steps") {
      s.eb.max_steps = integer(key, v, 1, limits.max_steps);
    } else if (key == "eb_stability") {
      s.eb.stability = integer(key, v, 0, 1000000);
    } else if (key == "self_cond_top_k") {
      s.eb.self_cond_top_k = integer(key, v, 0, model::kMaxSelfCondTopK);
    } else if (key == "eb_t_min" || key == "eb_t_max" || key == "eb_entropy_bound" || key == "eb_confidence") {
      const double x = number(key, v, 0, std::numeric_limits<double>::infinity());
      (key == "eb_t_min" ? s.eb.t_min : key == "eb_t_max" ? s.eb.t_max : key == "eb_entropy_bound" ? s.eb.entropy_bound : s.eb.confidence) = x;
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
  if (r.top_logprobs > 0 && !r.logprobs) throw field_error("top_logprobs", "needs logprobs: true");
  // The server's caps apply to the defaults too (serve's flags may ask more than its limits).
  if (s.max_tokens > limits.max_tokens)
    throw field_error("max_tokens", "must be at most " + std::to_string(limits.max_tokens) + " on this server");
  if (s.steps > limits.max_steps)
    throw field_error("steps", "must be at most " + std::to_string(limits.max_steps) + " on this server");
  try {
    engine::check_sampling(s);
  } catch (const engine::RequestError& e) {
    throw request_error(e, chat);
  }
  s.top_logprobs = r.logprobs ? static_cast<int>(r.top_logprobs) : -1;
  if (prompt) {
    r.requests = prompts_of(*prompt, request, limits.max_prompts);
  } else {
    r.requests = {request};
  }
  if (static_cast<int64_t>(r.requests.size()) * r.n > limits.max_n * limits.max_prompts)
    throw field_error("n", "times the prompts may be at most " + std::to_string(limits.max_n * limits.max_prompts));
  return r;
}

ApiError request_error(const engine::RequestError& e, bool chat) {
  const std::string msg = e.message([](std::string_view name) {
    if (name == "setting") return std::string("field");
    if (name == "settings") return std::string("fields");
    return "'" + std::string(name) + "'";
  });
  const std::string prompt_field = chat ? "messages" : "prompt";
  if (msg.find("context length") != std::string::npos)
    return ApiError(400, msg, "invalid_request_error", prompt_field, "context_length_exceeded");
  std::string key = e.key();
  if (key == "prompt_tokens" || key == "prompt" || key == "messages") key = prompt_field;
  return ApiError(400, msg, "invalid_request_error", key, "invalid_value");
}

std::vector<int32_t> tokens_for_text(const model::Tokenizer& tok, const std::vector<int32_t>& tokens,
                                     const std::string& text) {
  // The shortest prefix whose text reaches text's length (texts only grow with the prefix).
  model::DetokenizeOptions d;
  d.unparse_special = false;
  size_t lo = 0, hi = tokens.size();
  while (lo < hi) {
    const size_t mid = (lo + hi) / 2;
    const std::string t = sanitize_utf8(tok.detokenize(std::span<const int32_t>(tokens.data(), mid), d));
    if (t.size() >= text.size()) hi = mid;
    else lo = mid + 1;
  }
  return std::vector<int32_t>(tokens.begin(), tokens.begin() + static_cast<long>(lo));
}

json choice_logprobs(const model::Tokenizer& tok, const engine::Answer& a, size_t count, const ApiRequest& r) {
  if (!r.logprobs) return nullptr;
  // JSON has no -inf: a token the model gives no chance is -9999 (OpenAI's floor).
  auto value = [](double x) { return std::isfinite(x) ? x : -9999.0; };
  auto bytes = [](const std::string& s) {
    json b = json::array();
    for (unsigned char c : s) b.push_back(c);
    return b;
  };
  const size_t n = std::min(count, a.logprobs.size());
  if (r.chat) {
    json content = json::array();
    for (size_t i = 0; i < n; ++i) {
      const model::PositionLogprobs& p = a.logprobs[i];
      auto entry = [&](const model::TokenLogprob& t) {
        const std::string& piece = tok.token_piece(t.token);
        return json{{"token", sanitize_utf8(piece)}, {"logprob", value(t.logprob)}, {"bytes", bytes(piece)}};
      };
      json e = entry(p.chosen);
      json top = json::array();
      for (const model::TokenLogprob& t : p.top) top.push_back(entry(t));
      e["top_logprobs"] = std::move(top);
      content.push_back(std::move(e));
    }
    return {{"content", std::move(content)}, {"refusal", nullptr}};
  }
  json tokens = json::array(), logprobs = json::array(), top = json::array(), offsets = json::array();
  size_t offset = 0;
  for (size_t i = 0; i < n; ++i) {
    const model::PositionLogprobs& p = a.logprobs[i];
    const std::string piece = sanitize_utf8(tok.token_piece(p.chosen.token));
    tokens.push_back(piece);
    logprobs.push_back(value(p.chosen.logprob));
    offsets.push_back(offset);
    offset += piece.size();
    json alternatives = json::object();
    for (const model::TokenLogprob& t : p.top) alternatives[sanitize_utf8(tok.token_piece(t.token))] = value(t.logprob);
    top.push_back(std::move(alternatives));
  }
  return {{"tokens", std::move(tokens)}, {"token_logprobs", std::move(logprobs)}, {"top_logprobs", std::move(top)},
          {"text_offset", std::move(offsets)}};
}

TokenizeRequest parse_tokenize(const std::string& body) {
  const json obj = parse_json_body(body);
  if (!obj.is_object()) throw ApiError(400, "the body needs a JSON object, got " + shown_json(obj));
  TokenizeRequest t;
  bool has = false;
  for (const auto& [key, v] : obj.items()) {
    if (key == "content") {
      t.content = string(key, v);
      has = true;
    } else if (key == "add_special") {
      t.add_special = boolean(key, v);
    } else if (key == "parse_special") {
      t.parse_special = boolean(key, v);
    } else if (key == "with_pieces") {
      t.with_pieces = boolean(key, v);
    }
  }
  if (!has) throw ApiError(400, "'content' is required", "invalid_request_error", "content", "missing_field");
  return t;
}

std::vector<int32_t> parse_detokenize(const std::string& body, int64_t vocab_size) {
  const json obj = parse_json_body(body);
  if (!obj.is_object()) throw ApiError(400, "the body needs a JSON object, got " + shown_json(obj));
  if (!obj.contains("tokens")) throw ApiError(400, "'tokens' is required", "invalid_request_error", "tokens", "missing_field");
  const json& v = obj["tokens"];
  if (!v.is_array()) throw field_error("tokens", "needs an array of token ids, got " + shown_json(v));
  std::vector<int32_t> ids;
  for (const json& id : v) ids.push_back(static_cast<int32_t>(integer("tokens", id, 0, vocab_size - 1)));
  return ids;
}

json usage_json(int64_t prompt_tokens, int64_t completion_tokens, int64_t cached_tokens) {
  return {{"prompt_tokens", prompt_tokens},
          {"completion_tokens", completion_tokens},
          {"total_tokens", prompt_tokens + completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", cached_tokens}}}};
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
    } else {
      ch["text"] = c.text;
    }
    ch["logprobs"] = c.logprobs;
    ch["finish_reason"] = c.finish_reason;
    if (r.return_tokens) ch["dllm"] = {{"tokens", c.tokens}};
    list.push_back(std::move(ch));
  }
  out["choices"] = std::move(list);
  // The prompt is counted once (each choice's sequence encodes it; the first choice's cache hit is reported).
  out["usage"] = usage_json(prompt_tokens * static_cast<int64_t>(choices.size() > 0 ? 1 : 0), completion,
                            choices.empty() ? 0 : choices.front().cached_tokens);
  if (r.return_tokens) out["dllm"] = {{"prompt_tokens", prompt_ids}};
  return out;
}

json chunk_body(const ApiRequest& r, const std::string& id, int64_t created, const std::string& model, int choice,
                const std::string* text, bool first, const std::string& finish_reason, const ChoiceResult* final) {
  json ch = {{"index", choice}};
  if (r.chat) {
    json delta = json::object();
    if (first) delta["role"] = "assistant";
    if (text) delta["content"] = *text;
    ch["delta"] = std::move(delta);
  } else {
    ch["text"] = text ? *text : std::string();
  }
  ch["logprobs"] = final ? final->logprobs : json(nullptr);
  ch["finish_reason"] = finish_reason.empty() ? json(nullptr) : json(finish_reason);
  return {{"id", id},
          {"object", r.chat ? "chat.completion.chunk" : "text_completion"},
          {"created", created},
          {"model", model},
          {"choices", json::array({std::move(ch)})}};
}

}  // namespace dllm::server
