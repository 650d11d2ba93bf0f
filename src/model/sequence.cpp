// The per-sequence state machine (sequence.h). The order of every decision is the generation loop's of
// algorithms.md section 6: the cancel flag before each step, the candidates, a skipped step when the
// schedule commits nothing, the pass, the proposals, the choice, the report, the early stop.
#include "model/sequence.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "common/thread_pool.h"

namespace dllm::model {

namespace {

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// GenerateResult::error for a position whose logits leave nothing to commit.
std::string no_finite_logit(int64_t position, int64_t step) {
  return "the model gave canvas position " + std::to_string(position) + " no finite logit at step " +
         std::to_string(step + 1) + " (NaN or infinity: its weights or activations overflowed; the file may be corrupt)";
}

}  // namespace

ForwardRequest step_request(std::span<const int32_t> canvas, const StepNeed& need, KVCache* cache, float* out) {
  ForwardRequest req{canvas, need.rows, out};
  switch (need.pass) {
    case Pass::Exact: break;
    case Pass::Refresh:
    case Pass::Cached:
      req.cache = cache;
      req.cache_mode = need.pass == Pass::Refresh ? CacheMode::Fill : CacheMode::Reuse;
      req.row_begin = need.begin;
      req.row_end = need.end;
      break;
    case Pass::Encode:  // [begin, end) appended to the cached prefix, no logits
      req.tokens = canvas.first(static_cast<size_t>(need.end));
      req.logit_rows = {};
      req.logits = nullptr;
      req.cache = cache;
      req.cache_mode = CacheMode::Extend;
      req.n_prompt = need.end;
      break;
    case Pass::Canvas:  // [begin, end) against the prefix
      req.tokens = canvas.first(static_cast<size_t>(need.end));
      req.cache = cache;
      req.cache_mode = CacheMode::Prefix;
      req.n_prompt = need.begin;
      req.self_cond_logits = need.self_cond;
      req.self_cond_temperature = need.self_cond_temperature;
      req.self_cond_top_k = need.self_cond_top_k;
      break;
  }
  return req;
}

Sequence::Sequence(const GenerateConfig& config, std::span<const int32_t> prompt, int64_t n_vocab,
                   GenerateHooks hooks)
    : cfg_(config), hooks_(std::move(hooks)), V_(n_vocab),
      blocks_(arch_spec(config.arch).sampler == SamplerKind::Blocks), start_(Clock::now()) {
  validate(cfg_, static_cast<int64_t>(prompt.size()));
  res_.prompt_length = static_cast<int64_t>(prompt.size());
  res_.canvas.assign(prompt.begin(), prompt.end());
  res_.canvas.resize(prompt.size() + static_cast<size_t>(cfg_.max_tokens), cfg_.mask_id);
  res_.total_steps = cfg_.effective_steps();
  if (arch_spec(cfg_.arch).sampler == SamplerKind::EntropyBound) {  // blocks of uniform noise after the prompt
    eb_ = true;
    blocks_ = false;
    C_len_ = cfg_.canvas_length;
    res_.canvas.resize(prompt.size());
    nb_ = (cfg_.max_tokens + C_len_ - 1) / C_len_;
    res_.total_steps = nb_ * cfg_.eb.max_steps;
    eb_stop_.emplace(static_cast<int64_t>(cfg_.eb.stability), cfg_.eb.confidence);
  } else if (blocks_) {
    nb_ = llada_block_count(cfg_.max_tokens, cfg_.block_length);
  } else {
    dream_sched_.emplace(cfg_.effective_steps());
  }
  if (cfg_.top_logprobs >= 0) {
    res_.logprobs.resize(static_cast<size_t>(cfg_.max_tokens));
    for (auto& p : res_.logprobs) p.chosen.token = cfg_.mask_id;  // never committed, until it is
  }
}

std::vector<int64_t> Sequence::masked_in(int64_t lo, int64_t hi) const {
  std::vector<int64_t> out;
  for (int64_t j = lo; j < hi; ++j)
    if (res_.canvas[static_cast<size_t>(j)] == cfg_.mask_id) out.push_back(j);
  return out;
}

bool Sequence::cancel_requested() {
  if (cancelled_ || (hooks_.cancel && hooks_.cancel->load())) res_.cancelled = true;
  return res_.cancelled;
}

void Sequence::cancel() { cancelled_ = true; }

void Sequence::finish() {
  if (done_) return;
  done_ = true;
  pending_ = false;
  res_.total_ms = ms_since(start_);
}

const StepNeed* Sequence::next() {
  if (done_) return nullptr;
  if (pending_) {  // planned, not yet run: a cancel still stops it
    if (!cancel_requested()) return &need_;
    finish();
    return nullptr;
  }
  if (eb_) return plan_entropy_bound();
  return blocks_ ? plan_llada() : plan_dream();
}

const StepNeed* Sequence::ask(Pass pass, int64_t begin, int64_t end) {
  need_.pass = pass;
  need_.begin = begin;
  need_.end = end;
  need_.rows.clear();
  const int64_t shift = blocks_ ? 0 : 1;  // Dream reads raw row j-1 for position j (4.6)
  if (cfg_.full_logits) {
    for (int64_t r = 0; r < n(); ++r) need_.rows.push_back(r);
  } else {
    for (int64_t j : C_) need_.rows.push_back(j - shift);
  }
  pending_ = true;
  return &need_;
}

const StepNeed* Sequence::plan_llada() {
  for (;;) {
    if (b_ >= nb_) {
      finish();
      return nullptr;
    }
    if (!block_open_) block_ = llada_block(cfg_.max_tokens, cfg_.block_length, cfg_.effective_steps(), b_);
    const int64_t s = P() + block_.begin, e = P() + block_.end, S = block_.steps;
    if (!block_open_) {
      block_masked_ = static_cast<int64_t>(masked_in(s, e).size());
      refreshed_ = false;
      block_open_ = true;
      i_ = 0;
    }
    if (i_ >= S) {  // the block's steps are done
      ++b_, block_open_ = false;
      continue;
    }
    if (cancel_requested()) {
      finish();
      return nullptr;
    }
    t0_ = Clock::now();
    // Candidates: masked positions up to the block's end (3.3); with the dual cache only the block's
    // rows are recomputed, so only they can be candidates.
    C_ = masked_in(cfg_.dual_cache ? s : P(), e);
    if (C_.empty()) {  // the block is complete: its remaining steps have nothing to do
      ++b_, block_open_ = false;
      continue;
    }
    ev_ = StepEvent{};
    ev_.step = block_.first_step + i_;
    ev_.block = b_;
    ev_.scheduled = llada_step_count(block_masked_, S, i_);
    last_ = b_ == nb_ - 1 && i_ == S - 1;
    if (ev_.scheduled == 0 && cfg_.threshold <= 0) {  // commits nothing: skipped exactly (6.3)
      ev_.skipped = true;
      finish_step(ev_, {}, {});
      ++i_;
      continue;
    }
    Pass pass = Pass::Exact;
    if (cfg_.dual_cache) pass = refreshed_ ? Pass::Cached : Pass::Refresh;
    ev_.cached = pass == Pass::Cached;
    return ask(pass, s, e);
  }
}

const StepNeed* Sequence::plan_dream() {
  const int64_t N = cfg_.effective_steps();
  for (;;) {
    if (i_ >= N || cancel_requested()) {
      finish();
      return nullptr;
    }
    t0_ = Clock::now();
    C_ = masked_in(P(), n());
    if (C_.empty()) {
      finish();
      return nullptr;
    }
    ev_ = StepEvent{};
    ev_.step = i_;
    ev_.scheduled = dream_sched_->count(i_, static_cast<int64_t>(C_.size()));
    last_ = i_ == N - 1;
    if (ev_.scheduled == 0) {
      ev_.skipped = true;
      finish_step(ev_, {}, {});
      ++i_;
      continue;
    }
    return ask(Pass::Exact, 0, 0);
  }
}

const StepNeed* Sequence::plan_entropy_bound() {
  const auto stop_here = [&] {
    if (block_open_) res_.canvas.resize(static_cast<size_t>(n() - C_len_));  // an unfinished block is dropped
    block_open_ = false;
    finish();
    return nullptr;
  };
  if (!block_open_) {
    if (answer_ended_ || b_ >= nb_ || cancel_requested()) return stop_here();
    need_ = StepNeed{};
    if (encoded_ < n()) {  // the prompt, or the previous block's tokens, into the cached prefix first
      need_.pass = Pass::Encode;
      need_.begin = encoded_;
      need_.end = n();
      pending_ = true;
      return &need_;
    }
    for (int64_t i = 0; i < C_len_; ++i)  // a new block from uniform noise
      res_.canvas.push_back(eb_random_token(cfg_.seed, RandomPurpose::EbInit, static_cast<uint64_t>(b_), i, V_));
    block_open_ = true;
    cur_ = cfg_.eb.max_steps;
    sc_.clear();
    eb_stop_->reset();
  }
  if (cancel_requested()) return stop_here();
  t0_ = Clock::now();
  t_ = eb_temperature(cfg_.eb, cur_);
  need_ = StepNeed{};
  need_.pass = Pass::Canvas;
  need_.begin = n() - C_len_;
  need_.end = n();
  for (int64_t r = need_.begin; r < need_.end; ++r) need_.rows.push_back(r);
  if (!sc_.empty()) need_.self_cond = sc_.data(), need_.self_cond_temperature = static_cast<float>(sc_t_);
  need_.self_cond_top_k = cfg_.eb.self_cond_top_k;
  pending_ = true;
  return &need_;
}

bool Sequence::adopt_prefix(int64_t n) {
  if (!eb_ || done_ || encoded_ != 0 || res_.forward_passes != 0 || n < 1 || n > P()) return false;
  // The prompt's encoding may be planned already: it starts after the adopted positions (or is not needed).
  if (pending_ && (need_.pass != Pass::Encode || need_.begin != 0)) return false;
  encoded_ = n;
  res_.cached_prompt_tokens = n;
  if (pending_) {
    need_.begin = n;
    if (n == need_.end) pending_ = false;  // the whole prompt: next() plans the first canvas step
  }
  return true;
}

void Sequence::commit_entropy_bound(const float* logits, std::vector<float>* owner) {
  pending_ = false;
  if (need_.pass == Pass::Encode) {
    encoded_ = need_.end;
    return;
  }
  ++res_.forward_passes;
  const int64_t C = C_len_, base = n() - C;
  const uint64_t g = static_cast<uint64_t>(gstep_);
  std::vector<EbPosition> pos(static_cast<size_t>(C));
  auto one = [&](int64_t i, int) {
    pos[static_cast<size_t>(i)] = eb_position(logits + i * V_, V_, t_, RowRandom(cfg_.seed, RandomPurpose::EbSample, g, static_cast<uint64_t>(i)));
  };
  if (hooks_.pool && C > 1) {
    hooks_.pool->parallel_for(C, one);
  } else {
    for (int64_t i = 0; i < C; ++i) one(i, 0);
  }
  std::vector<double> entropy(static_cast<size_t>(C));
  std::vector<int32_t> argmax(static_cast<size_t>(C));
  double mean = 0;
  for (int64_t i = 0; i < C; ++i) {
    const EbPosition& e = pos[static_cast<size_t>(i)];
    if (!e.finite) {
      res_.error = no_finite_logit(base + i, gstep_);
      res_.canvas.resize(static_cast<size_t>(base));
      block_open_ = false;
      finish();
      return;
    }
    entropy[static_cast<size_t>(i)] = e.entropy, argmax[static_cast<size_t>(i)] = e.argmax, mean += e.entropy;
  }
  mean /= static_cast<double>(C);
  // Accepted positions take their sample; every other one a fresh random token.
  const std::vector<uint8_t> accepted = eb_accept(entropy, cfg_.eb.entropy_bound);
  committed_.clear();
  for (int64_t i = 0; i < C; ++i) {
    const size_t k = static_cast<size_t>(i);
    res_.canvas[static_cast<size_t>(base + i)] =
        accepted[k] ? pos[k].sample : eb_random_token(cfg_.seed, RandomPurpose::EbNoise, g, i, V_);
    if (accepted[k]) committed_.push_back(base + i);
  }
  // The next step's self-conditioning: these logits at this temperature (their first C rows are the canvas's).
  if (owner && owner->data() == logits && static_cast<int64_t>(owner->size()) >= C * V_) sc_.swap(*owner);
  else sc_.assign(logits, logits + C * V_);
  sc_t_ = t_;
  const bool block_done = eb_stop_->update(argmax, mean) || cur_ == 1;
  const int64_t block = b_;
  if (block_done) end_block(argmax);  // the block's tokens join the answer before the step is reported
  StepEvent ev;
  ev.step = gstep_;
  ev.total_steps = res_.total_steps;
  ev.block = block;
  ev.scheduled = static_cast<int64_t>(committed_.size());
  ev.committed = committed_;
  ev.masked_left = C - static_cast<int64_t>(committed_.size());  // re-noised
  ev.canvas = res_.canvas;
  ev.prompt_length = P();
  ev.open_begin = block_done ? -1 : base;
  ev.temperature = t_;
  ev.mean_entropy = mean;
  ev.ms = ms_since(t0_);
  ++res_.steps_run;
  res_.step_ms.push_back(ev.ms);
  res_.forward_ms += ev.ms;
  if (hooks_.on_step) hooks_.on_step(ev);
  ++gstep_;
  --cur_;
}

void Sequence::end_block(const std::vector<int32_t>& argmax) {
  // The block's result is its last argmax canvas: appended up to max_tokens in all, and up to the first stop
  // token, which ends the answer.
  res_.canvas.resize(static_cast<size_t>(n() - C_len_));
  const int64_t room = cfg_.max_tokens - (n() - P());
  for (int64_t i = 0; i < std::min(C_len_, room); ++i) {
    const int32_t t = argmax[static_cast<size_t>(i)];
    res_.canvas.push_back(t);
    ++res_.committed;
    if (std::find(cfg_.stop_ids.begin(), cfg_.stop_ids.end(), t) != cfg_.stop_ids.end()) {
      answer_ended_ = true;
      break;
    }
  }
  block_open_ = false;
  ++b_;
  if (answer_ended_ || b_ >= nb_) finish();
}

void Sequence::commit(const float* logits, std::vector<float>* owner) {
  if (!pending_) return;
  if (eb_) return commit_entropy_bound(logits, owner);
  pending_ = false;
  ++res_.forward_passes;
  const bool llada = blocks_;
  const uint64_t ustep = static_cast<uint64_t>(ev_.step);
  std::vector<Candidate> cand(C_.size());
  // Positions whose proposed token has no finite logit (the samplers skip NaN, so this is a row without
  // any number, or one overflowed to infinity): nothing can be committed there.
  std::vector<char> broken(C_.size(), 0);
  auto one = [&](int64_t c, int) {
    const int64_t j = C_[static_cast<size_t>(c)];
    const float* l = row_logits(logits, static_cast<size_t>(c));
    const Proposal p = llada ? llada_propose(l, V_, cfg_.temperature, cfg_.remasking, cfg_.seed, ustep, j)
                             : dream_propose(l, V_, cfg_.temperature, cfg_.remasking, cfg_.seed, ustep, j);
    cand[static_cast<size_t>(c)] = Candidate{j, p};
    broken[static_cast<size_t>(c)] = !std::isfinite(l[p.token]);
  };
  if (hooks_.pool && C_.size() > 1) {
    hooks_.pool->parallel_for(static_cast<int64_t>(C_.size()), one);
  } else {
    for (size_t c = 0; c < C_.size(); ++c) one(static_cast<int64_t>(c), 0);
  }
  for (size_t c = 0; c < C_.size(); ++c) {
    if (!broken[c]) continue;
    res_.error = no_finite_logit(C_[c], ev_.step);
    finish();
    return;
  }
  const auto chosen = llada ? select_candidates(cand, ev_.scheduled, cfg_.threshold)
                            : select_candidates(cand, ev_.scheduled);
  if (llada) refreshed_ = true;
  if (cfg_.top_logprobs >= 0) record_logprobs(logits, cand, chosen);
  const bool stop = finish_step(ev_, cand, chosen);
  ++i_;
  if (stop) finish();
}

const float* Sequence::row_logits(const float* logits, size_t c) const {
  const int64_t j = C_[c];
  const int64_t row = cfg_.full_logits ? (blocks_ ? j : j - 1) : static_cast<int64_t>(c);  // Dream: j - 1 (4.6)
  return logits + row * V_;
}

void Sequence::record_logprobs(const float* logits, const std::vector<Candidate>& cand,
                               const std::vector<size_t>& chosen) {
  auto one = [&](int64_t i, int) {
    const size_t c = chosen[static_cast<size_t>(i)];
    PositionLogprobs& p = res_.logprobs[static_cast<size_t>(cand[c].position - P())];
    p = position_logprobs(row_logits(logits, c), V_, cand[c].proposal.token, cfg_.temperature, cfg_.top_logprobs);
    p.step = ev_.step;
  };
  if (hooks_.pool && chosen.size() > 1) {
    hooks_.pool->parallel_for(static_cast<int64_t>(chosen.size()), one);
  } else {
    for (size_t i = 0; i < chosen.size(); ++i) one(static_cast<int64_t>(i), 0);
  }
}

bool Sequence::finish_step(StepEvent ev, const std::vector<Candidate>& cand, const std::vector<size_t>& chosen) {
  committed_.clear();
  for (size_t i : chosen) {
    const Candidate& c = cand[i];
    res_.canvas[static_cast<size_t>(c.position)] = c.proposal.token;
    committed_.push_back(c.position);
  }
  res_.committed += static_cast<int64_t>(committed_.size());
  ev.committed = committed_;
  ev.total_steps = res_.total_steps;
  ev.masked_left = std::count(res_.canvas.begin() + P(), res_.canvas.end(), cfg_.mask_id);
  ev.canvas = res_.canvas;
  ev.prompt_length = P();
  ev.logprobs = res_.logprobs;
  ev.ms = ms_since(t0_);
  ++res_.steps_run;
  res_.step_ms.push_back(ev.ms);
  if (!ev.skipped) res_.forward_ms += ev.ms;
  if (hooks_.on_step) hooks_.on_step(ev);
  if (ev.skipped || !cfg_.early_stop) return false;
  if (!answer_is_final(res_.canvas, P(), cfg_.mask_id, cfg_.stop_ids)) return false;
  res_.stopped_early = ev.masked_left > 0 && !last_;
  return true;
}

}  // namespace dllm::model
