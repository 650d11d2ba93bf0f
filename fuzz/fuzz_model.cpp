// libFuzzer target for model loading: arbitrary bytes as a model file, taken the whole way `dllm logits` and
// `dllm run` take a file. The bytes go to an in-memory file (memfd) that ModelFile::open maps; then the
// hyperparameters (every architecture's keys, the mixture-of-experts ones included), the tensor table check,
// the tokenizer, the file's chat template and the prompt ids, and, when all of that passes, Model::load on
// the reference executor and one forward over a short canvas whose logits must be the size asked for.
// A dllm::Error is the expected outcome for bad input; a crash, a sanitizer report, an out-of-memory, a hang
// or another exception is a bug. Seeds: fuzz/seeds-model/ (make_seeds.py writes tiny llada, dream,
// llada-moe and rnd1 files).
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/error.h"
#include "model/chat.h"
#include "model/model.h"
#include "model/tokenizer.h"

namespace {

// The bytes as a file that only this process sees, closed when it goes out of scope.
class MemFile {
 public:
  MemFile(const uint8_t* data, size_t size) : fd_(memfd_create("fuzz-model.gguf", 0)) {
    if (fd_ < 0) __builtin_trap();
    for (size_t done = 0; done < size;) {
      const ssize_t n = write(fd_, data + done, size - done);
      if (n <= 0) __builtin_trap();
      done += static_cast<size_t>(n);
    }
  }
  ~MemFile() { close(fd_); }
  std::string path() const { return "/proc/self/fd/" + std::to_string(fd_); }

 private:
  int fd_;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const MemFile mem(data, size);
  std::optional<dllm::model::ModelFile> file;
  try {
    file.emplace(dllm::model::ModelFile::open(mem.path()));
  } catch (const dllm::Error&) {
    return 0;
  }
  const dllm::model::HParams& hp = file->hparams();
  try {  // what `run` does with the text before the model is loaded
    const dllm::model::Tokenizer tok(file->file());
    std::string note;
    const auto tmpl = dllm::model::chat_template_of(hp.arch_name, tok.chat_template(), &note);
    for (int32_t id : dllm::model::chat_prompt_ids(tok, tmpl, "hi there <|im_end|> \xc3\xa9"))
      if (id < 0 || id >= tok.n_vocab()) __builtin_trap();
  } catch (const dllm::Error&) {
  }
  try {
    file->tensors();
    dllm::model::LoadOptions opt;
    opt.threads = 1;
    const auto model = dllm::model::Model::load(*file, opt);
    const int64_t V = model->n_vocab();
    const int32_t mask = model->mask_token_id();
    const std::vector<int32_t> tokens{0, static_cast<int32_t>(V - 1), mask, mask};
    const std::vector<int64_t> rows{3, 0};
    const std::vector<float> logits = model->forward(tokens, rows);
    if (logits.size() != rows.size() * static_cast<size_t>(V)) __builtin_trap();
  } catch (const dllm::Error&) {
  }
  return 0;
}
