// libFuzzer target for the server's request parsing (src/server/api.cpp): arbitrary bytes as the JSON body of
// /v1/chat/completions, /v1/completions, /tokenize or /detokenize (the first byte picks which), parsed with
// the server's defaults and limits. An ApiError (a 4xx with its body) is the expected outcome for bad input;
// a crash, a sanitizer report, a stack overflow (nesting), a hang, an out-of-memory, or an error body that is
// not valid JSON is a bug. Requests that parse are checked against the limits they must respect.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "server/api.h"

using dllm::server::ApiError;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const int route = data[0] & 3;
  const std::string body(reinterpret_cast<const char*>(data) + 1, size - 1);
  dllm::engine::Sampling defaults;
  defaults.max_tokens = 16;
  defaults.block_length = 8;
  dllm::server::ApiLimits limits;
  limits.max_tokens = 64;
  limits.max_steps = 64;
  limits.max_n = 4;
  limits.max_prompts = 4;
  try {
    if (route < 2) {
      const dllm::server::ApiRequest r = dllm::server::parse_request(body, route == 0, defaults, limits);
      if (r.requests.empty() || r.n < 1 || r.n > limits.max_n) std::abort();
      if (static_cast<int64_t>(r.requests.size()) > limits.max_prompts) std::abort();
      for (const auto& q : r.requests)
        if (q.sampling.max_tokens < 1 || q.sampling.max_tokens > limits.max_tokens || q.sampling.steps > limits.max_steps)
          std::abort();
    } else if (route == 2) {
      dllm::server::parse_tokenize(body);
    } else {
      for (int32_t id : dllm::server::parse_detokenize(body, 1000))
        if (id < 0 || id >= 1000) std::abort();
    }
  } catch (const ApiError& e) {
    if (e.status < 400 || e.status > 499) std::abort();
    // The error's body is what the client gets: valid JSON whatever the input.
    const std::string out = dllm::server::error_body(e).dump();
    (void)dllm::server::json::parse(out);
  }
  return 0;
}
