// dllm logits: one forward pass over --tokens, writing the raw f32 logits of the --rows positions to
// --out as [rows, vocab], row-major, little-endian (no Dream shift: position j of a Dream canvas is
// sampled from raw row j-1). Rows are range-checked before the model is opened and ids right after the
// file passed its checks, before any weight is prepared; the file is written to a temporary name and renamed.
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "cli/backend.h"
#include "cli/commands.h"
#include "common/error.h"
#include "model/model.h"

namespace dllm::cli {

namespace {

// Peak resident set size of this process in MiB (getrusage reports KiB on Linux).
double peak_rss_mib() {
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_maxrss) / 1024.0;
}

// Writes the bytes to a temporary file next to `path`, then renames it over `path`.
void write_atomically(const std::string& path, const void* data, size_t bytes) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) throw Error("cannot write " + path + ": " + std::strerror(errno));
  const bool ok = std::fwrite(data, 1, bytes, f) == bytes;
  const int saved = errno;
  if (std::fclose(f) != 0 || !ok) {
    std::remove(tmp.c_str());
    throw Error("cannot write " + path + ": " + std::strerror(ok ? errno : saved));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    std::remove(tmp.c_str());
    throw Error("cannot write " + path + ": " + std::strerror(e));
  }
}

}  // namespace

