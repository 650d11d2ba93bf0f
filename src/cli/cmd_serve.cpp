// dllm serve: the flags as the server's options (the generation flags as every request's defaults), the
// engine opened and loaded once, then src/server runs until SIGINT / SIGTERM.
#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "cli/backend.h"
#include "cli/commands.h"
#include "cli/run_config.h"
#include "engine/engine.h"
#include "server/server.h"

namespace dllm::cli {

int cmd_serve(const Settings& s) {
  if (s.max_tokens > s.max_tokens_limit)
    throw Error("flag --max-tokens " + std::to_string(s.max_tokens) + " is above --max-tokens-limit " +
                    std::to_string(s.max_tokens_limit),
                Error::kUsage);
  if (s.steps > s.max_steps_limit)
    throw Error("flag --steps " + std::to_string(s.steps) + " is above --max-steps-limit " +
                    std::to_string(s.max_steps_limit),
                Error::kUsage);
  // Before any worker thread starts: the signals go to the server's sigwait, not to a worker.
  server::block_stop_signals();
  engine::Engine e(s.model);
  {
    // The generation flags checked once against the model, as run checks them (errors name the flags).
    Settings probe = s;
    probe.prompt = "Hello", probe.has_prompt = true;
    prepare_with_flags(e, probe);
  }
  model::LoadOptions opt;
  engine::BackendRequest br = backend_request(s);
  // A GPU workspace for --batch-size canvases of up to 2048 rows each (longer ones run with fewer others).
  br.max_rows = s.batch_size * std::min<int64_t>(e.hparams().n_ctx > 0 ? e.hparams().n_ctx : 2048, 2048);
  const Backend backend = e.choose_backend(br, opt);
  print_backend_warning(backend);
  e.load(opt);
  print_chat_template_note(e, true);  // /v1/chat/completions renders the template

  server::ServerOptions o;
  o.host = s.host;
  o.port = static_cast<int>(s.port);
  o.api_key = s.api_key;
  o.batch_size = s.batch_size;
  o.max_queue = s.max_queue;
  o.prefix_cache_mib = s.prefix_cache_mib;
  o.defaults = sampling_of(s);
  o.grace_ms = std::min<int64_t>(s.shutdown_grace_s, int64_t{1} << 30) * 1000;
  o.model_id = std::filesystem::path(s.model).stem().string();
  o.limits.max_tokens = s.max_tokens_limit;
  o.limits.max_steps = s.max_steps_limit;
  o.limits.max_n = s.max_n;
  o.http.max_connections = static_cast<int>(std::min<int64_t>(s.max_connections, 1 << 20));
  o.cors_origins = s.cors_origins;
  for (const std::string& h : s.allow_hosts) {
    std::string lower = h;
    for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    o.allowed_hosts.insert(lower);
  }
  std::fprintf(stderr, "model %s (%s), device %s, %d threads, batch size %lld\n", o.model_id.c_str(),
               e.hparams().arch_name.c_str(), backend.device.c_str(), e.model().pool().size(),
               static_cast<long long>(s.batch_size));
  return server::run_server(e, o);
}

}  // namespace dllm::cli
