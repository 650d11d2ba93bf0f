// The application side of `dllm serve` (server.h): routes, the key, the origin and host checks, CORS,
// the per-request wait on the scheduler's events (streamed as Server-Sent Events or answered whole), the
// tokenizer endpoints, /props, and the orderly stop. The transport (limits, deadlines, framing) is http.h.
#include "server/server.h"

#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <memory>
#include <random>
#include <thread>

#include "common/error.h"
#include "common/printable.h"
#include "server/api.h"
#include "server/http.h"
#include "server/metrics.h"
#include "server/scheduler.h"
#include "server/stream.h"
#include "common/utf8.h"

namespace dllm::server {

namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kPoll = std::chrono::milliseconds(20);  // how often a waiting handler looks at its client

// A sequence that ended on the model's error (GenerateResult::error: no finite logit to commit).
ApiError model_error(const std::string& what) { return ApiError(500, what, "server_error", "", "model_error"); }
ApiError shutting_down() {
  return ApiError(503, "the server is shutting down: the request was cancelled", "server_error", "", "shutting_down");
}

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }
std::string sse(const json& j) { return "data: " + dump(j) + "\n\n"; }

void send_json(HttpExchange& x, int status, const json& j, HttpHeaders h = {}) {
  h.emplace_back("Content-Type", "application/json");
  x.respond(status, h, dump(j));
}
void send_error(HttpExchange& x, const ApiError& e, HttpHeaders h = {}) {
  if (e.status == 429 || e.status == 503) h.emplace_back("Retry-After", "1");
  send_json(x, e.status, error_body(e), std::move(h));
}

// The host part of a Host header or an origin's authority: "[::1]:8080" -> "::1", "localhost:80" -> "localhost".
std::string host_name(std::string h) {
  if (const size_t scheme = h.find("://"); scheme != std::string::npos) h = h.substr(scheme + 3);
  if (!h.empty() && h[0] == '[') {
    const size_t close = h.find(']');
    return ascii_lower(close == std::string::npos ? h : h.substr(1, close - 1));
  }
  if (const size_t colon = h.find(':'); colon != std::string::npos) h = h.substr(0, colon);
  if (const size_t slash = h.find('/'); slash != std::string::npos) h = h.substr(0, slash);
  return ascii_lower(h);
}

bool loopback_name(const std::string& h) {
  return h == "localhost" || h == "::1" || h.rfind("127.", 0) == 0 || h.ends_with(".localhost");
}

// The endpoints: method and path. "" when none; "*" marks a path that exists under another method.
struct Route {
  const char* method;
  const char* path;
  bool open;  // served without the key
};
constexpr Route kRoutes[] = {
    {"GET", "/", true},          {"GET", "/health", true},
    {"GET", "/metrics", true},   {"GET", "/v1/models", false},
    {"GET", "/props", false},    {"POST", "/v1/chat/completions", false},
    {"POST", "/v1/completions", false}, {"POST", "/tokenize", false},
    {"POST", "/detokenize", false},
};
constexpr const char* kModelPrefix = "/v1/models/";

// What one request's handler keeps while it waits: its parsed body, its sequences' stream, and per choice
// the streamed text and how it ended.
struct Exchange {
  ApiRequest api;
  std::shared_ptr<Stream> stream;
  std::string id, model;
  int64_t created = 0;
  int64_t prompt_tokens = 0;
  std::vector<int32_t> prompt_ids;
  std::vector<TextStream> texts;
  std::vector<ChoiceResult> results;
  std::vector<bool> done;
  std::vector<bool> first;
  int finished = 0;
  bool cancelled = false;  // some sequence was cancelled by the server's stop
  std::string error;       // some sequence ended on the model's error (GenerateResult::error)
};

class Server {
 public:
  Server(engine::Engine& engine, const ServerOptions& o)
      : engine_(engine), o_(o),
        scheduler_(engine, o.batch_size, o.max_queue, metrics_, static_cast<uint64_t>(o.prefix_cache_mib) << 20) {
    loopback_ = loopback_name(ascii_lower(o.host));  // the bind address as given: 127.0.0.1, ::1, localhost
  }

