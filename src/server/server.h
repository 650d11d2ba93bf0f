// `dllm serve`: an OpenAI-compatible HTTP server over a loaded engine (Boost.Beast, http.h). Endpoints:
// POST /v1/chat/completions, POST /v1/completions (streamed as Server-Sent Events or not), GET /v1/models
// and /v1/models/{id}, POST /tokenize and /detokenize, GET /props (model, context, defaults, limits),
// GET /health, GET /metrics (Prometheus text) and GET / (a page that shows the canvas denoise). One
// scheduler thread owns the engine's batch (scheduler.h); each HTTP request waits on its own event queue.
// A loopback server answers loopback Host names only and no foreign browser origin unless --cors-origin
// names it (DNS rebinding, cross-site requests).
// SIGINT / SIGTERM: stop accepting, let what is in flight finish within a bound (then cancel it), return.
#pragma once
#include <cstdint>
#include <string>

#include <set>
#include <vector>

#include "engine/engine.h"
#include "server/api.h"
#include "server/http.h"

namespace dllm::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;                  // 0: any free port (printed)
  std::string api_key;              // "": no key needed
  int64_t batch_size = 8;           // sequences in flight at once
  int64_t max_queue = 64;           // sequences waiting for a place at most (beyond: 503)
  int64_t prefix_cache_mib = 512;   // DiffusionGemma: encoded prefixes of recent requests kept (0: none)
  HttpLimits http;                  // the transport's limits and deadlines (http.h)
  ApiLimits limits;                 // what one request may ask (api.h)
  std::vector<std::string> cors_origins;  // browser origins allowed to call the API ("*": any)
  std::set<std::string> allowed_hosts;    // Host names a loopback server also answers (besides loopback ones)
  int64_t grace_ms = 10000;         // shutdown: how long requests in flight may still run
  engine::Sampling defaults;        // the generation flags: each request's defaults
  std::string model_id;             // the name /v1/models lists and requests may give
};

// Binds, prints "listening on http://HOST:PORT" on stderr, serves until SIGINT or SIGTERM, and returns 0
// once every request has been answered or cancelled. The engine must be loaded. Throws dllm::Error when the
// address cannot be bound.
int run_server(engine::Engine& engine, const ServerOptions& options);

// Writes to a closed connection fail with EPIPE instead of killing the process, and SIGINT / SIGTERM are
// blocked in the calling thread and every thread it starts afterwards, so that run_server receives them
// (sigwait). Call it before the engine's worker threads start (before Engine::load).
void block_stop_signals();

// The page at GET / (page.cpp); `uniform` for a DiffusionGemma server (a uniform-state canvas, its own steps box).
std::string page_html(bool uniform);

}  // namespace dllm::server
