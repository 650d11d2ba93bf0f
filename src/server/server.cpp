// The HTTP side of `dllm serve` (server.h): routes, the key, limits, the per-request wait on the scheduler's
// events (streamed as Server-Sent Events or answered whole), disconnect detection and the orderly stop.
#include "server/server.h"

#include <arpa/inet.h>
#include <httplib.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <memory>
#include <thread>

#include "common/error.h"
#include "common/printable.h"
#include "server/api.h"
#include "server/metrics.h"
#include "server/scheduler.h"
#include "server/stream.h"

namespace dllm::server {

namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kPoll = std::chrono::milliseconds(20);  // how often a waiting handler looks at its client
// When this handler thread's request arrived (cpp-httplib runs a request's routing, handler, streaming and
// logger on one thread): the log line's duration.
thread_local Clock::time_point request_start;

// A sequence that ended on the model's error (GenerateResult::error: no finite logit to commit).
ApiError model_error(const std::string& what) { return ApiError(500, what, "server_error", "", "model_error"); }

void send_error(httplib::Response& res, const ApiError& e) {
  res.status = e.status;
  res.set_content(error_body(e).dump(), "application/json");
}

// The address of a socket as text (IPv4 or IPv6) and its port; false when it has none.
bool address_of(const sockaddr_storage& ss, std::string* ip, int* port) {
  char buf[INET6_ADDRSTRLEN] = {};
  if (ss.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&ss);
    inet_ntop(AF_INET, &a->sin_addr, buf, sizeof buf);
    *port = ntohs(a->sin_port);
  } else if (ss.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&ss);
    inet_ntop(AF_INET6, &a->sin6_addr, buf, sizeof buf);
    *port = ntohs(a->sin6_port);
  } else {
    return false;
  }
  *ip = buf;
  return true;
}

// The connection's socket (cpp-httplib does not hand it to handlers): the descriptor of this process
// whose local and remote addresses are the request's. -1 when none matches.
int connection_socket(const httplib::Request& req) {
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd", ec)) {
    int fd = -1;
    try {
      fd = std::stoi(entry.path().filename().string());
    } catch (...) {
      continue;
    }
    sockaddr_storage local{}, peer{};
    socklen_t ll = sizeof local, pl = sizeof peer;
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &ll) != 0) continue;
    if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &pl) != 0) continue;
    std::string lip, pip;
    int lport = 0, pport = 0;
    if (!address_of(local, &lip, &lport) || !address_of(peer, &pip, &pport)) continue;
    if (lport == req.local_port && pport == req.remote_port && pip == req.remote_addr) return fd;
  }
  return -1;
}

// True when the client closed its side or reset the connection.
bool client_gone(int fd) {
  if (fd < 0) return false;
  char c;
  const ssize_t n = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  if (n == 0) return true;
  return n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
}