  int run();

 private:
  HttpServer::Early early(const HttpRequest& req) const;
  HttpHeaders cors(const HttpRequest& req) const;
  void handle(const HttpRequest& req, HttpExchange& x);
  void generate(const HttpRequest& req, HttpExchange& out, bool chat);
  void answer_whole(Exchange& x, HttpExchange& out, const HttpHeaders& h);
  bool stream_events(Exchange& x, HttpExchange& out);
  void tokenize(const HttpRequest& req, HttpExchange& out);
  void detokenize(const HttpRequest& req, HttpExchange& out);
  json props() const;
  json model_json() const { return {{"id", o_.model_id}, {"object", "model"}, {"created", 0}, {"owned_by", "dllm"}}; }
  std::string text_of(std::span<const int32_t> ids, bool special = false) const;
  json canvas_json(const std::vector<int32_t>& canvas) const;
  // A Done event into the choice's result; returns the text not yet streamed.
  std::string finish_choice(Exchange& x, StreamEvent& ev);
  bool origin_allowed(const std::string& origin) const;
  // DiffusionGemma: a uniform-state canvas and the entropy-bound sampler's settings.
  bool uniform_state() const {
    return model::arch_spec(engine_.hparams().arch).sampler == model::SamplerKind::EntropyBound;
  }

  engine::Engine& engine_;
  ServerOptions o_;
  Metrics metrics_;
  Scheduler scheduler_;
  std::atomic<bool> stopping_{false};
  std::atomic<int64_t> next_id_{0};
  bool loopback_ = true;
};

std::string Server::text_of(std::span<const int32_t> ids, bool special) const {
  model::DetokenizeOptions d;
  d.unparse_special = special;
  return engine_.tokenizer().detokenize(ids, d);
}

// The generated part as the page draws it: null for a position not committed yet, else its text (a
// committed mask token drawn by its name).
json Server::canvas_json(const std::vector<int32_t>& canvas) const {
  json out = json::array();
  const int32_t mask = engine_.hparams().mask_token_id;
  for (int32_t id : canvas) {
    if (id < 0) {
      out.push_back(nullptr);
    } else {
      const int32_t one[1] = {id};
      out.push_back(sanitize_utf8(text_of(one, id == mask)));
    }
  }
  return out;
}

std::string Server::finish_choice(Exchange& x, StreamEvent& ev) {
  const int c = ev.choice;
  engine::Answer& a = *ev.answer;
  if (a.result.cancelled) x.cancelled = true;
  if (!a.result.error.empty() && x.error.empty()) x.error = a.result.error;
  ChoiceResult& r = x.results[static_cast<size_t>(c)];
  r.cached_tokens = a.result.cached_prompt_tokens;
  if (x.done[static_cast<size_t>(c)]) {  // ended by a stop string already: its tokens up to the stop
    r.tokens = tokens_for_text(engine_.tokenizer(), a.tokens, r.text);
    return "";
  }
  bool ended = false;
  committed_answer(a.result.generated(), engine_.hparams().mask_token_id, engine_.stops(), &ended);
  TextStream& t = x.texts[static_cast<size_t>(c)];
  const std::string rest = t.finish(a.text);
  r.text = t.shown();
  r.tokens = t.stopped() ? tokens_for_text(engine_.tokenizer(), a.tokens, r.text) : a.tokens;
  r.logprobs = choice_logprobs(engine_.tokenizer(), a, r.tokens.size(), x.api);
  r.finish_reason = ended || t.stopped() ? "stop" : "length";
  r.cached_tokens = a.result.cached_prompt_tokens;
  x.done[static_cast<size_t>(c)] = true;
  ++x.finished;
  return rest;
}

void Server::answer_whole(Exchange& x, HttpExchange& out, const HttpHeaders& h) {
  const int n = x.stream->choices();
  while (x.finished < n) {
    auto ev = x.stream->pop(kPoll);
    if (!ev) {
      if (out.client_gone()) {
        x.stream->cancel_all();    // its sequences end at their next step
        out.respond(499, {}, "");  // the client is gone: nothing reaches it
        return;
      }
      continue;
    }
    if (ev->kind == StreamEvent::Kind::Done) finish_choice(x, *ev);
  }
  if (x.cancelled) return send_error(out, shutting_down(), h);
  if (!x.error.empty()) return send_error(out, model_error(x.error), h);
  send_json(out, 200, completion_body(x.api, x.id, x.created, x.model, x.results, x.prompt_tokens, x.prompt_ids), h);
}

