// The engine (engine.h): one open file, its tokenizer, the requests' checks, the backend, the weights, and
// the requests run through model::Batch into answers.
#include "engine/engine.h"

#include <algorithm>
#include <chrono>

#include "model/chat.h"
#include "common/error.h"
#include "model/gguf.h"

namespace dllm::engine {

std::vector<int32_t> stop_ids(const model::Tokenizer& tok) {
  // eos and eot (and gemma4's end-of-generation tokens), without duplicates.
  return tok.eog();
}

model::GenerateConfig make_config(const Sampling& s, const model::HParams& hp, std::vector<int32_t> stops) {
  model::GenerateConfig c;
  c.arch = hp.arch;
  c.mask_id = hp.mask_token_id;
  c.stop_ids = std::move(stops);
  c.max_tokens = s.max_tokens;
  c.steps = s.steps > 0 ? s.steps : s.max_tokens;
  c.block_length = s.block_length;
  c.temperature = s.temperature;
  if (s.remasking.empty()) {
    c.remasking = model::default_remasking(hp.arch);
  } else {
    auto r = model::parse_remasking(s.remasking);
    if (!r) throw RequestError("remasking", "{setting} {remasking}: unknown strategy '" + s.remasking + "'");
    c.remasking = *r;
  }
  c.threshold = s.threshold;
  c.dual_cache = s.dual_cache;
  c.full_logits = s.full_logits;
  c.early_stop = s.early_stop;
  c.seed = s.seed;
  c.top_logprobs = s.top_logprobs;
  c.context_length = hp.n_ctx;
  c.canvas_length = hp.canvas_length;
  // DiffusionGemma runs its own sampler: the other samplers' settings are refused, and its settings on other models.
  const std::string label = model::arch_spec(hp.arch).label;
  if (model::arch_spec(hp.arch).sampler == model::SamplerKind::EntropyBound) {
    const auto refuse = [&](const char* key, const std::string& instead) {
      throw RequestError(key, std::string("{") + key + "} does not apply to " + label + " models (" + instead + ")");
    };
    if (s.steps > 0) refuse("steps", "each block runs up to {eb_max_steps} steps");
    if (s.has_block_length) refuse("block_length", "its blocks are the file's canvas");
    if (s.temperature != 0 && !s.temperature_is_a_hint)
      refuse("temperature", "the steps' temperatures go from {eb_t_max} down to {eb_t_min}");
    if (!s.remasking.empty()) refuse("remasking", "it re-noises what {eb_entropy_bound} does not accept");
    if (s.threshold > 0) refuse("threshold", "see {eb_entropy_bound}");
    if (s.dual_cache) refuse("dual_cache", "its prompt is always encoded once");
    if (s.full_logits) refuse("full_logits", "every step reads the whole canvas");
    c.remasking = model::Remasking::Entropy;
    c.eb = hp.eb;  // the file's settings, then the request's
    if (s.eb.max_steps) c.eb.max_steps = *s.eb.max_steps;
    if (s.eb.t_min) c.eb.t_min = *s.eb.t_min;
    if (s.eb.t_max) c.eb.t_max = *s.eb.t_max;
    if (s.eb.entropy_bound) c.eb.entropy_bound = *s.eb.entropy_bound;
    if (s.eb.stability) c.eb.stability = static_cast<double>(*s.eb.stability);
    if (s.eb.confidence) c.eb.confidence = *s.eb.confidence;
    if (s.eb.self_cond_top_k) c.eb.self_cond_top_k = *s.eb.self_cond_top_k;
  } else if (const std::string key = s.eb.first_given(); !key.empty()) {
    throw RequestError(key, "{" + key + "} is for DiffusionGemma models only (this model is " + label + ")");
  }
  return c;
}

std::vector<int32_t> prompt_ids(const Request& r, const model::HParams& hp, const model::Tokenizer& tok) {
  if (r.prompt_tokens) {
    std::vector<int32_t> ids;
    ids.reserve(r.prompt_tokens->size());
    for (size_t i = 0; i < r.prompt_tokens->size(); ++i) {
      const int64_t id = (*r.prompt_tokens)[i];
      if (id < 0 || id >= hp.n_vocab) {
        throw RequestError("prompt_tokens",
                           "{prompt_tokens}: id " + std::to_string(id) + " at position " + std::to_string(i) +
                               " is out of range: the model's vocabulary has " + std::to_string(hp.n_vocab) +
                               " tokens (ids 0.." + std::to_string(hp.n_vocab - 1) + ")",
                           Error::kRuntime);
      }
      ids.push_back(static_cast<int32_t>(id));
    }
    return ids;
  }
  if (!r.chat) return model::raw_prompt_ids(tok, r.prompt);
  if (!r.messages.empty())
    return model::chat_messages_ids(tok, model::chat_template_of(hp.arch_name, tok.chat_template()), r.messages);
  std::optional<std::string_view> system;
  if (r.system) system = *r.system;
  return model::chat_prompt_ids(tok, model::chat_template_of(hp.arch_name, tok.chat_template()), r.prompt, system);
}

// --- Engine ---

Engine::Engine(const std::string& model_path) : path_(model_path), file_(model::ModelFile::open(model_path)) {
  tok_ = std::make_unique<model::Tokenizer>(file_.file());
  stops_ = stop_ids(*tok_);
}

Engine::~Engine() = default;

std::string Engine::model_name() const {
  const gguf::Value* name = file_.file().find("general.name");
  return name && name->type == gguf::ValueType::STRING ? std::string(name->s) : std::string();
}

std::string Engine::chat_template_note() const {
  std::string note;
  model::chat_template_of(hparams().arch_name, tok_->chat_template(), &note);
  return note;
}

Prepared Engine::prepare(const Request& r) const {
  check_sampling(r.sampling);
  Prepared p;
  p.config = make_config(r.sampling, hparams(), stops_);
  const auto t0 = std::chrono::steady_clock::now();
  p.prompt = prompt_ids(r, hparams(), *tok_);
  p.prompt_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  if (auto problem = model::check_settings(p.config, static_cast<int64_t>(p.prompt.size())))
    throw RequestError(problem->key, problem->text);
  return p;
}

Backend Engine::choose_backend(const BackendRequest& r, model::LoadOptions& options) const {
  return engine::choose_backend(r, &file_, options);
}

void Engine::load(const model::LoadOptions& options) {
  if (std::string why = model::generation_unavailable(hparams().arch); !why.empty()) throw Error(why);
  model_ = model::Model::load(file_, options);
}

model::Model& Engine::model() {
  if (!model_) throw Error("internal error: the engine's model is not loaded");
  return *model_;
}

Answer Engine::answer(model::GenerateResult result, std::span<const int32_t> stops) const {
  Answer a;
  a.tokens = model::answer_tokens(result.canvas, result.prompt_length, stops);
  model::DetokenizeOptions dopt;
  dopt.unparse_special = false;  // control tokens (and masks of an interrupted run) are not rendered
  a.text = tok_->detokenize(a.tokens, dopt);
  if (!result.logprobs.empty()) {  // the answer's positions: the first tokens.size() generated ones
    a.logprobs = std::move(result.logprobs);
    a.logprobs.resize(a.tokens.size());
    result.logprobs.clear();
  }
  a.result = std::move(result);
  return a;
}

// --- Session ---

Session::Session(Engine& engine, model::BatchLimits limits, uint64_t prefix_cache_bytes)
    : engine_(engine),
      prefix_(prefix_cache_bytes > 0 ? std::make_unique<model::PrefixCache>(prefix_cache_bytes) : nullptr),
      batch_(engine.model(), limits) {
  batch_.set_prefix_cache(prefix_.get());
}

Session::~Session() = default;

int64_t Session::add(const Prepared& p, model::GenerateHooks hooks) {
  if (!hooks.pool) hooks.pool = &engine_.model().pool();
  const int64_t id = batch_.add(p.config, p.prompt, std::move(hooks));
  stops_[id] = p.config.stop_ids;
  return id;
}

std::vector<std::pair<int64_t, Answer>> Session::take_finished() {
  std::vector<std::pair<int64_t, Answer>> out;
  for (auto& [id, result] : batch_.take_finished()) {
    const auto it = stops_.find(id);
    out.emplace_back(id, engine_.answer(std::move(result), it->second));
    stops_.erase(it);  // a long-running session keeps only the requests in flight
  }
  return out;
}

Answer run(Engine& engine, const Prepared& p, model::GenerateHooks hooks) {
  Session s(engine, model::BatchLimits{1, 0});
  s.add(p, std::move(hooks));
  while (s.step()) {
  }
  auto done = s.take_finished();
  if (done.size() != 1) throw Error("internal error: a session of one request finished " + std::to_string(done.size()));
  if (!done.front().second.result.error.empty()) throw Error(done.front().second.result.error);
  return std::move(done.front().second);
}

}  // namespace dllm::engine
