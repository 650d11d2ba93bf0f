// The whole-model forward pass on the GPU (gpu_forward.h). The sequence of launches mirrors
// model::forward step for step, so the two can be compared row for row.
#include "jit/cuda/gpu_forward.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>

#include "model/error.h"
#include "model/quant.h"

namespace dllm::jit::cuda {

namespace {

DeviceBuffer upload_vector(Device& dev, std::span<const float> v) {
  if (v.empty()) return {};
  DeviceBuffer b(dev, v.size() * sizeof(float));
  dev.upload(b.addr(), v.data(), b.bytes());
  return b;
}

}  // namespace

std::string GpuProfile::report() const {
  if (steps == 0) return "gpu profile: no whole-model pass ran (dual-cache passes are not profiled)";
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "gpu profile (synchronised per kernel group, not for benchmarking), per step: gemm %.2f ms, "
                "attention %.2f ms, lm head %.2f ms, transfer %.2f ms",
                per_step_ms(gemm_s), per_step_ms(attention_s), per_step_ms(lm_head_s), per_step_ms(transfer_s));
  return buf;
}

GpuForward::GpuForward(Device& dev, ThreadPool& pool, const model::HParams& hp, const model::ForwardWeights& fw,
                       const std::vector<GpuWeight>& weights, const model::Executor& host)
    : dev_(dev), pool_(pool), hp_(hp), fw_(fw), weights_(weights) {
  // Every matrix must be on the device already (GpuExecutor::prepare_weight) and have a kernel; each
  // reads activations quantised in its format.
  KernelSet set;
  auto need = [&](model::WeightHandle h, QuantMode mode) {
    const GpuWeight& w = weight(h);
    set.add(w.desc());
    set.add(QuantDesc{mode, act_format_for(w.layout.format), w.layout.k});
  };
  for (const auto& l : fw.layers) {
    for (model::WeightHandle h : {l.wq, l.wk, l.wv, l.ffn_gate, l.ffn_up}) need(h, QuantMode::RmsNorm);
    need(l.wo, QuantMode::Plain);
    need(l.ffn_down, QuantMode::SwiGlu);
  }
  need(fw.output, QuantMode::RmsNorm);
  if (const std::string err = head_dim_error(hp.head_dim, hp.n_rot); !err.empty()) throw Error(err);
  set.add(q_pack_desc(hp));
  set.add(k_pack_desc(hp));
  set.add(v_pack_desc(hp));
  set.add(attn_desc(hp));
  dev.load_kernels(set);

  layers_.resize(fw.layers.size());
  for (size_t i = 0; i < fw.layers.size(); ++i) {
    const auto& l = fw.layers[i];
    layers_[i].attn_norm = upload_vector(dev, host.host_vector(l.attn_norm));
    layers_[i].ffn_norm = upload_vector(dev, host.host_vector(l.ffn_norm));
    layers_[i].bq = upload_vector(dev, host.host_vector(l.bq));
    layers_[i].bk = upload_vector(dev, host.host_vector(l.bk));
    layers_[i].bv = upload_vector(dev, host.host_vector(l.bv));
  }
  output_norm_ = upload_vector(dev, host.host_vector(fw.output_norm));
}

const GpuWeight& GpuForward::weight(model::WeightHandle h) const {
  if (h.index < 0 || static_cast<size_t>(h.index) >= weights_.size()) {
    throw Error("internal error: invalid GPU weight handle " + std::to_string(h.index));
  }
  return weights_[static_cast<size_t>(h.index)];
}