int cmd_logits(const Settings& s) {
  using Clock = std::chrono::steady_clock;
  // --- checks that need no model ---
  if (s.tokens.empty()) throw usage_error("flag --tokens needs at least one token id");
  if (s.rows.empty()) throw usage_error("flag --rows needs at least one position");
  if (s.out.empty()) throw usage_error("flag --out needs a file name");
  const int64_t n = static_cast<int64_t>(s.tokens.size());
  for (int64_t r : s.rows) {
    if (r < 0 || r >= n) {
      throw usage_error("--rows: position " + std::to_string(r) + " is out of range: --tokens has " +
                        std::to_string(n) + " ids (positions 0.." + std::to_string(n - 1) + ")");
    }
  }
  for (size_t i = 0; i < s.tokens.size(); ++i) {
    if (s.tokens[i] < 0) {
      throw usage_error("--tokens: id " + std::to_string(s.tokens[i]) + " at position " + std::to_string(i) +
                        " is negative");
    }
  }
  if (s.threads < 0) throw usage_error("flag --threads must be at least 1, got " + std::to_string(s.threads));
  // --- load and check the model, then the ids against its vocabulary ---
  const auto t0 = Clock::now();
  const model::ModelFile file = model::ModelFile::open(s.model);  // opened once: backend choice and load
  model::LoadOptions opt;
  const Backend backend = engine::choose_backend(backend_request(s), &file, opt);
  print_backend_warning(backend);
  std::vector<int32_t> tokens(s.tokens.size());
  int64_t n_prompt = 0;           // DiffusionGemma: the ids before the canvas
  std::vector<float> self_cond;   // DiffusionGemma: --self-cond's logits
  opt.on_checked = [&](const model::HParams& hp) {  // before any weight is prepared
    for (size_t i = 0; i < s.tokens.size(); ++i) {
      if (s.tokens[i] >= hp.n_vocab) {
        throw Error("--tokens: id " + std::to_string(s.tokens[i]) + " at position " + std::to_string(i) +
                    " is out of range: the model's vocabulary has " + std::to_string(hp.n_vocab) + " tokens (ids 0.." +
                    std::to_string(hp.n_vocab - 1) + ")");
      }
      tokens[i] = static_cast<int32_t>(s.tokens[i]);
    }
    model::check_canvas(hp, tokens, s.rows);  // also the context length
    const std::string label = model::arch_spec(hp.arch).label;
    if (!hp.prompt_regions) {
      if (s.no_prompt_cache) throw usage_error("flag --no-prompt-cache is for DiffusionGemma models only (this model is " + label + ")");
      if (!s.self_cond_file.empty() || s.has_self_cond_temperature || s.self_cond_top_k) {
        const char* flag = !s.self_cond_file.empty() ? "" : s.has_self_cond_temperature ? "-temperature" : "-top-k";
        throw usage_error("flag --self-cond" + std::string(flag) + " is for DiffusionGemma models only (this model is " +
                          label + ")");
      }
      return;
    }
    const int64_t C = hp.canvas_length;
    if (n < C)
      throw usage_error("--tokens: a " + label + " model needs the prompt then the canvas of " + std::to_string(C) +
                        " ids (diffusion.canvas_length); got " + std::to_string(n) + " ids");
    n_prompt = n - C;
    for (int64_t r : s.rows) {
      if (r < n_prompt)
        throw usage_error("--rows: position " + std::to_string(r) + " is in the prompt: the canvas is positions " +
                          std::to_string(n_prompt) + ".." + std::to_string(n - 1));
    }
    if (s.has_self_cond_temperature && s.self_cond_file.empty())
      throw usage_error("flag --self-cond-temperature needs --self-cond FILE");
    if (s.self_cond_top_k && s.self_cond_file.empty()) throw usage_error("flag --self-cond-top-k needs --self-cond FILE");
    if (!s.self_cond_file.empty()) {
      if (!(s.self_cond_temperature > 0)) throw usage_error("flag --self-cond-temperature must be above 0");
      FILE* f = std::fopen(s.self_cond_file.c_str(), "rb");
      if (!f) throw usage_error("--self-cond: cannot read " + s.self_cond_file + ": " + std::strerror(errno));
      const size_t want = static_cast<size_t>(C * hp.n_vocab);
      self_cond.resize(want + 1);
      const size_t got = std::fread(self_cond.data(), sizeof(float), want + 1, f);
      std::fclose(f);
      if (got != want)
        throw usage_error("--self-cond: " + s.self_cond_file + " holds " + (got > want ? "more than " : "") +
                          std::to_string(got > want ? want : got) + " f32 values, expected " + std::to_string(want) +
                          " (canvas_length " + std::to_string(C) + " x vocabulary " + std::to_string(hp.n_vocab) + ")");
      self_cond.resize(want);
    }
  };
  std::unique_ptr<model::Model> m = model::Model::load(file, opt);
  print_load_warning(m->executor());
  const int64_t n_vocab = m->n_vocab();

  // --- one forward pass, then the file ---
  const auto t1 = Clock::now();
  std::vector<float> logits(s.rows.size() * static_cast<size_t>(n_vocab));
  model::ForwardRequest req{tokens, s.rows, logits.data()};
  model::KVCache prompt_cache;
  if (m->hparams().prompt_regions) {
    req.n_prompt = n_prompt;
    req.self_cond_logits = self_cond.empty() ? nullptr : self_cond.data();
    req.self_cond_temperature = static_cast<float>(s.self_cond_temperature);
    req.self_cond_top_k = s.self_cond_top_k.value_or(0);
    if (!s.no_prompt_cache && n_prompt > 0) {  // the prompt encoded once, then the canvas against it
      const std::span<const int32_t> prompt(tokens.data(), static_cast<size_t>(n_prompt));
      model::ForwardRequest enc{prompt, {}, nullptr, &prompt_cache, model::CacheMode::Extend};
      enc.n_prompt = n_prompt;
      m->forward(enc);
      req.cache = &prompt_cache;
      req.cache_mode = model::CacheMode::Prefix;
    }
  }
  m->forward(req);
  const auto t2 = Clock::now();
  static_assert(std::endian::native == std::endian::little, "logits files are little-endian f32");
  write_atomically(s.out, logits.data(), logits.size() * sizeof(float));

  std::printf("wrote %zu rows x %lld logits (f32) to %s\n", s.rows.size(), static_cast<long long>(n_vocab),
              s.out.c_str());
  if (s.verbose) {
    auto ms = [](auto d) { return std::chrono::duration<double, std::milli>(d).count(); };
    std::fprintf(stderr, "model: %s (%s, %lld layers, vocab %lld), executor %s, %d threads\n", s.model.c_str(),
                 m->hparams().arch_name.c_str(), static_cast<long long>(m->hparams().n_layer),
                 static_cast<long long>(n_vocab), m->executor().name().c_str(), m->pool().size());
    std::fprintf(stderr, "device: %s (%s)\n", backend.device.c_str(), backend.reason.c_str());
    std::fprintf(stderr, "load: %.1f ms, forward: %.1f ms (%lld tokens, %zu rows)\n", ms(t1 - t0), ms(t2 - t1),
                 static_cast<long long>(n), s.rows.size());
    std::fprintf(stderr, "peak resident memory: %.1f MiB\n", peak_rss_mib());
  }
  return 0;
}

}  // namespace dllm::cli