bool Server::stream_events(Exchange& x, HttpExchange& out) {
  const int n = x.stream->choices();
  auto write = [&](const std::string& s) {
    if (out.write_chunk(s)) return true;
    x.stream->cancel_all();  // the client is gone
    return false;
  };
  auto text_chunk = [&](int c, const std::string& text, const std::string& finish) {
    const bool first = x.first[static_cast<size_t>(c)];
    x.first[static_cast<size_t>(c)] = false;
    const ChoiceResult& r = x.results[static_cast<size_t>(c)];
    return write(sse(chunk_body(x.api, x.id, x.created, x.model, c, finish.empty() || !text.empty() ? &text : nullptr,
                                first, finish, finish.empty() ? nullptr : &r)));
  };
  while (x.finished < n) {
    auto ev = x.stream->pop(kPoll);
    if (!ev) {
      if (out.client_gone()) {
        x.stream->cancel_all();
        return false;
      }
      continue;
    }
    const int c = ev->choice;
    if (ev->kind == StreamEvent::Kind::Step) {
      if (x.done[static_cast<size_t>(c)]) continue;
      if (x.api.include_canvas) {
        json j = {{"id", x.id},
                  {"object", x.api.chat ? "chat.completion.chunk" : "text_completion"},
                  {"created", x.created},
                  {"model", x.model},
                  {"choices", json::array()},
                  {"dllm", {{"index", c}, {"step", ev->step}, {"total_steps", ev->total_steps},
                            {"canvas", canvas_json(ev->canvas)}, {"fresh", ev->fresh}}}};
        if (ev->uniform) {  // DiffusionGemma: the re-noised positions, the block and its scheduled temperature
          j["dllm"]["noise"] = ev->noise;
          j["dllm"]["block"] = ev->block;
          j["dllm"]["temperature"] = ev->temperature;
        }
        if (!write(sse(j))) return false;
      }
      TextStream& t = x.texts[static_cast<size_t>(c)];
      const std::string delta = t.feed(text_of(ev->committed));
      if (!delta.empty() && !text_chunk(c, delta, "")) return false;
      if (t.stopped()) {
        // A stop string: the choice ends here; its sequence stops at the next step.
        x.stream->cancel(c);
        ChoiceResult& r = x.results[static_cast<size_t>(c)];
        r.text = t.shown();
        r.finish_reason = "stop";
        x.done[static_cast<size_t>(c)] = true;
        ++x.finished;
        if (!text_chunk(c, "", "stop")) return false;
      }
      continue;
    }
    const bool was_done = x.done[static_cast<size_t>(c)];
    const std::string rest = finish_choice(x, *ev);
    if (was_done) continue;
    if (ev->answer->result.cancelled) {
      if (!write(sse(error_body(shutting_down())))) return false;
      continue;
    }
    if (!ev->answer->result.error.empty()) {
      if (!write(sse(error_body(model_error(ev->answer->result.error))))) return false;
      continue;
    }
    if (!rest.empty() && !text_chunk(c, rest, "")) return false;
    if (!text_chunk(c, "", x.results[static_cast<size_t>(c)].finish_reason)) return false;
  }
  if (x.api.include_usage) {
    int64_t completion = 0;
    for (const auto& r : x.results) completion += static_cast<int64_t>(r.tokens.size());
    json j = {{"id", x.id},
              {"object", x.api.chat ? "chat.completion.chunk" : "text_completion"},
              {"created", x.created},
              {"model", x.model},
              {"choices", json::array()},
              {"usage", usage_json(x.prompt_tokens, completion, x.results.empty() ? 0 : x.results.front().cached_tokens)}};
    if (!write(sse(j))) return false;
  }
  if (!write("data: [DONE]\n\n")) return false;
  return out.end_stream();
}