// cos/sin of position * base^(-2p/n_rot), in double exactly as the reference computes them.
void GpuForward::ensure_positions(int64_t n) {
  if (n <= pos_cap_) return;
  const int64_t cap = std::max<int64_t>(pad_rows(n), std::min<int64_t>(2 * pos_cap_, hp_.n_ctx));
  const int64_t half = hp_.n_rot / 2;
  std::vector<double> c(static_cast<size_t>(cap * half)), s(c.size());
  std::vector<int> pos(static_cast<size_t>(cap));
  for (int64_t p = 0; p < half; ++p) {
    const double inv_freq = std::pow(static_cast<double>(hp_.rope_base),
                                     -2.0 * static_cast<double>(p) / static_cast<double>(hp_.n_rot));
    for (int64_t i = 0; i < cap; ++i) {
      const double theta = static_cast<double>(i) * inv_freq;
      c[static_cast<size_t>(i * half + p)] = std::cos(theta);
      s[static_cast<size_t>(i * half + p)] = std::sin(theta);
    }
  }
  for (int64_t i = 0; i < cap; ++i) pos[static_cast<size_t>(i)] = static_cast<int>(i);
  cos_ = DeviceBuffer(dev_, c.size() * sizeof(double));
  dev_.upload(cos_.addr(), c.data(), cos_.bytes());
  sin_ = DeviceBuffer(dev_, s.size() * sizeof(double));
  dev_.upload(sin_.addr(), s.data(), sin_.bytes());
  pos_ = DeviceBuffer(dev_, pos.size() * sizeof(int));
  dev_.upload(pos_.addr(), pos.data(), pos_.bytes());
  pos_cap_ = cap;
}