std::string sse(const json& j) { return "data: " + j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n"; }

// What one request's handler keeps while it waits: its parsed body, its sequences' stream, and per choice
// the streamed text and how it ended.
struct Exchange {
  ApiRequest api;
  std::shared_ptr<Stream> stream;
  std::string id, model;
  int64_t created = 0;
  int64_t prompt_tokens = 0;
  std::vector<int32_t> prompt_ids;
  int fd = -1;
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
      : engine_(engine),
        o_(o),
        scheduler_(engine, o.batch_size, o.max_queue, metrics_) {}

  int run();

 private:
  void routes();
  void generate(const httplib::Request& req, httplib::Response& res, bool chat);
  void answer_whole(const std::shared_ptr<Exchange>& x, httplib::Response& res);
  bool stream_events(const std::shared_ptr<Exchange>& x, httplib::DataSink& sink);
  std::string text_of(std::span<const int32_t> ids) const;
  json canvas_json(const std::vector<int32_t>& canvas) const;
  // A Done event into the choice's result; returns the text not yet streamed.
  std::string finish_choice(Exchange& x, StreamEvent& ev);

  engine::Engine& engine_;
  ServerOptions o_;
  Metrics metrics_;
  Scheduler scheduler_;
  httplib::Server http_;
  std::atomic<bool> stopping_{false};
  std::atomic<int64_t> next_id_{0};
};

std::string Server::text_of(std::span<const int32_t> ids) const {
  model::DetokenizeOptions d;
  d.unparse_special = false;
  return engine_.tokenizer().detokenize(ids, d);
}

json Server::canvas_json(const std::vector<int32_t>& canvas) const {
  json out = json::array();
  const int32_t mask = engine_.hparams().mask_token_id;
  for (int32_t id : canvas) {
    if (id == mask) {
      out.push_back(nullptr);
    } else {
      const int32_t one[1] = {id};
      out.push_back(sanitize_utf8(text_of(one)));
    }
  }
  return out;
}

std::string Server::finish_choice(Exchange& x, StreamEvent& ev) {
  const int c = ev.choice;
  engine::Answer& a = *ev.answer;
  if (a.result.cancelled) x.cancelled = true;
  if (!a.result.error.empty() && x.error.empty()) x.error = a.result.error;
  if (x.done[static_cast<size_t>(c)]) return "";  // ended by a stop string already
  bool ended = false;
  committed_answer(a.result.generated(), engine_.hparams().mask_token_id, engine_.stops(), &ended);
  TextStream& t = x.texts[static_cast<size_t>(c)];
  const std::string rest = t.finish(a.text);
  ChoiceResult& r = x.results[static_cast<size_t>(c)];
  r.text = t.shown();
  r.tokens = a.tokens;
  r.finish_reason = ended || t.stopped() ? "stop" : "length";
  x.done[static_cast<size_t>(c)] = true;
  ++x.finished;
  return rest;
}

void Server::answer_whole(const std::shared_ptr<Exchange>& x, httplib::Response& res) {
  const int n = x->stream->choices();
  while (x->finished < n) {
    auto ev = x->stream->pop(kPoll);
    if (!ev) {
      if (client_gone(x->fd)) {
        x->stream->cancel_all();
        res.status = 499;  // the client is gone: nothing is sent
        return;
      }
      continue;
    }
    if (ev->kind == StreamEvent::Kind::Done) finish_choice(*x, *ev);
  }
  if (x->cancelled) {
    send_error(res, ApiError(503, "the server is shutting down: the request was cancelled", "server_error", "",
                             "shutting_down"));
    return;
  }
  if (!x->error.empty()) {
    send_error(res, model_error(x->error));
    return;
  }
  res.set_content(completion_body(x->api, x->id, x->created, x->model, x->results, x->prompt_tokens, x->prompt_ids)
                      .dump(-1, ' ', false, json::error_handler_t::replace),
                  "application/json");
}

bool Server::stream_events(const std::shared_ptr<Exchange>& x, httplib::DataSink& sink) {
  const int n = x->stream->choices();
  auto write = [&](const std::string& s) {
    if (sink.write(s.data(), s.size())) return true;
    x->stream->cancel_all();  // the client is gone
    return false;
  };
  auto text_chunk = [&](int c, const std::string& text, const std::string& finish) {
    const bool first = x->first[static_cast<size_t>(c)];
    x->first[static_cast<size_t>(c)] = false;
    return write(sse(chunk_body(x->api, x->id, x->created, x->model, c, finish.empty() || !text.empty() ? &text : nullptr,
                                first, finish)));
  };
  while (x->finished < n) {
    auto ev = x->stream->pop(kPoll);
    if (!ev) {
      if (client_gone(x->fd)) {
        x->stream->cancel_all();
        return false;
      }
      continue;
    }
    const int c = ev->choice;
    if (ev->kind == StreamEvent::Kind::Step) {
      if (x->done[static_cast<size_t>(c)]) continue;
      if (x->api.include_canvas) {
        json j = {{"id", x->id},
                  {"object", x->api.chat ? "chat.completion.chunk" : "text_completion"},
                  {"created", x->created},
                  {"model", x->model},
                  {"choices", json::array()},
                  {"dllm", {{"index", c}, {"step", ev->step}, {"total_steps", ev->total_steps},
                            {"canvas", canvas_json(ev->canvas)}, {"fresh", ev->fresh}}}};
        if (!write(sse(j))) return false;
      }
      TextStream& t = x->texts[static_cast<size_t>(c)];
      const std::string delta = t.feed(text_of(ev->committed));
      if (!delta.empty() && !text_chunk(c, delta, "")) return false;
      if (t.stopped()) {
        // A stop string: the choice ends here; its sequence stops at the next step.
        x->stream->cancel(c);
        ChoiceResult& r = x->results[static_cast<size_t>(c)];
        r.text = t.shown();
        r.finish_reason = "stop";
        x->done[static_cast<size_t>(c)] = true;
        ++x->finished;
        if (!text_chunk(c, "", "stop")) return false;
      }
      continue;
    }
    const bool was_done = x->done[static_cast<size_t>(c)];
    const std::string rest = finish_choice(*x, *ev);
    if (was_done) continue;
    if (ev->answer->result.cancelled) {
      json err = error_body(ApiError(503, "the server is shutting down: the request was cancelled", "server_error",
                                     "", "shutting_down"));
      if (!write(sse(err))) return false;
      continue;
    }
    if (!ev->answer->result.error.empty()) {
      if (!write(sse(error_body(model_error(ev->answer->result.error))))) return false;
      continue;
    }
    if (!rest.empty() && !text_chunk(c, rest, "")) return false;
    if (!text_chunk(c, "", x->results[static_cast<size_t>(c)].finish_reason)) return false;
  }
  if (x->api.include_usage) {
    int64_t completion = 0;
    for (const auto& r : x->results) completion += static_cast<int64_t>(r.tokens.size());
    json j = {{"id", x->id},
              {"object", x->api.chat ? "chat.completion.chunk" : "text_completion"},
              {"created", x->created},
              {"model", x->model},
              {"choices", json::array()},
              {"usage", usage_json(x->prompt_tokens, completion)}};
    if (!write(sse(j))) return false;
  }
  if (!write("data: [DONE]\n\n")) return false;
  sink.done();
  return true;
}

void Server::generate(const httplib::Request& req, httplib::Response& res, bool chat) {
  auto x = std::make_shared<Exchange>();
  try {
    if (stopping_) throw ApiError(503, "the server is shutting down", "server_error", "", "shutting_down");
    x->api = parse_request(req.body, chat, o_.defaults);
    if (!x->api.model.empty() && x->api.model != o_.model_id) {
      throw ApiError(404, "the model '" + x->api.model + "' does not exist: this server serves '" + o_.model_id + "'",
                     "invalid_request_error", "model", "model_not_found");
    }
    engine::Prepared p;
    try {
      p = engine_.prepare(x->api.request);
    } catch (const engine::RequestError& e) {
      throw request_error(e);
    }
    x->prompt_tokens = static_cast<int64_t>(p.prompt.size());
    if (x->api.return_tokens) x->prompt_ids = p.prompt;
    const int n = static_cast<int>(x->api.n);
    std::vector<engine::Prepared> choices(static_cast<size_t>(n), p);
    for (int i = 1; i < n; ++i) choices[static_cast<size_t>(i)].config.seed += static_cast<uint64_t>(i);
    x->stream = std::make_shared<Stream>(n, x->api.stream, x->api.include_canvas);
    for (int i = 0; i < n; ++i) x->texts.emplace_back(x->api.stop);
    x->results.resize(static_cast<size_t>(n));
    x->done.assign(static_cast<size_t>(n), false);
    x->first.assign(static_cast<size_t>(n), true);
    x->id = std::string(chat ? "chatcmpl-" : "cmpl-") + std::to_string(next_id_++);
    x->created = static_cast<int64_t>(std::time(nullptr));
    x->model = o_.model_id;
    x->fd = connection_socket(req);
    if (!scheduler_.submit(std::move(choices), x->stream)) {
      throw ApiError(stopping_ ? 503 : 429,
                     stopping_ ? "the server is shutting down" : "the queue is full: try again later",
                     stopping_ ? "server_error" : "rate_limit_error", "", stopping_ ? "shutting_down" : "queue_full");
    }
  } catch (const ApiError& e) {
    if (e.status == 429) res.set_header("Retry-After", "1");
    send_error(res, e);
    return;
  }
  if (!x->api.stream) {
    answer_whole(x, res);
    return;
  }
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider("text/event-stream",
                                   [this, x](size_t, httplib::DataSink& sink) { return stream_events(x, sink); });
}

void Server::routes() {
  http_.Get("/", [](const httplib::Request&, httplib::Response& res) { res.set_content(page_html(), "text/html; charset=utf-8"); });
  http_.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    if (stopping_) {
      res.status = 503;
      res.set_content(R"({"status":"shutting down"})", "application/json");
    } else {
      res.set_content(R"({"status":"ok"})", "application/json");
    }
  });
  http_.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics_.render(), "text/plain; version=0.0.4");
  });
  http_.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    json m = {{"id", o_.model_id}, {"object", "model"}, {"created", 0}, {"owned_by", "dllm"}};
    res.set_content(json({{"object", "list"}, {"data", json::array({m})}}).dump(), "application/json");
  });
  http_.Post("/v1/chat/completions",
             [this](const httplib::Request& req, httplib::Response& res) { generate(req, res, true); });
  http_.Post("/v1/completions",
             [this](const httplib::Request& req, httplib::Response& res) { generate(req, res, false); });

  // The key (Authorization: Bearer K) for the API; the page, /health and /metrics stay open.
  http_.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    request_start = Clock::now();
    if (o_.api_key.empty() || req.path.rfind("/v1/", 0) != 0) return httplib::Server::HandlerResponse::Unhandled;
    if (req.get_header_value("Authorization") == "Bearer " + o_.api_key)
      return httplib::Server::HandlerResponse::Unhandled;
    send_error(res, ApiError(401, "a valid API key is needed (Authorization: Bearer KEY)", "invalid_request_error",
                             "", "invalid_api_key"));
    return httplib::Server::HandlerResponse::Handled;
  });
  // Statuses cpp-httplib sets itself (no route, a body over the limit, a malformed request) in OpenAI's form.
  http_.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    if (res.status == 404) {
      send_error(res, ApiError(404, "no such endpoint: " + req.method + " " + sanitize_utf8(req.path),
                               "invalid_request_error", "", "unknown_url"));
    } else if (res.status == 413) {
      send_error(res, ApiError(413, "the request body is larger than the limit", "invalid_request_error", "",
                               "request_too_large"));
    } else if (res.status == 405) {
      send_error(res, ApiError(405, "method not allowed: " + req.method + " " + sanitize_utf8(req.path)));
    } else {
      send_error(res, ApiError(res.status, "bad request"));
    }
  });
  http_.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
    std::string endpoint = req.path;
    if (endpoint != "/" && endpoint != "/health" && endpoint != "/metrics" && endpoint != "/v1/models" &&
        endpoint != "/v1/chat/completions" && endpoint != "/v1/completions")
      endpoint = "other";
    metrics_.request(endpoint, res.status);
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - request_start).count();
    std::fprintf(stderr, "%s %s %s -> %d, %.1f ms\n", req.remote_addr.c_str(), req.method.c_str(),
                 escape_text(req.path, 120).c_str(), res.status, ms);
  });
}

int Server::run() {
  routes();
  const size_t threads = static_cast<size_t>(std::min<int64_t>(o_.batch_size + o_.max_queue + 16, 1024));
  http_.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  http_.set_payload_max_length(o_.max_body_bytes);
  // SO_REUSEADDR only: cpp-httplib's default SO_REUSEPORT would let a second server share a port in use.
  http_.set_socket_options([](int sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });
  http_.set_keep_alive_timeout(5);
  http_.set_read_timeout(30, 0);
  http_.set_write_timeout(30, 0);
  int port = o_.port;
  if (port == 0) {
    port = http_.bind_to_any_port(o_.host);
    if (port < 0) throw Error("cannot listen on " + o_.host + " (any port)");
  } else if (!http_.bind_to_port(o_.host, port)) {
    throw Error("cannot listen on " + o_.host + ":" + std::to_string(port) + " (in use, or not an address here)",
                Error::kRuntime);
  }
  std::thread listener([this] { http_.listen_after_bind(); });
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
  http_.stop();  // no new connections
  scheduler_.drain(std::chrono::milliseconds(o_.grace_ms));
  listener.join();  // every handler has returned
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