void Server::generate(const HttpRequest& req, HttpExchange& out, bool chat) {
  const HttpHeaders h = cors(req);
  Exchange x;
  try {
    if (stopping_) throw ApiError(503, "the server is shutting down", "server_error", "", "shutting_down");
    x.api = parse_request(req.body, chat, o_.defaults, o_.limits);
    if (!x.api.model.empty() && x.api.model != o_.model_id) {
      throw ApiError(404, "the model '" + x.api.model + "' does not exist: this server serves '" + o_.model_id + "'",
                     "invalid_request_error", "model", "model_not_found");
    }
    if (!x.api.seed_given) {
      // A fresh seed per request (OpenAI's behaviour); `seed` makes a request repeatable.
      static std::mutex mu;
      static std::mt19937_64 seeds{std::random_device{}()};
      std::lock_guard<std::mutex> lock(mu);
      for (auto& r : x.api.requests) r.sampling.seed = seeds() >> 1;
    }
    const int n = static_cast<int>(x.api.n);
    std::vector<engine::Prepared> choices;
    for (size_t p = 0; p < x.api.requests.size(); ++p) {
      engine::Prepared prepared;
      try {
        prepared = engine_.prepare(x.api.requests[p]);
      } catch (const engine::RequestError& e) {
        throw request_error(e, chat);
      }
      x.prompt_tokens += static_cast<int64_t>(prepared.prompt.size());
      if (x.api.return_tokens && p == 0) x.prompt_ids = prepared.prompt;
      for (int i = 0; i < n; ++i) {
        choices.push_back(prepared);
        choices.back().config.seed += static_cast<uint64_t>(i);
      }
    }
    const int total = static_cast<int>(choices.size());
    x.stream = std::make_shared<Stream>(total, x.api.stream, x.api.include_canvas);
    for (int i = 0; i < total; ++i) x.texts.emplace_back(x.api.stop);
    x.results.resize(static_cast<size_t>(total));
    x.done.assign(static_cast<size_t>(total), false);
    x.first.assign(static_cast<size_t>(total), true);
    x.id = std::string(chat ? "chatcmpl-" : "cmpl-") + std::to_string(next_id_++);
    x.created = static_cast<int64_t>(std::time(nullptr));
    x.model = o_.model_id;
    if (!scheduler_.submit(std::move(choices), x.stream)) {
      throw ApiError(stopping_ ? 503 : 429,
                     stopping_ ? "the server is shutting down" : "the queue is full: try again later",
                     stopping_ ? "server_error" : "rate_limit_error", "", stopping_ ? "shutting_down" : "queue_full");
    }
  } catch (const ApiError& e) {
    return send_error(out, e, h);
  }
  if (!x.api.stream) return answer_whole(x, out, h);
  HttpHeaders sh = h;
  sh.emplace_back("Content-Type", "text/event-stream");
  sh.emplace_back("Cache-Control", "no-cache");
  if (!out.start_stream(200, sh)) {
    x.stream->cancel_all();
  } else {
    stream_events(x, out);
  }
  // The sequences end at their next step once cancelled; the stream is theirs until then (shared).
}

void Server::tokenize(const HttpRequest& req, HttpExchange& out) {
  const TokenizeRequest t = parse_tokenize(req.body);
  const std::vector<int32_t> ids = engine_.tokenizer().encode(t.content, t.parse_special, t.add_special);
  json tokens = json::array();
  for (int32_t id : ids) {
    if (t.with_pieces) {
      const int32_t one[1] = {id};
      tokens.push_back({{"id", id}, {"piece", sanitize_utf8(text_of(one, true))}});
    } else {
      tokens.push_back(id);
    }
  }
  send_json(out, 200, {{"tokens", tokens}}, cors(req));
}

void Server::detokenize(const HttpRequest& req, HttpExchange& out) {
  const std::vector<int32_t> ids = parse_detokenize(req.body, engine_.tokenizer().n_vocab());
  send_json(out, 200, {{"content", sanitize_utf8(text_of(ids, true))}}, cors(req));
}

