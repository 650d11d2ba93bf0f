// A loaded diffusion language model: the mapped GGUF file, its checked hyperparameters and tensors, a
// thread pool and an executor holding the prepared weights. This is what the samplers and the CLI use:
// hyperparameters, mask token, vocabulary size, whether logits are shifted (Dream), and forward().
#pragma once
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "model/arch.h"
#include "model/executor.h"
#include "model/forward.h"
#include "model/gguf.h"
#include "common/thread_pool.h"

namespace dllm::model {

// Builds the executor for a model; it may keep a reference to the pool. Empty = the reference executor.
using ExecutorFactory = std::function<std::unique_ptr<Executor>(ThreadPool& pool)>;

struct LoadOptions {
  int threads = 0;                  // worker threads including the caller; 0 = all logical CPUs
  ExecutorFactory make_executor;    // empty: ReferenceExecutor
  // Called once the file passed every check, before the executor is built and the weights prepared
  // (which may be slow for executors that repack): callers range-check their inputs here.
  std::function<void(const HParams&)> on_checked;
};

// A GGUF file opened (mapped and parsed) once, with its hyperparameters read and checked, and its tensors
// checked once someone asks (tensors(): presence, type and shape, arch.h lists the messages). Whoever
// reads the file before loading (the tokenizer, the backend choice) shares it with load() below, so the
// file is opened and checked once per process.
class ModelFile {
 public:
  // Throws dllm::Error (gguf::File::open's and read_hparams's messages).
  static ModelFile open(const std::string& path);
  const gguf::File& file() const { return *file_; }
  const std::shared_ptr<const gguf::File>& shared_file() const { return file_; }
  const HParams& hparams() const { return hp_; }
  // Checked on the first call (dllm::Error), then kept.
  const ModelTensors& tensors() const;

 private:
  std::shared_ptr<const gguf::File> file_;
  HParams hp_;
  mutable std::optional<ModelTensors> tensors_;
};

class Model {
 public:
  // Maps the file, reads and checks every hyperparameter and every tensor's presence, type and shape
  // (arch.h lists the messages), then prepares the weights with the executor. Throws dllm::Error.
  static std::unique_ptr<Model> load(const std::string& path, const LoadOptions& options = {});
  // The same from a file already opened (its checks not repeated); the model shares the mapping.
  static std::unique_ptr<Model> load(const ModelFile& file, const LoadOptions& options = {});
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const HParams& hparams() const { return hp_; }
  Arch arch() const { return hp_.arch; }
  int64_t n_vocab() const { return hp_.n_vocab; }
  int32_t mask_token_id() const { return hp_.mask_token_id; }
  // True for Dream: the sampler reads raw row j-1 for canvas position j (forward() returns raw rows).
  bool shift_logits() const { return hp_.shift_logits; }
  const gguf::File& file() const { return *file_; }
  const ModelTensors& tensors() const { return tensors_; }
  ThreadPool& pool() { return *pool_; }
  Executor& executor() { return *executor_; }

  // One forward pass over the canvas `tokens` (token i at position i). Writes the raw logits of the
  // canvas positions `logit_rows`, in that order, to logits ([logit_rows.size(), n_vocab()]).
  // Throws dllm::Error for ids or rows out of range. Not safe to call from two threads at once.
  void forward(std::span<const int32_t> tokens, std::span<const int64_t> logit_rows, float* logits);
  std::vector<float> forward(std::span<const int32_t> tokens, std::span<const int64_t> logit_rows);
  // The same with every option of ForwardRequest (the key/value cache of LLaDA's dual cache).
  void forward(const ForwardRequest& request);
  // One pass over several sequences (forward.h: each one's logits as if it ran alone).
  void forward_batch(std::span<const ForwardRequest> requests);
  const ForwardWeights& weights() const { return weights_; }

 private:
  Model() = default;

  std::shared_ptr<const gguf::File> file_;
  HParams hp_;
  ModelTensors tensors_;
  std::unique_ptr<ThreadPool> pool_;
  std::unique_ptr<Executor> executor_;
  ForwardWeights weights_;
};

}  // namespace dllm::model