template <class F>
void GpuForward::timed(double& slot, F&& f) {
  if (!profiling_) {
    f();
    return;
  }
  dev_.synchronize();
  const auto t0 = std::chrono::steady_clock::now();
  f();
  dev_.synchronize();
  slot += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

size_t GpuForward::workspace_bytes(const model::HParams& hp, int64_t n, int64_t m) {
  const int64_t D = hp.n_embd, Q = hp.q_dim(), KV = hp.kv_dim(), F = hp.n_ff;
  const int64_t kmax = std::max({D, Q, F});
  size_t b = act_bytes(n, kmax) + 2 * act_scale_bytes(n, kmax);
  b += static_cast<size_t>(n) * sizeof(float) * static_cast<size_t>(D + Q + 2 * KV + Q + 2 * F);
  b += packed_heads_bytes(hp.n_head, hp.head_dim, n) + 2 * packed_heads_bytes(hp.n_head_kv, hp.head_dim, n);
  b += static_cast<size_t>(m) * static_cast<size_t>(hp.n_vocab) * sizeof(float);
  b += static_cast<size_t>(pad_rows(n)) * static_cast<size_t>(hp.n_rot + 1) * sizeof(double);  // RoPE tables
  return b + b / 4;  // growth headroom of the scratch buffers
}

void GpuForward::forward(const model::ForwardRequest& req) {
  if (req.cache_mode != model::CacheMode::None) {
    throw Error("internal error: the GPU forward pass has no key/value cache (use the executor path)");
  }
  model::check_canvas(hp_, req.tokens, req.logit_rows);
  const int64_t n = static_cast<int64_t>(req.tokens.size());
  const int64_t m = static_cast<int64_t>(req.logit_rows.size());
  if (m == 0) return;
  if (!req.logits) throw Error("internal error: forward without a logits buffer");
  const int64_t D = hp_.n_embd, Q = hp_.q_dim(), KV = hp_.kv_dim(), F = hp_.n_ff, V = hp_.n_vocab;
  const float eps = hp_.rms_eps;
  constexpr size_t f4 = sizeof(float);

  ensure_positions(n);
  const DevAddr x = x_.get(dev_, static_cast<size_t>(n * D) * f4);
  const DevAddr qf = qf_.get(dev_, static_cast<size_t>(n * Q) * f4);
  const DevAddr kf = kf_.get(dev_, static_cast<size_t>(n * KV) * f4);
  const DevAddr vf = vf_.get(dev_, static_cast<size_t>(n * KV) * f4);
  const DevAddr att = att_.get(dev_, static_cast<size_t>(n * Q) * f4);
  const DevAddr gate = gate_.get(dev_, static_cast<size_t>(n * F) * f4);
  const DevAddr up = up_.get(dev_, static_cast<size_t>(n * F) * f4);
  const DevAddr qh = qh_.get(dev_, packed_heads_bytes(hp_.n_head, hp_.head_dim, n));
  const DevAddr kh = kh_.get(dev_, packed_heads_bytes(hp_.n_head_kv, hp_.head_dim, n));
  const DevAddr vt = vt_.get(dev_, packed_heads_bytes(hp_.n_head_kv, hp_.head_dim, n));
  const DevAddr rows = rows_.get(dev_, static_cast<size_t>(m) * sizeof(int));
  const DevAddr logits = logits_.get(dev_, static_cast<size_t>(m * V) * f4);

  // --- embeddings (dequantised on the host, rows of the file's mapping) and the requested rows ---
  host_x_.resize(static_cast<size_t>(n * D));
  const gguf::TensorInfo& emb = *fw_.token_embd;
  pool_.parallel_for(n, [&](int64_t i, int) {
    const uint64_t id = static_cast<uint64_t>(req.tokens[static_cast<size_t>(i)]);
    quant::dequantize_row(emb.type(), emb.data + id * emb.row_bytes(), host_x_.data() + i * D, D);
  });
  std::vector<int> row_map(req.logit_rows.begin(), req.logit_rows.end());
  timed(profile_.transfer_s, [&] {
    dev_.upload(x, host_x_.data(), host_x_.size() * f4);
    dev_.upload(rows, row_map.data(), row_map.size() * sizeof(int));
  });

  const PackDesc qd = q_pack_desc(hp_), kd = k_pack_desc(hp_), vd = v_pack_desc(hp_);
  const AttnDesc ad = attn_desc(hp_);
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hp_.head_dim)));

  for (size_t l = 0; l < fw_.layers.size(); ++l) {
    const auto& L = fw_.layers[l];
    const LayerBuffers& B = layers_[l];
    const GpuWeight &wq = weight(L.wq), &wk = weight(L.wk), &wv = weight(L.wv), &wo = weight(L.wo);
    const GpuWeight &wg = weight(L.ffn_gate), &wu = weight(L.ffn_up), &wd = weight(L.ffn_down);
    // --- attention block ---
    timed(profile_.gemm_s, [&] {
      gpu_quant_for(dev_, QuantMode::RmsNorm, {&wq, &wk, &wv}, x, 0, B.attn_norm.addr(), 0, n, D, eps, act_);
      gpu_gemm(dev_, wq, act_, n, qf, Q, false);
      gpu_gemm(dev_, wk, act_, n, kf, KV, false);
      gpu_gemm(dev_, wv, act_, n, vf, KV, false);
    });
    timed(profile_.attention_s, [&] {
      gpu_pack(dev_, qd, qf, n, Q, B.bq.addr(), cos_.addr(), sin_.addr(), pos_.addr(), qh);
      gpu_pack(dev_, kd, kf, n, KV, B.bk.addr(), cos_.addr(), sin_.addr(), pos_.addr(), kh);
      gpu_pack(dev_, vd, vf, n, KV, B.bv.addr(), 0, 0, 0, vt);
      gpu_attention(dev_, ad, qh, n, kh, vt, n, scale, att);
    });
    timed(profile_.gemm_s, [&] {
      gpu_quant_for(dev_, QuantMode::Plain, {&wo}, att, 0, 0, 0, n, Q, eps, act_);
      gpu_gemm(dev_, wo, act_, n, x, D, true);
      // --- feed-forward block ---
      gpu_quant_for(dev_, QuantMode::RmsNorm, {&wg, &wu}, x, 0, B.ffn_norm.addr(), 0, n, D, eps, act_);
      gpu_gemm(dev_, wg, act_, n, gate, F, false);
      gpu_gemm(dev_, wu, act_, n, up, F, false);
      gpu_quant_for(dev_, QuantMode::SwiGlu, {&wd}, gate, up, 0, 0, n, F, eps, act_);
      gpu_gemm(dev_, wd, act_, n, x, D, true);
    });
  }

  // --- final norm of the requested rows (gathered through the row map) and the LM head ---
  timed(profile_.lm_head_s, [&] {
    const GpuWeight& wout = weight(fw_.output);
    gpu_quant_for(dev_, QuantMode::RmsNorm, {&wout}, x, 0, output_norm_.addr(), rows, m, D, eps, act_);
    gpu_gemm(dev_, wout, act_, m, logits, V, false);
  });
  timed(profile_.transfer_s, [&] { dev_.download(req.logits, logits, static_cast<size_t>(m * V) * f4); });
  ++profile_.steps;
}

}  // namespace dllm::jit::cuda