json Server::props() const {
  const model::HParams& hp = engine_.hparams();
  const engine::Sampling& d = o_.defaults;
  if (uniform_state()) {  // DiffusionGemma: the entropy-bound sampler's defaults (serve's flags, else the file's)
    const model::EntropyBoundDefaults& f = hp.eb;
    return {{"model", o_.model_id},
            {"architecture", hp.arch_name},
            {"context_length", hp.n_ctx},
            {"vocab_size", engine_.tokenizer().n_vocab()},
            {"canvas_length", hp.canvas_length},
            {"defaults",
             {{"max_tokens", d.max_tokens},
              {"eb_max_steps", d.eb.max_steps.value_or(f.max_steps)},
              {"eb_t_min", d.eb.t_min.value_or(f.t_min)},
              {"eb_t_max", d.eb.t_max.value_or(f.t_max)},
              {"eb_entropy_bound", d.eb.entropy_bound.value_or(f.entropy_bound)},
              {"eb_stability", d.eb.stability.value_or(static_cast<int64_t>(f.stability))},
              {"eb_confidence", d.eb.confidence.value_or(f.confidence)},
              {"self_cond_top_k", d.eb.self_cond_top_k.value_or(f.self_cond_top_k)}}},
            {"limits",
             {{"max_tokens", o_.limits.max_tokens}, {"n", o_.limits.max_n}, {"prompts", o_.limits.max_prompts},
              {"batch_size", o_.batch_size}, {"max_queue", o_.max_queue}, {"max_body_bytes", o_.http.max_body_bytes},
              {"max_header_bytes", o_.http.max_header_bytes}, {"max_connections", o_.http.max_connections}}}};
  }
  return {{"model", o_.model_id},
          {"architecture", hp.arch_name},
          {"context_length", hp.n_ctx},
          {"vocab_size", engine_.tokenizer().n_vocab()},
          {"defaults",
           {{"max_tokens", d.max_tokens}, {"steps", d.steps == 0 ? d.max_tokens : d.steps},
            {"block_length", d.block_length}, {"temperature", d.temperature},
            {"remasking", d.remasking.empty() ? json(nullptr) : json(d.remasking)}, {"threshold", d.threshold}}},
          {"limits",
           {{"max_tokens", o_.limits.max_tokens}, {"steps", o_.limits.max_steps}, {"n", o_.limits.max_n},
            {"prompts", o_.limits.max_prompts}, {"batch_size", o_.batch_size}, {"max_queue", o_.max_queue},
            {"max_body_bytes", o_.http.max_body_bytes}, {"max_header_bytes", o_.http.max_header_bytes},
            {"max_connections", o_.http.max_connections}}}};
}

bool Server::origin_allowed(const std::string& origin) const {
  for (const std::string& o : o_.cors_origins)
    if (o == "*" || ascii_lower(o) == ascii_lower(origin)) return true;
  return false;
}

// CORS answer headers for an allowed origin (none without --cors-origin).
HttpHeaders Server::cors(const HttpRequest& req) const {
  const std::string origin = req.header("Origin");
  if (origin.empty() || !origin_allowed(origin)) return {};
  return {{"Access-Control-Allow-Origin", origin}, {"Vary", "Origin"}};
}

