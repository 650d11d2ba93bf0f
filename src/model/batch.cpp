// The continuous batch (batch.h).
#include "model/batch.h"

#include <algorithm>

#include "common/error.h"
#include "model/model.h"

namespace dllm::model {

Batch::Batch(Model& model, BatchLimits limits) : model_(model), limits_(limits) {
  if (limits_.max_sequences < 1) throw Error("internal error: a batch needs room for at least one sequence");
}

Batch::~Batch() = default;

int64_t Batch::add(const GenerateConfig& config, std::span<const int32_t> prompt, GenerateHooks hooks) {
  const int64_t V = model_.n_vocab();
  for (size_t i = 0; i < prompt.size(); ++i) {
    if (prompt[i] < 0 || prompt[i] >= V) {
      throw Error("prompt token id " + std::to_string(prompt[i]) + " at position " + std::to_string(i) +
                  " is out of range: the vocabulary has " + std::to_string(V) + " tokens");
    }
  }
  auto slot = std::make_unique<Slot>();
  slot->id = next_id_;
  slot->seq = std::make_unique<Sequence>(config, prompt, V, std::move(hooks));
  waiting_.push_back(std::move(slot));
  return next_id_++;
}

void Batch::cancel(int64_t id) {
  for (auto& s : running_)
    if (s->id == id) s->cancel = true;
  for (auto& s : waiting_)
    if (s->id == id) s->cancel = true;
}

// Rows a sequence's next pass computes (its whole canvas, or the dual cache's block).
int64_t Batch::rows_of(const Slot& s) const {
  const StepNeed* need = s.seq->finished() ? nullptr : s.seq->next();
  if (!need) return 0;
  const bool part = need->pass == Pass::Cached || need->pass == Pass::Encode || need->pass == Pass::Canvas;
  return part ? need->end - need->begin : static_cast<int64_t>(s.seq->canvas().size());
}

void Batch::advance(Slot& s) {
  if (s.cancel) s.seq->cancel();
  s.seq->next();  // processes steps that need no pass; finishes the sequence when nothing is left
}

void Batch::adopt_prefix(Slot& s) {
  if (!prefix_cache_ || !s.seq->prefixed() || s.cache.handle.valid()) return;
  const int64_t P = s.seq->prompt_length();
  const PrefixCache::Hit hit = prefix_cache_->find(s.seq->canvas().first(static_cast<size_t>(P)), P);
  if (hit.length == 0) return;
  restore_prefix(model_.hparams(), model_.executor(), s.cache, hit.length, hit.entry->kv,
                 static_cast<int64_t>(hit.entry->ids.size()), static_cast<int64_t>(s.seq->canvas().size()));
  if (!s.seq->adopt_prefix(hit.length)) s.cache.reset();
}

void Batch::retire() {
  auto done = [](const std::unique_ptr<Slot>& s) { return s->seq->finished(); };
  for (auto& s : running_) {
    if (done(s)) {
      // A DiffusionGemma sequence's encoded prefix (prompt and finished blocks) stays for the next request.
      if (prefix_cache_ && s->seq->prefixed() && s->seq->result().error.empty() && s->cache.n > 0 &&
          s->cache.n <= static_cast<int64_t>(s->seq->canvas().size())) {
        const auto ids = s->seq->canvas().first(static_cast<size_t>(s->cache.n));
        prefix_cache_->insert({std::vector<int32_t>(ids.begin(), ids.end()), read_prefix(s->cache)});
      }
      s->cache.reset();  // the dual cache's keys and values go at once
      finished_.emplace_back(s->id, s->seq->take_result());
    }
  }
  running_.erase(std::remove_if(running_.begin(), running_.end(), done), running_.end());
}

bool Batch::step() {
  // Cancelled waiting sequences finish without joining.
  for (auto it = waiting_.begin(); it != waiting_.end();) {
    if ((*it)->cancel) {
      (*it)->seq->cancel();
      (*it)->seq->next();
      finished_.emplace_back((*it)->id, (*it)->seq->take_result());
      it = waiting_.erase(it);
    } else {
      ++it;
    }
  }
  for (auto& s : running_) advance(*s);
  retire();
  // Admit in order while there is room: sequences, and rows when limited (an empty batch takes any one).
  int64_t rows = 0;
  for (const auto& s : running_) rows += rows_of(*s);
  while (!waiting_.empty() && static_cast<int64_t>(running_.size()) < limits_.max_sequences) {
    Slot& s = *waiting_.front();
    advance(s);
    if (s.seq->finished()) {  // nothing to do at all (cancelled through its hooks)
      finished_.emplace_back(s.id, s.seq->take_result());
      waiting_.pop_front();
      continue;
    }
    adopt_prefix(s);
    const int64_t r = rows_of(s);
    if (limits_.max_rows > 0 && !running_.empty() && rows + r > limits_.max_rows) break;
    rows += r;
    running_.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
  }
  // One forward pass over every sequence's need.
  const int64_t V = model_.n_vocab();
  std::vector<ForwardRequest> reqs;
  std::vector<Slot*> in_pass;
  for (auto& s : running_) {
    const StepNeed* next = s->seq->next();
    if (!next) continue;  // cancelled since it was planned: it leaves below
    const StepNeed& need = *next;
    in_pass.push_back(s.get());
    s->logits.resize(need.rows.size() * static_cast<size_t>(V));
    reqs.push_back(step_request(s->seq->canvas(), need, &s->cache, s->logits.data()));
  }
  if (reqs.empty()) {
    retire();
    return !waiting_.empty();
  }
  model_.forward_batch(reqs);
  ++passes_;
  last_rows_ = rows;
  last_sequences_ = static_cast<int64_t>(in_pass.size());
  for (Slot* s : in_pass) {
    s->seq->commit(s->logits.data(), &s->logits);
    advance(*s);
  }
  retire();
  return true;
}

void Batch::run() {
  while (step()) {
  }
}

std::vector<std::pair<int64_t, GenerateResult>> Batch::take_finished() {
  return std::exchange(finished_, {});
}

}  // namespace dllm::model
