// Model loading (map, check, prepare) and the forward entry point the samplers and the CLI call.
#include "model/model.h"

#include "common/error.h"
#include "model/reference_executor.h"

namespace dllm::model {

Model::~Model() = default;

ModelFile ModelFile::open(const std::string& path) {
  ModelFile f;
  f.file_ = gguf::File::open(path);
  f.hp_ = read_hparams(*f.file_);
  return f;
}

const ModelTensors& ModelFile::tensors() const {
  if (!tensors_) tensors_ = check_tensors(*file_, hp_);
  return *tensors_;
}

std::unique_ptr<Model> Model::load(const std::string& path, const LoadOptions& opt) {
  return load(ModelFile::open(path), opt);
}

std::unique_ptr<Model> Model::load(const ModelFile& f, const LoadOptions& opt) {
  std::unique_ptr<Model> m(new Model());
  m->file_ = f.shared_file();
  // Everything is checked before any weight is touched.
  m->hp_ = f.hparams();
  m->tensors_ = f.tensors();
  if (opt.on_checked) opt.on_checked(m->hp_);
  const int threads = opt.threads > 0 ? opt.threads : ThreadPool::hardware_threads();
  m->pool_ = std::make_unique<ThreadPool>(threads);
  m->executor_ = opt.make_executor ? opt.make_executor(*m->pool_) : std::make_unique<ReferenceExecutor>(*m->pool_);
  m->weights_ = prepare_forward_weights(m->hp_, m->tensors_, *m->executor_);
  return m;
}

void Model::forward(std::span<const int32_t> tokens, std::span<const int64_t> logit_rows, float* logits) {
  forward(ForwardRequest{tokens, logit_rows, logits});
}

void Model::forward(const ForwardRequest& request) {
  model::forward(hp_, weights_, *executor_, request);
}

void Model::forward_batch(std::span<const ForwardRequest> requests) {
  model::forward_batch(hp_, weights_, *executor_, requests);
}

std::vector<float> Model::forward(std::span<const int32_t> tokens, std::span<const int64_t> logit_rows) {
  std::vector<float> logits(logit_rows.size() * static_cast<size_t>(hp_.n_vocab));
  forward(tokens, logit_rows, logits.data());
  return logits;
}

}  // namespace dllm::model