// From the header alone: the host (DNS rebinding), the origin (cross-site requests), the route, the
// method, the key and the body's type. The body of a refused request is never read.
HttpServer::Early Server::early(const HttpRequest& req) const {
  auto refuse = [](const ApiError& e, HttpHeaders h = {}) {
    return HttpServer::Early{e.status, std::move(h), dump(error_body(e))};
  };
  const std::string host = req.header("Host");
  if (loopback_ && !host.empty() && !loopback_name(host_name(host)) && !o_.allowed_hosts.count(host_name(host)))
    return refuse(ApiError(403, "the Host '" + sanitize_utf8(escape_text(host, 80)) +
                                    "' is not this server's (a loopback server answers loopback names only; see "
                                    "--allow-host)",
                           "invalid_request_error", "", "host_not_allowed"));
  const std::string origin = req.header("Origin");
  // A browser page of another origin: only those --cors-origin names (the server's own page sends its
  // own origin, which matches the Host).
  const size_t scheme = origin.find("://");
  const bool same_origin = scheme != std::string::npos && !host.empty() && ascii_lower(origin.substr(scheme + 3)) == ascii_lower(host);
  if (!origin.empty() && !same_origin && !origin_allowed(origin))
    return refuse(ApiError(403, "cross-origin requests from '" + sanitize_utf8(escape_text(origin, 80)) +
                                    "' are not allowed (see --cors-origin)",
                           "invalid_request_error", "", "origin_not_allowed"));
  if (req.method == "OPTIONS") {  // a CORS preflight from an allowed origin
    HttpHeaders h = cors(req);
    if (h.empty()) return refuse(ApiError(405, "OPTIONS is for CORS preflights of allowed origins"));
    h.emplace_back("Access-Control-Allow-Methods", "GET, POST, OPTIONS");
    h.emplace_back("Access-Control-Allow-Headers", "Authorization, Content-Type");
    h.emplace_back("Access-Control-Max-Age", "600");
    return HttpServer::Early{204, std::move(h), ""};
  }
  const Route* route = nullptr;
  bool other_method = false;
  const bool model_path = req.path.rfind(kModelPrefix, 0) == 0 && req.path.size() > std::strlen(kModelPrefix);
  for (const Route& r : kRoutes) {
    if (req.path != r.path) continue;
    if (req.method == r.method || (req.method == "HEAD" && std::string(r.method) == "GET")) route = &r;
    else other_method = true;
  }
  static constexpr Route kModel = {"GET", kModelPrefix, false};
  if (model_path) {
    if (req.method == "GET" || req.method == "HEAD") route = &kModel;
    else other_method = true;
  }
  if (!route) {
    if (other_method)
      return refuse(ApiError(405, "method not allowed: " + sanitize_utf8(escape_text(req.method, 20)) + " " +
                                      sanitize_utf8(escape_text(req.path, 120))));
    return refuse(ApiError(404, "no such endpoint: " + sanitize_utf8(escape_text(req.method, 20)) + " " +
                                    sanitize_utf8(escape_text(req.path, 120)),
                           "invalid_request_error", "", "unknown_url"),
                  cors(req));
  }
  if (!route->open && !o_.api_key.empty()) {
    // Authorization: Bearer KEY, the scheme in any case (RFC 9110).
    const std::string auth = req.header("Authorization");
    const size_t sp = auth.find(' ');
    const bool ok = sp != std::string::npos && ascii_lower(auth.substr(0, sp)) == "bearer" &&
                    auth.substr(auth.find_first_not_of(' ', sp) == std::string::npos ? auth.size()
                                                                                     : auth.find_first_not_of(' ', sp)) ==
                        o_.api_key;
    if (!ok)
      return refuse(ApiError(401, "a valid API key is needed (Authorization: Bearer KEY)", "invalid_request_error", "",
                             "invalid_api_key"),
                    cors(req));
  }
  if (req.method == "POST") {
    // A body a browser may send cross-site without asking first (text/plain, forms) is not JSON.
    const std::string type = ascii_lower(req.header("Content-Type"));
    if (type.rfind("text/plain", 0) == 0 || type.rfind("multipart/form-data", 0) == 0)
      return refuse(ApiError(415, "the body must be JSON (Content-Type: application/json), got '" +
                                      sanitize_utf8(escape_text(type, 60)) + "'",
                             "invalid_request_error", "", "unsupported_media_type"),
                    cors(req));
  }
  return {};
}

