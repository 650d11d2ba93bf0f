// The engine: one loaded diffusion language model serving generation requests, shared by the CLI (`dllm
// run`, one prompt or a file of requests) and the server to come. It prints nothing. In order:
//   Engine e(path);                  the GGUF file opened and its hyperparameters and tokenizer read, once
//   e.prepare(request)               the prompt ids (chat template, raw text or given ids) and the settings,
//                                    checked once against the architecture (RequestError naming the field)
//   e.choose_backend(...), e.load()  the executor chosen and the weights prepared (the same open file)
//   Session s(e, limits); s.add(prepared, hooks); s.step(); s.take_finished()
//                                    requests through model::Batch (continuous batching), each finished one
//                                    turned into an Answer (answer tokens and detokenized text)
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "engine/backend.h"
#include "engine/request.h"
#include "model/arch.h"
#include "model/batch.h"
#include "model/generate.h"
#include "model/model.h"
#include "model/tokenizer.h"

namespace dllm::engine {

// The stop set (algorithms.md 5.1): the vocabulary's end-of-text and end-of-turn ids.
std::vector<int32_t> stop_ids(const model::Tokenizer& tok);

// The generation config of a request's settings, defaults resolved (steps = max_tokens, the
// architecture's remasking). RequestError for a remasking name that does not exist; the architecture's
// checks are prepare()'s (they need the prompt length).
model::GenerateConfig make_config(const Sampling& s, const model::HParams& hp, std::vector<int32_t> stops);

// The ids the model sees: prompt_tokens verbatim (RequestError, runtime kind, naming the first id
// outside the vocabulary), else the messages or the prompt through the architecture's chat template (with the system
// turn when given), or raw with chat off.
std::vector<int32_t> prompt_ids(const Request& r, const model::HParams& hp, const model::Tokenizer& tok);

// A request checked and ready to run.
struct Prepared {
  model::GenerateConfig config;
  std::vector<int32_t> prompt;
  double prompt_ms = 0;  // chat template and tokenization
};

// A finished request: the generation's result and the answer (algorithms.md 5.2).
struct Answer {
  model::GenerateResult result;
  std::vector<int32_t> tokens;  // generated ids up to the first stop id
  std::string text;             // tokens detokenized (control tokens and masks not rendered)
  // With Sampling::top_logprobs >= 0: one entry per token of `tokens`, in order (moved out of
  // result.logprobs, which is left empty): the committed token's log-probability and the top alternatives
  // in the distribution it was committed from (model/sampler.h). Positions a cancelled run left masked
  // have step -1 and no alternatives. Empty when off.
  std::vector<model::PositionLogprobs> logprobs;
};

class Engine {
 public:
  // Opens the file once (dllm::Error: the file's and the hyperparameters' messages) and reads the tokenizer.
  explicit Engine(const std::string& model_path);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  const std::string& path() const { return path_; }
  const model::ModelFile& file() const { return file_; }
  const model::HParams& hparams() const { return file_.hparams(); }
  const model::Tokenizer& tokenizer() const { return *tok_; }
  const std::vector<int32_t>& stops() const { return stops_; }
  std::string model_name() const;  // general.name, "" when absent
  // A line for stderr when the file's tokenizer.chat_template is not one dllm renders and chat prompts
  // use the architecture's template instead (model::chat_template_of); "" otherwise.
  std::string chat_template_note() const;

  // Checks a request (check_sampling, make_config, prompt_ids, model::check_settings) and builds its
  // prompt ids. RequestError names the field at fault. No model work: callable before load().
  Prepared prepare(const Request& r) const;

  // Picks the executor (engine/backend.h) with this file (its tensors are checked here for gpu / auto).
  Backend choose_backend(const BackendRequest& r, model::LoadOptions& options) const;
  // Prepares the weights with the executor options chose (the file is not opened again).
  void load(const model::LoadOptions& options);
  bool loaded() const { return model_ != nullptr; }
  model::Model& model();

  // The answer of a finished generation.
  Answer answer(model::GenerateResult result, std::span<const int32_t> stop_ids) const;

 private:
  std::string path_;
  model::ModelFile file_;
  std::unique_ptr<model::Tokenizer> tok_;
  std::vector<int32_t> stops_;
  std::unique_ptr<model::Model> model_;
};

// Requests running on a loaded engine, many at once through one forward pass per step (model::Batch):
// a request's tokens are the same whichever others share its steps.
class Session {
 public:
  // prefix_cache_bytes > 0: DiffusionGemma requests share a prefix cache of that bound (model::PrefixCache):
  // a prompt that begins with an earlier request's encoded prefix (the next turn of a chat) encodes only the
  // rest (Answer::result.cached_prompt_tokens says how many it took).
  Session(Engine& engine, model::BatchLimits limits = {}, uint64_t prefix_cache_bytes = 0);
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  // Queues a prepared request; hooks.pool defaults to the model's pool. Returns its id (0, 1, 2, ...).
  int64_t add(const Prepared& p, model::GenerateHooks hooks = {});
  void cancel(int64_t id) { batch_.cancel(id); }
  // One step of every request in flight; false when nothing is left.
  bool step() { return batch_.step(); }
  // Requests finished since the last call, in the order they finished.
  std::vector<std::pair<int64_t, Answer>> take_finished();
  int64_t in_flight() const { return batch_.in_flight(); }
  int64_t waiting() const { return batch_.waiting(); }
  int64_t last_step_rows() const { return batch_.last_step_rows(); }  // canvas rows of the last pass
  int64_t last_step_sequences() const { return batch_.last_step_sequences(); }
  // Requests whose state the session keeps (those not taken yet): a server's session must not grow with
  // every request it ever ran.
  size_t tracked_requests() const { return stops_.size(); }
  // The prefix cache (when on) and what it holds.
  const model::PrefixCache* prefix_cache() const { return prefix_.get(); }

 private:
  Engine& engine_;
  std::unique_ptr<model::PrefixCache> prefix_;
  model::Batch batch_;
  std::unordered_map<int64_t, std::vector<int32_t>> stops_;  // per id in flight
};

// One request to its end on a loaded engine (a session of one).
Answer run(Engine& engine, const Prepared& p, model::GenerateHooks hooks = {});

}  // namespace dllm::engine