void Server::handle(const HttpRequest& req, HttpExchange& x) {
  const HttpHeaders h = cors(req);
  try {
    if (req.path == "/") {
      return x.respond(200, {{"Content-Type", "text/html; charset=utf-8"}}, page_html(uniform_state()));
    }
    if (req.path == "/health") {
      return stopping_ ? send_json(x, 503, {{"status", "shutting down"}}) : send_json(x, 200, {{"status", "ok"}});
    }
    if (req.path == "/metrics") return x.respond(200, {{"Content-Type", "text/plain; version=0.0.4"}}, metrics_.render());
    if (req.path == "/v1/models") return send_json(x, 200, {{"object", "list"}, {"data", json::array({model_json()})}}, h);
    if (req.path.rfind(kModelPrefix, 0) == 0) {
      const std::string id = req.path.substr(std::strlen(kModelPrefix));
      if (id != o_.model_id)
        throw ApiError(404, "the model '" + sanitize_utf8(escape_text(id, 120)) + "' does not exist: this server serves '" +
                                o_.model_id + "'",
                       "invalid_request_error", "model", "model_not_found");
      return send_json(x, 200, model_json(), h);
    }
    if (req.path == "/props") return send_json(x, 200, props(), h);
    if (req.path == "/tokenize") return tokenize(req, x);
    if (req.path == "/detokenize") return detokenize(req, x);
    if (req.path == "/v1/chat/completions") return generate(req, x, true);
    if (req.path == "/v1/completions") return generate(req, x, false);
    throw ApiError(404, "no such endpoint", "invalid_request_error", "", "unknown_url");
  } catch (const ApiError& e) {
    send_error(x, e, h);
  }
}

std::string endpoint_label(const std::string& path) {
  for (const Route& r : kRoutes)
    if (path == r.path) return path;
  if (path.rfind(kModelPrefix, 0) == 0) return "/v1/models/{id}";
  return "other";
}

int Server::run() {
  HttpLimits limits = o_.http;
  limits.workers = static_cast<int>(std::min<int64_t>(o_.batch_size + o_.max_queue + 16, 1024));
  HttpServer http(
      limits, [this](const HttpRequest& r) { return early(r); },
      [this](const HttpRequest& r, HttpExchange& x) { handle(r, x); },
      [](int status, const std::string& message) {
        const std::string code = status == 413   ? "request_too_large"
                                 : status == 431 ? "header_too_large"
                                 : status == 414 ? "uri_too_long"
                                 : status == 503 ? "server_busy"
                                 : status == 408 ? "timeout"
                                                 : "";
        return dump(error_body(ApiError(status, message.empty() ? "bad request" : message,
                                        status >= 500 ? "server_error" : "invalid_request_error", "", code)));
      },
      [this](const HttpRequest& req, int status, double ms) {
        metrics_.request(endpoint_label(req.path), status);
        std::fprintf(stderr, "%s:%d %s %s -> %d, %.1f ms\n", req.remote_addr.empty() ? "-" : req.remote_addr.c_str(),
                     req.remote_port, req.method.empty() ? "-" : escape_text(req.method, 20).c_str(),
                     req.target.empty() ? "-" : escape_text(req.target, 120).c_str(), status, ms);
      },
      {{"X-Content-Type-Options", "nosniff"}});
  const int port = http.bind(o_.host, o_.port);
  http.start();
  const bool v6 = o_.host.find(':') != std::string::npos;
  std::fprintf(stderr, "listening on http://%s%s%s:%d\n", v6 ? "[" : "", o_.host.c_str(), v6 ? "]" : "", port);
  std::fflush(stderr);

  // Signals arrive here only (every thread was started with them blocked).
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  int sig = 0;
  sigwait(&set, &sig);
  std::fprintf(stderr, "%s: no new requests; finishing the ones in flight (at most %lld ms)\n",
               sig == SIGINT ? "SIGINT" : "SIGTERM", static_cast<long long>(o_.grace_ms));
  std::fflush(stderr);
  stopping_ = true;
  http.stop_accepting();  // no new connections; idle ones closed
  // Answers still being written get the grace and two seconds more; then their connections are closed.
  http.write_deadline(Clock::now() + std::chrono::milliseconds(o_.grace_ms) + std::chrono::seconds(2));
  scheduler_.drain(std::chrono::milliseconds(o_.grace_ms));
  http.stop(std::chrono::seconds(2));  // every handler has returned
  scheduler_.stop();
  std::fprintf(stderr, "stopped\n");
  return 0;
}

}  // namespace

void block_stop_signals() {
  signal(SIGPIPE, SIG_IGN);
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

int run_server(engine::Engine& engine, const ServerOptions& options) {
  block_stop_signals();
  Server s(engine, options);
  return s.run();
}

}  // namespace dllm::server
