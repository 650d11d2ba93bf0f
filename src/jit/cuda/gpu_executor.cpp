// The GPU executor (gpu_executor.h): weight upload at load, the per-call primitives, and the forward
// program's operations on device-resident buffers.
#include "jit/cuda/gpu_executor.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "jit/cuda/cuda_device.h"
#include "common/error.h"
#include "model/quant.h"

namespace dllm::jit::cuda {

namespace {

constexpr size_t kStageBytes = size_t{64} << 20;  // host staging per upload chunk
constexpr int64_t kTilesPerTask = 16;             // 8-column tiles packed by one pool task

std::string fmt_gib(size_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f GiB", static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0));
  return buf;
}

constexpr size_t kF32 = sizeof(float);
constexpr size_t kMaxSpareBuffers = 4;  // buffers of closed key/value stores kept for the next kv_open

std::string internal(const std::string& what) { return "internal error: " + what; }

}  // namespace

std::string GpuProfile::report() const {
  if (steps == 0) return "gpu profile: no whole-model pass ran";
  char buf[256];
  std::snprintf(buf, sizeof buf, "gpu profile (%s), per step: gemm %.2f ms, attention %.2f ms, lm head %.2f ms, transfer %.2f ms",
                timers ? "device timers per kernel group, graphs off" : "synchronised per kernel group, not for benchmarking",
                per_step_ms(gemm_s), per_step_ms(attention_s), per_step_ms(lm_head_s), per_step_ms(transfer_s));
  return buf;
}

GpuExecutor::GpuExecutor(std::unique_ptr<Device> device, ThreadPool& pool)
    : Executor(&pool), dev_(std::move(device)), pool_(pool) {
  const char* prof = std::getenv("DLLM_GPU_PROFILE");
  profiling_ = prof && *prof && std::string(prof) != "0";
  profile_.timers = profiling_ && dev_->has_timers();
  const char* graphs = std::getenv("DLLM_GPU_GRAPHS");
  graphs_wanted_ = !(graphs && std::string(graphs) == "0");
}

GpuExecutor::~GpuExecutor() = default;

std::unique_ptr<GpuExecutor> GpuExecutor::open(ThreadPool& pool, int ordinal) {
  return std::make_unique<GpuExecutor>(CudaDevice::open(ordinal), pool);
}

// ---------------------------------------------------------------- load time

void GpuExecutor::prepare_model(const model::HParams& hp) {
  if (const std::string err = attention_geometry_error(hp); !err.empty()) throw Error(err);
  hp_ = hp;
  add_attention_kernels(kernels_, hp, {});  // every layer's geometry (Gemma-4: two)
  kernels_.add_row_copy();
  kernels_loaded_ = false;
}

model::WeightHandle GpuExecutor::prepare_weight(const gguf::TensorInfo& t) {
  const PackedLayout L = packed_layout(t);  // throws for types without a GPU kernel
  GpuWeight w;
  w.name = std::string(t.name);
  w.layout = L;
  const size_t qpt = L.quant_bytes_per_tile(), spt = L.scales_per_tile();
  w.quants = DeviceBuffer(*dev_, L.quant_bytes());
  w.scales = DeviceBuffer(*dev_, L.scale_count() * sizeof(float));

  // Pack and upload in chunks of whole pool tasks, so host memory stays bounded for any matrix size.
  const int64_t chunk =
      std::max<int64_t>(kTilesPerTask, static_cast<int64_t>(kStageBytes / qpt) / kTilesPerTask * kTilesPerTask);
  const int64_t stage_tiles = std::min(chunk, L.ntiles);
  std::vector<uint8_t> sq(static_cast<size_t>(stage_tiles) * qpt);
  std::vector<float> ss(static_cast<size_t>(stage_tiles) * spt);
  for (int64_t t0 = 0; t0 < L.ntiles; t0 += chunk) {
    const int64_t t1 = std::min(L.ntiles, t0 + chunk);
    const int64_t tasks = (t1 - t0 + kTilesPerTask - 1) / kTilesPerTask;
    pool_.parallel_for(tasks, [&](int64_t task, int) {
      const int64_t a = t0 + task * kTilesPerTask, b = std::min(t1, a + kTilesPerTask);
      const size_t off = static_cast<size_t>(a - t0);
      pack_tiles(t, L, a, b, sq.data() + off * qpt, ss.data() + off * spt);
    });
    const size_t tiles = static_cast<size_t>(t1 - t0), first = static_cast<size_t>(t0);
    dev_->upload(w.quants.addr() + first * qpt, sq.data(), tiles * qpt);
    if (spt) dev_->upload(w.scales.addr() + first * spt * sizeof(float), ss.data(), tiles * spt * sizeof(float));
  }
  weight_bytes_ += L.device_bytes();
  // The GEMM and the quantisers that feed it: plain (the per-call path, the attention output), RMSNorm
  // for the matrices reading the residual stream, SwiGLU for the down projection (every mode when the
  // model's widths are unknown).
  const ActFormat a = act_format_for(L.format);
  kernels_.add(w.desc());
  kernels_.add(QuantDesc{QuantMode::Plain, a, L.k});
  if (hp_.n_embd == 0 || L.k == hp_.n_embd) kernels_.add(QuantDesc{QuantMode::RmsNorm, a, L.k});
  if (hp_.n_embd == 0 || L.k == hp_.n_ff) kernels_.add(QuantDesc{QuantMode::SwiGlu, a, L.k});
  kernels_loaded_ = false;
  weights_.push_back(std::move(w));
  return model::WeightHandle{static_cast<int32_t>(weights_.size() - 1)};
}

const GpuWeight& GpuExecutor::weight(model::WeightHandle h) const {
  if (h.index < 0 || static_cast<size_t>(h.index) >= weights_.size()) {
    throw Error("internal error: invalid GPU weight handle " + std::to_string(h.index));
  }
  return weights_[static_cast<size_t>(h.index)];
}

void GpuExecutor::load_model_kernels() {
  if (kernels_loaded_) return;
  dev_->load_kernels(kernels_);  // one unit for the whole model
  kernels_loaded_ = true;
  // The small-row GEMMs' workspace, sized once for the largest product or group, so that no step allocates it.
  size_t part = 0, counters = 0;
  for (const GemmDesc& d : kernels_.gemms()) {
    part = std::max(part, gemm_small_part_bytes(d));
    counters = std::max(counters, gemm_small_counters(d));
  }
  for (const GemmGroupDesc& g : kernels_.groups()) {
    size_t gp = 0, gc = 0;
    for (const GemmDesc& d : g.members) gp += gemm_small_part_bytes(d), gc += gemm_small_counters(d);
    part = std::max(part, gp);
    counters = std::max(counters, gc);
  }
  gemm_ws_.ensure(*dev_, part, counters);
}

model::VectorHandle GpuExecutor::prepare_vector(std::span<const float> v) {
  const model::VectorHandle h = Executor::prepare_vector(v);  // the host copy (host_vector) and the index
  DeviceBuffer b;
  if (!v.empty()) {
    b = DeviceBuffer(*dev_, v.size() * kF32);
    dev_->upload(b.addr(), v.data(), b.bytes());
  }
  vectors_.push_back(std::move(b));
  if (static_cast<size_t>(h.index) + 1 != vectors_.size()) throw Error(internal("GPU vector table out of step"));
  return h;
}

DevAddr GpuExecutor::vector_addr(model::VectorHandle h) const {
  if (!h.valid()) return 0;
  if (static_cast<size_t>(h.index) >= vectors_.size()) throw Error(internal("invalid GPU vector handle"));
  return vectors_[static_cast<size_t>(h.index)].addr();
}

// ---------------------------------------------------------------- the per-call primitives

void GpuExecutor::matmul(model::WeightHandle h, const float* x, int64_t rows, float* y) {
  matmul_shared(&h, &y, 1, x, rows);
}

void GpuExecutor::matmul_shared(const model::WeightHandle* ws, float* const* ys, int n, const float* x,
                                int64_t rows) {
  if (rows <= 0 || n <= 0) return;
  if (n > 8) throw Error(internal("matmul_shared takes at most 8 products"));
  const GpuWeight* readers[8];
  for (int i = 0; i < n; ++i) readers[i] = &weight(ws[i]);
  const int64_t k = readers[0]->layout.k;
  for (int i = 1; i < n; ++i) {
    if (readers[i]->layout.k != k) throw Error(internal("matmul_shared over matrices of different widths"));
  }
  load_model_kernels();
  const DevAddr xd = x_.get(*dev_, static_cast<size_t>(rows * k) * kF32);
  dev_->upload(xd, x, static_cast<size_t>(rows * k) * kF32);
  gpu_quant_for(*dev_, QuantMode::Plain, std::span(readers, static_cast<size_t>(n)), xd, 0, 0, 0, rows, k, 0.f, act_);
  for (int i = 0; i < n; ++i) {
    const GpuWeight& w = *readers[i];
    const size_t bytes = static_cast<size_t>(rows * w.layout.n) * kF32;
    const DevAddr yd = y_.get(*dev_, bytes);
    gpu_gemm(*dev_, gemm_ws_, w, act_, rows, yd, w.layout.n, false);
    dev_->download(ys[i], yd, bytes);
  }
}

void GpuExecutor::matmul_grouped(const model::WeightHandle* ws, float* const* ys, int m, const int64_t* row0,
                                 const int64_t* n, int groups, const float* x, int64_t k) {
  // Every group's rows go up once and are quantised once through a row map that starts each group at a multiple of
  // kRowPad (the GEMM's tiles start there; the rows between groups repeat the group's first row, and their products
  // are never stored); each product reads its group's rows, and the outputs come back in one download. A row's quants
  // and products are those of the group's own matmul_shared: the same bits.
  std::vector<const GpuWeight*> readers;
  std::vector<int64_t> start(static_cast<size_t>(groups), 0), map;
  int64_t padded = 0, out_floats = 0, total = 0;
  for (int g = 0; g < groups; ++g) {
    if (n[g] <= 0) continue;
    start[static_cast<size_t>(g)] = padded;
    padded += pad_rows(n[g]);
    total = std::max(total, row0[g] + n[g]);
    for (int64_t i = 0; i < pad_rows(n[g]); ++i) map.push_back(row0[g] + (i < n[g] ? i : 0));
    for (int j = 0; j < m; ++j) {
      const GpuWeight* w = &weight(ws[g * m + j]);
      if (w->layout.k != k) throw Error(internal("matmul_grouped over matrices of another width"));
      readers.push_back(w);
      out_floats += n[g] * w->layout.n;
    }
  }
  if (readers.empty()) return;
  load_model_kernels();
  const DevAddr xd = x_.get(*dev_, static_cast<size_t>(total * k) * kF32);
  dev_->upload(xd, x, static_cast<size_t>(total * k) * kF32);
  gpu_quant_for(*dev_, QuantMode::Plain, readers, xd, 0, 0, row_list(map), padded, k, 0.f, act_);
  const DevAddr yd = y_.get(*dev_, static_cast<size_t>(out_floats) * kF32);
  int64_t at = 0;
  for (int g = 0; g < groups; ++g) {
    if (n[g] <= 0) continue;
    for (int j = 0; j < m; ++j) {
      const GpuWeight& w = weight(ws[g * m + j]);
      gpu_gemm(*dev_, gemm_ws_, w, act_, n[g], yd + static_cast<size_t>(at) * kF32, w.layout.n, false, start[static_cast<size_t>(g)]);
      at += n[g] * w.layout.n;
    }
  }
  host_y_.resize(static_cast<size_t>(out_floats));
  dev_->download(host_y_.data(), yd, host_y_.size() * kF32);
  at = 0;
  for (int g = 0; g < groups; ++g) {
    if (n[g] <= 0) continue;
    for (int j = 0; j < m; ++j) {
      const int64_t len = n[g] * weight(ws[g * m + j]).layout.n;
      std::copy_n(host_y_.data() + at, len, ys[g * m + j]);
      at += len;
    }
  }
}

void GpuExecutor::attention(const model::AttentionShape& sh, const float* q, int64_t n_q, const float* k,
                            const float* v, int64_t n_kv, float* out) {
  if (n_q <= 0) return;
  if (n_kv <= 0 || sh.n_head <= 0 || sh.n_head_kv <= 0 || sh.n_head % sh.n_head_kv != 0) {
    throw Error("internal error: bad attention shape");
  }
  if (const std::string err = head_dim_error(sh.head_dim, sh.head_dim); !err.empty()) throw Error(err);
  const int64_t H = sh.n_head, Hkv = sh.n_head_kv, d = sh.head_dim;
  const PackDesc pq{H, d, d, PackStyle::None, false}, pk{Hkv, d, d, PackStyle::None, false};
  const PackDesc pv{Hkv, d, d, PackStyle::None, true};
  const AttnDesc ad{H, Hkv, d};
  KernelSet set;
  set.add(pq);
  set.add(pk);
  set.add(pv);
  set.add(ad);
  dev_->load_kernels(set);
  const size_t qb = static_cast<size_t>(n_q * H * d) * kF32, kb = static_cast<size_t>(n_kv * Hkv * d) * kF32;
  const DevAddr qd = q_.get(*dev_, qb), kd = k_.get(*dev_, kb), vd = v_.get(*dev_, kb);
  const DevAddr od = out_.get(*dev_, qb);
  const DevAddr qh = qh_.get(*dev_, packed_heads_bytes(H, d, n_q));
  const DevAddr kh = kh_.get(*dev_, packed_heads_bytes(Hkv, d, n_kv));
  const DevAddr vt = vt_.get(*dev_, packed_heads_bytes(Hkv, d, n_kv));
  dev_->upload(qd, q, qb);
  dev_->upload(kd, k, kb);
  dev_->upload(vd, v, kb);
  gpu_pack(*dev_, pq, qd, n_q, H * d, 0, 0, 0, 0, qh);
  gpu_pack(*dev_, pk, kd, n_kv, Hkv * d, 0, 0, 0, 0, kh);
  gpu_pack(*dev_, pv, vd, n_kv, Hkv * d, 0, 0, 0, 0, vt);
  gpu_attention(*dev_, ad, qh, n_q, kh, vt, n_kv, sh.scale, od);
  dev_->download(out, od, qb);
}

// ---------------------------------------------------------------- the forward program's operations

template <class F>
void GpuExecutor::timed(double& slot, F&& f) {
  if (!profiling_) {
    f();
    return;
  }
  if (profile_.timers) {  // marks around the group's work; read at the end of the pass (settle_profile)
    const size_t from = dev_->mark();
    f();
    pending_times_.push_back(PendingTime{&slot, from, dev_->mark()});
    return;
  }
  dev_->synchronize();
  const auto t0 = std::chrono::steady_clock::now();
  f();
  dev_->synchronize();
  slot += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void GpuExecutor::settle_profile() const {
  for (const PendingTime& t : pending_times_) *t.slot += dev_->seconds_between(t.from, t.to);
  pending_times_.clear();
  dev_->clear_marks();
}

size_t GpuExecutor::workspace_bytes(const model::HParams& hp, int64_t n, int64_t m) {
  const int64_t D = hp.n_embd, Q = hp.q_dim(), KV = hp.max_kv_dim(), F = hp.n_ff;
  const int64_t kmax = std::max({D, Q, F});
  size_t b = act_bytes(n, kmax) + 2 * act_scale_bytes(n, kmax);
  b += static_cast<size_t>(n) * kF32 * static_cast<size_t>(D + Q + 2 * KV + Q + 2 * F);  // activation slots
  b += static_cast<size_t>(n) * kF32 * static_cast<size_t>(D + 2 * KV);  // gather scratch, one layer's store
  b += packed_heads_bytes(hp.n_head, hp.head_dim, n) + 2 * packed_heads_bytes(hp.n_head_kv, hp.head_dim, n);
  b += static_cast<size_t>(m) * static_cast<size_t>(hp.n_vocab) * kF32;
  b += static_cast<size_t>(pad_rows(n)) * static_cast<size_t>(hp.n_rot + 1) * sizeof(double);  // RoPE tables
  return b + b / 4;  // growth headroom of the scratch buffers
}

GpuExecutor::DevAct& GpuExecutor::act(model::Act a) {
  const auto it = acts_.find(a.slot);
  if (it == acts_.end()) throw Error(internal("activation slot " + std::to_string(a.slot) + " was never sized"));
  return it->second;
}

DevAddr GpuExecutor::at(model::Act a, int64_t row) {
  const DevAct& b = act(a);
  return b.buf.buf.addr() + static_cast<size_t>(row * b.cols) * kF32;
}

model::Act GpuExecutor::activation(int32_t slot, int64_t rows, int64_t cols) {
  DevAct& b = acts_[slot];
  b.buf.get(*dev_, static_cast<size_t>(std::max<int64_t>(rows, 1) * cols) * kF32);
  b.rows = rows, b.cols = cols;
  return model::Act{slot};
}

void GpuExecutor::end_step_graph(bool logits) {
  if (!in_capture_) return;
  in_capture_ = false;
  if (!dev_->capturing()) {  // a download cut the capture short: this model's steps need the host
    graphs_off_ = "the forward pass reads activations back on the host";
    return;
  }
  step_key_.push_back(logits ? 1 : 0);
  dev_->end_capture(step_key_);
}

void GpuExecutor::embed(const gguf::TensorInfo& table, std::span<const int32_t> ids, model::Act x) {
  if (!pending_times_.empty()) settle_profile();  // the last pass's groups (it may have ended without logits)
  ++profile_.steps;  // every pass of the forward program starts here
  const int64_t n = static_cast<int64_t>(ids.size()), D = table.ne[0];
  end_step_graph(false);  // a pass without logits (keys and values only) ends where the next one starts
  if (n == 0) return;
  // The first pass runs launch by launch: it compiles the kernels and uploads tables once, which later passes skip.
  if (profile_.steps > 1 && graphs_wanted_ && !profiling_ && graphs_off_.empty() && dev_->supports_graphs()) {
    dev_->begin_capture();
    in_capture_ = dev_->capturing();
    step_key_.assign({n});
  }
  if (act(x).cols != D) throw Error(internal("embedding width differs from the activation's"));
  host_x_.resize(static_cast<size_t>(n * D));
  pool_.parallel_for(n, [&](int64_t i, int) {
    const uint64_t id = static_cast<uint64_t>(ids[static_cast<size_t>(i)]);
    quant::dequantize_row(table.type(), table.data + id * table.row_bytes(), host_x_.data() + i * D, D);
  });
  timed(profile_.transfer_s, [&] { dev_->upload(at(x), host_x_.data(), host_x_.size() * kF32); });
}

void GpuExecutor::norm_matmul(model::Act x, int64_t rows, model::VectorHandle norm, float eps,
                              const model::WeightHandle* ws, const model::Act* ys, int n) {
  if (rows <= 0 || n <= 0) return;
  if (n > 8) throw Error(internal("norm_matmul takes at most 8 products"));
  const GpuWeight* readers[8];
  for (int i = 0; i < n; ++i) {
    readers[i] = &weight(ws[i]);
    if (act(ys[i]).cols != readers[i]->layout.n) throw Error(internal("product width differs from its activation's"));
  }
  load_model_kernels();
  const std::span<const GpuWeight* const> rs(readers, static_cast<size_t>(n));
  const GemmGroupDesc group = gemm_group_of(rs);
  const bool grouped = gemm_group_ok(group.members) && kernels_.contains(group);  // announced by prepare_shared
  timed(profile_.gemm_s, [&] {
    gpu_quant_for(*dev_, QuantMode::RmsNorm, rs, at(x), 0, vector_addr(norm), 0, rows, act(x).cols, eps, act_);
    if (grouped) {
      DevAddr y[3];
      int64_t ld[3];
      for (int i = 0; i < n; ++i) y[i] = at(ys[i]), ld[i] = act(ys[i]).cols;
      gpu_gemm_group(*dev_, gemm_ws_, rs, act_, rows, std::span(y, static_cast<size_t>(n)), std::span(ld, static_cast<size_t>(n)));
      return;
    }
    for (int i = 0; i < n; ++i) gpu_gemm(*dev_, gemm_ws_, *readers[i], act_, rows, at(ys[i]), act(ys[i]).cols, false);
  });
}

void GpuExecutor::prepare_shared(const model::WeightHandle* ws, int n) {
  if (n < 2 || n > 3) return;
  GemmGroupDesc g;
  for (int i = 0; i < n; ++i) {
    if (!ws[i].valid()) return;
    g.members.push_back(weight(ws[i]).desc());
  }
  if (!gemm_group_ok(g.members)) return;
  kernels_.add(g);
  kernels_loaded_ = false;
}

void GpuExecutor::prepare_swiglu_ffn(model::WeightHandle gate, model::WeightHandle up, model::WeightHandle down) {
  if (!gate.valid() || !up.valid() || !down.valid()) return;
  const GemmGroupDesc g = swiglu_group(weight(gate).desc(), weight(up).desc(), weight(down).desc());
  if (g.members.empty()) return;
  kernels_.add(g);
  kernels_loaded_ = false;
}

void GpuExecutor::prepare_output_projection(model::WeightHandle wo) {
  if (!wo.valid()) return;
  KernelSet quant;
  add_attention_kernels(quant, hp_, {act_format_for(weight(wo).layout.format)});
  for (const AttnDesc& d : quant.attns()) {
    if (d.quant && !kernels_.contains(d)) kernels_.add(d), kernels_loaded_ = false;
  }
}

void GpuExecutor::norm_swiglu_ffn(model::Act x, int64_t rows, model::VectorHandle norm, float eps,
                                  model::WeightHandle gate_w, model::WeightHandle up_w, model::WeightHandle down_w,
                                  model::Act gate, model::Act up) {
  if (rows <= 0) return;
  const GpuWeight* rs[2] = {&weight(gate_w), &weight(up_w)};
  const GpuWeight* down = &weight(down_w);
  const GemmGroupDesc g = swiglu_group(rs[0]->desc(), rs[1]->desc(), down->desc());
  load_model_kernels();
  if (!fusion_ || g.members.empty() || !kernels_.contains(g) || act(gate).cols != rs[0]->layout.n ||
      act(up).cols != rs[1]->layout.n) {
    Executor::norm_swiglu_ffn(x, rows, norm, eps, gate_w, up_w, down_w, gate, up);
    return;
  }
  timed(profile_.gemm_s, [&] {
    gpu_quant_for(*dev_, QuantMode::RmsNorm, rs, at(x), 0, vector_addr(norm), 0, rows, act(x).cols, eps, act_);
    const DevAddr ys[2] = {at(gate), at(up)};
    gpu_gemm_group_swiglu(*dev_, gemm_ws_, rs, act_, rows, ys, act(gate).cols, g.swiglu_act, act_ffn_);
    gpu_gemm(*dev_, gemm_ws_, *down, act_ffn_, rows, at(x), act(x).cols, true);  // the residual added in the epilogue
  });
}

void GpuExecutor::expect_projection(model::Act out, int64_t rows, model::WeightHandle w) {
  proj_ = Projection{};
  if (!fusion_ || rows <= 0 || !w.valid()) return;
  const GpuWeight& wo = weight(w);
  if (wo.layout.k != act(out).cols) return;
  act_att_.ensure(*dev_, rows, wo.layout.k);
  act_att_.format = act_format_for(wo.layout.format);
  act_att_.rows = rows;
  act_att_.k = wo.layout.k;
  proj_ = Projection{out.slot, w.index, rows, 0};
}

void GpuExecutor::matmul_add(model::WeightHandle h, model::Act x, int64_t rows, model::Act y) {
  const bool quantised = proj_.slot == x.slot && proj_.weight == h.index && proj_.rows == rows && proj_.covered == rows;
  proj_ = Projection{};
  if (rows <= 0) return;
  const GpuWeight* w = &weight(h);
  load_model_kernels();
  timed(profile_.gemm_s, [&] {
    if (quantised) {  // every row quantised by the attention's launches
      gpu_gemm(*dev_, gemm_ws_, *w, act_att_, rows, at(y), act(y).cols, true);
      return;
    }
    gpu_quant_for(*dev_, QuantMode::Plain, std::span(&w, 1), at(x), 0, 0, 0, rows, act(x).cols, 0.f, act_);
    gpu_gemm(*dev_, gemm_ws_, *w, act_, rows, at(y), act(y).cols, true);  // the residual added in the epilogue
  });
}

void GpuExecutor::swiglu_matmul_add(model::WeightHandle h, model::Act gate, model::Act up, int64_t rows,
                                    model::Act y) {
  if (rows <= 0) return;
  const GpuWeight* w = &weight(h);
  load_model_kernels();
  timed(profile_.gemm_s, [&] {
    gpu_quant_for(*dev_, QuantMode::SwiGlu, std::span(&w, 1), at(gate), at(up), 0, 0, rows, act(gate).cols, 0.f,
                  act_);
    gpu_gemm(*dev_, gemm_ws_, *w, act_, rows, at(y), act(y).cols, true);
  });
}

template <class F>
void GpuExecutor::on_host(std::initializer_list<model::Act> acts, std::initializer_list<model::Act> outs, F&& f) {
  const auto bytes = [](const DevAct& d) { return static_cast<size_t>(d.rows * d.cols) * kF32; };
  timed(profile_.transfer_s, [&] {
    for (model::Act a : acts) {
      const DevAct& d = act(a);
      Executor::activation(a.slot, d.rows, d.cols);
      if (d.rows > 0) dev_->download(host_data(a), d.buf.buf.addr(), bytes(d));
    }
  });
  timed(profile_.gemm_s, f);  // host work around the device's products
  timed(profile_.transfer_s, [&] {
    for (model::Act a : outs) {
      const DevAct& d = act(a);
      if (d.rows > 0) dev_->upload(d.buf.buf.addr(), host_data(a), bytes(d));
    }
  });
}

void GpuExecutor::glu_matmul(model::Glu glu, model::WeightHandle h, model::Act gate, model::Act up, int64_t rows,
                             model::Act y) {
  if (rows <= 0) return;
  if (glu == model::Glu::SiLU) {  // the SwiGLU quantiser, the product written
    const GpuWeight* w = &weight(h);
    load_model_kernels();
    timed(profile_.gemm_s, [&] {
      gpu_quant_for(*dev_, QuantMode::SwiGlu, std::span(&w, 1), at(gate), at(up), 0, 0, rows, act(gate).cols, 0.f,
                    act_);
      gpu_gemm(*dev_, gemm_ws_, *w, act_, rows, at(y), act(y).cols, false);
    });
    return;
  }
  on_host({gate, up, y}, {y}, [&] { Executor::glu_matmul(glu, h, gate, up, rows, y); });
}

void GpuExecutor::matmul_norm_add(model::WeightHandle w, model::Act x, int64_t rows, model::VectorHandle norm,
                                  float eps, model::Act y) {
  if (rows > 0) on_host({x, y}, {y}, [&] { Executor::matmul_norm_add(w, x, rows, norm, eps, y); });
}

void GpuExecutor::norm(model::Act x, int64_t rows, model::VectorHandle w, float eps, model::Act y) {
  if (rows > 0) on_host({x, y}, {y}, [&] { Executor::norm(x, rows, w, eps, y); });
}

void GpuExecutor::norm_add(model::Act x, int64_t rows, model::VectorHandle w, float eps, model::Act y) {
  if (rows > 0) on_host({x, y}, {y}, [&] { Executor::norm_add(x, rows, w, eps, y); });
}

void GpuExecutor::add(model::Act x, int64_t rows, model::Act y) {
  if (rows > 0) on_host({x, y}, {y}, [&] { Executor::add(x, rows, y); });
}

void GpuExecutor::scale_rows(model::Act x, std::span<const float> s) {
  if (!s.empty()) on_host({x}, {x}, [&] { Executor::scale_rows(x, s); });
}

void GpuExecutor::soft_embed(const gguf::TensorInfo& table, const float* logits, int64_t rows, float temperature,
                             int64_t top_k, float scale, model::Act x) {
  if (rows > 0) on_host({x}, {x}, [&] { Executor::soft_embed(table, logits, rows, temperature, top_k, scale, x); });
}

void GpuExecutor::head_norm(model::Act x, int64_t rows, int64_t n_heads, int64_t head_dim, model::VectorHandle w,
                            float eps) {
  if (rows <= 0) return;
  if (act(x).cols != n_heads * head_dim) throw Error(internal("head_norm over an activation of another width"));
  on_host({x}, {x}, [&] { Executor::head_norm(x, rows, n_heads, head_dim, w, eps); });
}

void GpuExecutor::moe_ffn(const model::MoeLayer& m, model::Act x, int64_t rows, model::VectorHandle norm, float eps) {
  if (rows > 0) on_host({x}, {x}, [&] { Executor::moe_ffn(m, x, rows, norm, eps); });
}

void GpuExecutor::moe_ffn_to(const model::MoeLayer& m, model::Act x, int64_t rows, model::VectorHandle norm, float eps,
                             model::Act out) {
  if (rows > 0) on_host({x, out}, {out}, [&] { Executor::moe_ffn_to(m, x, rows, norm, eps, out); });
}

void GpuExecutor::gather(model::Act src, std::span<const int64_t> rows, model::Act dst) {
  if (rows.empty()) return;
  const DevAct& s = act(src);
  DevAct& d = act(dst);
  const int64_t cols = s.cols, n = static_cast<int64_t>(rows.size());
  const size_t row_bytes = static_cast<size_t>(cols) * kF32;
  if (d.cols != cols || d.buf.buf.bytes() < static_cast<size_t>(n) * row_bytes) {
    throw Error(internal("gather into an activation of another shape"));
  }
  for (int64_t r : rows) {
    if (r < 0 || r >= std::max(s.rows, int64_t{1})) throw Error(internal("gathered row out of range"));
  }
  load_model_kernels();
  timed(profile_.transfer_s, [&] {
    // In place through a scratch buffer that then becomes dst's (no second copy).
    const bool same = src.slot == dst.slot;
    const DevAddr out = same ? gather_.get(*dev_, static_cast<size_t>(std::max(d.rows, n)) * row_bytes) : d.buf.buf.addr();
    gpu_copy_rows(*dev_, out, s.buf.buf.addr(), row_list(rows), n, cols, false);
    if (same) std::swap(d.buf.buf, gather_.buf);
  });
}

void GpuExecutor::scatter(model::Act src, std::span<const int64_t> rows, model::Act dst) {
  if (rows.empty()) return;
  if (src.slot == dst.slot) throw Error(internal("scatter within one activation"));
  const DevAct& s = act(src);
  const DevAct& d = act(dst);
  const int64_t n = static_cast<int64_t>(rows.size());
  if (d.cols != s.cols || s.rows < n) throw Error(internal("scatter from an activation of another shape"));
  for (int64_t r : rows) {
    if (r < 0 || r >= d.rows) throw Error(internal("scattered row out of range"));
  }
  load_model_kernels();
  timed(profile_.transfer_s, [&] {
    gpu_copy_rows(*dev_, d.buf.buf.addr(), s.buf.buf.addr(), row_list(rows), n, s.cols, true);
  });
}

void GpuExecutor::DevKv::lay_out(std::span<const int64_t> widths, int64_t n_pos) {
  layers = static_cast<int64_t>(widths.size()), positions = n_pos;
  width.assign(widths.begin(), widths.end());
  first.resize(width.size());
  int64_t at = 0;
  for (size_t l = 0; l < width.size(); ++l) first[l] = at, at += positions * width[l];
}
size_t GpuExecutor::DevKv::bytes() const {
  return width.empty() ? kF32 : static_cast<size_t>(std::max<int64_t>(first.back() + positions * width.back(), 1)) * kF32;
}
DevAddr GpuExecutor::DevKv::k_at(int64_t layer, int64_t pos) const {
  const size_t l = static_cast<size_t>(layer);
  return k.addr() + static_cast<size_t>(first[l] + pos * width[l]) * kF32;
}
DevAddr GpuExecutor::DevKv::v_at(int64_t layer, int64_t pos) const {
  const size_t l = static_cast<size_t>(layer);
  return v.addr() + static_cast<size_t>(first[l] + pos * width[l]) * kF32;
}

GpuExecutor::DevKv& GpuExecutor::store(model::KvHandle h) {
  if (!h.valid() || static_cast<size_t>(h.index) >= kv_.size() || !kv_[static_cast<size_t>(h.index)]) {
    throw Error(internal("invalid key/value store handle"));
  }
  return *kv_[static_cast<size_t>(h.index)];
}

DeviceBuffer GpuExecutor::take_buffer(size_t bytes) {
  auto best = spare_.end();
  for (auto it = spare_.begin(); it != spare_.end(); ++it) {
    if (it->bytes() >= bytes && (best == spare_.end() || it->bytes() < best->bytes())) best = it;
  }
  if (best == spare_.end()) return DeviceBuffer(*dev_, bytes);
  DeviceBuffer b = std::move(*best);
  spare_.erase(best);
  return b;
}

model::KvHandle GpuExecutor::kv_open(std::span<const int64_t> widths, int64_t positions) {
  auto kv = std::make_unique<DevKv>();
  kv->lay_out(widths, positions);
  const size_t bytes = kv->bytes();
  kv->k = take_buffer(bytes);
  kv->v = take_buffer(bytes);
  dev_->zero(kv->k.addr(), bytes);  // positions never stored read as zeros, as on the host
  dev_->zero(kv->v.addr(), bytes);
  kv->bk.assign(static_cast<size_t>(kv->layers), model::VectorHandle{});
  kv->bv = kv->bk;
  for (size_t i = 0; i < kv_.size(); ++i) {
    if (!kv_[i]) {
      kv_[i] = std::move(kv);
      return model::KvHandle{static_cast<int32_t>(i)};
    }
  }
  kv_.push_back(std::move(kv));
  return model::KvHandle{static_cast<int32_t>(kv_.size() - 1)};
}

void GpuExecutor::kv_close(model::KvHandle h) {
  if (!h.valid() || static_cast<size_t>(h.index) >= kv_.size() || !kv_[static_cast<size_t>(h.index)]) return;
  DevKv& s = *kv_[static_cast<size_t>(h.index)];
  spare_.push_back(std::move(s.k));
  spare_.push_back(std::move(s.v));
  while (spare_.size() > kMaxSpareBuffers) spare_.erase(spare_.begin());
  kv_[static_cast<size_t>(h.index)].reset();
}

void GpuExecutor::kv_grow(model::KvHandle h, int64_t positions) {
  DevKv& s = store(h);
  if (positions <= s.positions) return;
  DevKv grown;
  grown.lay_out(s.width, positions);
  const size_t bytes = grown.bytes();
  grown.k = take_buffer(bytes);
  grown.v = take_buffer(bytes);
  dev_->zero(grown.k.addr(), bytes);
  dev_->zero(grown.v.addr(), bytes);
  for (int64_t l = 0; l < s.layers; ++l) {  // each layer's stored positions to the start of its new room
    const size_t n = static_cast<size_t>(s.positions * s.width[static_cast<size_t>(l)]) * kF32;
    dev_->copy(grown.k_at(l, 0), s.k_at(l, 0), n);
    dev_->copy(grown.v_at(l, 0), s.v_at(l, 0), n);
  }
  spare_.push_back(std::move(s.k));
  spare_.push_back(std::move(s.v));
  while (spare_.size() > kMaxSpareBuffers) spare_.erase(spare_.begin());
  s.positions = positions, s.first = grown.first;
  s.k = std::move(grown.k), s.v = std::move(grown.v);
}

std::vector<float> GpuExecutor::kv_read(model::KvHandle h, int64_t positions) {
  const DevKv& s = store(h);
  if (positions < 0 || positions > s.positions) throw Error(internal("key/value positions out of range"));
  std::vector<float> out;
  for (int64_t l = 0; l < s.layers; ++l) {
    const size_t n = static_cast<size_t>(positions * s.width[static_cast<size_t>(l)]), at = out.size();
    out.resize(at + 2 * n);
    dev_->download(out.data() + at, s.k_at(l, 0), n * kF32);
    dev_->download(out.data() + at + n, s.v_at(l, 0), n * kF32);
  }
  return out;
}

void GpuExecutor::kv_write(model::KvHandle h, int64_t positions, std::span<const float> data, int64_t data_positions) {
  DevKv& s = store(h);
  int64_t need = 0;
  for (int64_t w : s.width) need += 2 * data_positions * w;
  if (positions < 0 || positions > data_positions || positions > s.positions || static_cast<int64_t>(data.size()) != need)
    throw Error(internal("a key/value snapshot that does not fit the store"));
  const float* at = data.data();
  for (int64_t l = 0; l < s.layers; ++l) {
    const int64_t w = s.width[static_cast<size_t>(l)];
    dev_->upload(s.k_at(l, 0), at, static_cast<size_t>(positions * w) * kF32);
    dev_->upload(s.v_at(l, 0), at + data_positions * w, static_cast<size_t>(positions * w) * kF32);
    at += 2 * data_positions * w;
  }
}

void GpuExecutor::kv_store(model::KvHandle h, int64_t layer, model::Act k, model::Act v, int64_t row0, int64_t rows,
                           int64_t pos0, model::VectorHandle bk, model::VectorHandle bv, const model::RopeSpec&,
                           const model::AttentionShape& shape) {
  if (rows <= 0) return;
  DevKv& s = store(h);
  if (layer < 0 || layer >= s.layers || pos0 < 0 || pos0 + rows > s.positions) {
    throw Error(internal("key/value positions out of range"));
  }
  const int64_t width = s.width[static_cast<size_t>(layer)];
  if (act(k).cols != width || act(v).cols != width || shape.kv_dim() != width)
    throw Error(internal("key/value width differs from the store's"));
  // Raw projections in; bias and RoPE are applied when attend() packs the layer (the same kernel, the
  // same values as packing them here).
  s.bk[static_cast<size_t>(layer)] = bk;
  s.bv[static_cast<size_t>(layer)] = bv;
  const size_t bytes = static_cast<size_t>(rows * width) * kF32;
  timed(profile_.attention_s, [&] {
    dev_->copy(s.k_at(layer, pos0), at(k, row0), bytes);
    dev_->copy(s.v_at(layer, pos0), at(v, row0), bytes);
  });
}

// cos/sin of position * base^(-2p/n_rot) / freq_factors[p] for pairs p < n_rot/2, in double exactly as the host
// computes them, one table per RoPE flavour; and the positions 0..cap-1 (contiguous rows read their positions
// from it).
const GpuExecutor::RopeTable& GpuExecutor::ensure_rope(const model::RopeSpec& rope, int64_t n_pos) {
  const auto capacity = [&](int64_t have) {
    int64_t cap = std::max(pad_rows(n_pos), 2 * have);
    if (hp_.n_ctx > 0) cap = std::max(pad_rows(n_pos), std::min(cap, pad_rows(hp_.n_ctx)));
    return cap;
  };
  if (n_pos > pos_cap_) {
    const int64_t cap = capacity(pos_cap_);
    std::vector<int> pos(static_cast<size_t>(cap));
    for (int64_t i = 0; i < cap; ++i) pos[static_cast<size_t>(i)] = static_cast<int>(i);
    pos_ = DeviceBuffer(*dev_, pos.size() * sizeof(int));
    dev_->upload(pos_.addr(), pos.data(), pos_.bytes());
    pos_cap_ = cap;
  }
  RopeTable* t = nullptr;
  for (RopeTable& r : ropes_) {
    if (r.spec.n_rot == rope.n_rot && r.spec.base == rope.base && r.spec.freq_factors == rope.freq_factors) t = &r;
  }
  if (t && n_pos <= t->cap) return *t;
  if (!t) t = &ropes_.emplace_back();
  const int64_t cap = capacity(t->cap), half = rope.n_rot / 2;
  std::vector<double> c(static_cast<size_t>(cap * half)), s(c.size());
  for (int64_t p = 0; p < half; ++p) {
    double inv_freq = std::pow(static_cast<double>(rope.base),
                               -2.0 * static_cast<double>(p) / static_cast<double>(rope.n_rot));
    if (rope.freq_factors) inv_freq /= static_cast<double>(rope.freq_factors[p]);
    for (int64_t i = 0; i < cap; ++i) {
      const double theta = static_cast<double>(i) * inv_freq;
      c[static_cast<size_t>(i * half + p)] = std::cos(theta);
      s[static_cast<size_t>(i * half + p)] = std::sin(theta);
    }
  }
  t->cos = DeviceBuffer(*dev_, std::max<size_t>(c.size(), 1) * sizeof(double));
  t->sin = DeviceBuffer(*dev_, std::max<size_t>(s.size(), 1) * sizeof(double));
  dev_->upload(t->cos.addr(), c.data(), c.size() * sizeof(double));
  dev_->upload(t->sin.addr(), s.data(), s.size() * sizeof(double));
  t->spec = rope, t->cap = cap;
  return *t;
}

DevAddr GpuExecutor::row_list(std::span<const int64_t> rows) {
  const std::vector<int> r(rows.begin(), rows.end());
  const DevAddr a = row_list_.get(*dev_, r.size() * sizeof(int));
  dev_->upload(a, r.data(), r.size() * sizeof(int));
  return a;
}

DevAddr GpuExecutor::positions_addr(std::span<const int64_t> positions) {
  bool contiguous = true;
  for (size_t i = 1; i < positions.size() && contiguous; ++i) contiguous = positions[i] == positions[i - 1] + 1;
  if (contiguous) return pos_.addr() + static_cast<size_t>(positions[0]) * sizeof(int);
  const std::vector<int> p(positions.begin(), positions.end());
  const DevAddr a = pos_list_.get(*dev_, p.size() * sizeof(int));
  dev_->upload(a, p.data(), p.size() * sizeof(int));
  return a;
}

void GpuExecutor::attend(model::KvHandle h, int64_t layer, int64_t n_kv, model::Act q, int64_t row0,
                         std::span<const int64_t> positions, model::VectorHandle bq, const model::RopeSpec& rope,
                         const model::AttentionShape& shape, model::Act out,
                         std::span<const model::KeyRange> ranges) {
  const int64_t rows = static_cast<int64_t>(positions.size());
  if (rows == 0) return;
  DevKv& s = store(h);
  const int64_t H = shape.n_head, Hkv = shape.n_head_kv, d = shape.head_dim;
  if (layer < 0 || layer >= s.layers || n_kv <= 0 || n_kv > s.positions || Hkv * d != s.width[static_cast<size_t>(layer)] ||
      H <= 0 || Hkv <= 0 || H % Hkv != 0 || act(q).cols != H * d || act(out).cols != H * d) {
    throw Error(internal("bad attention shape"));
  }
  if (!ranges.empty() && static_cast<int64_t>(ranges.size()) != rows) throw Error(internal("one key range per query row"));
  std::vector<int> bounds;  // the rows' key ranges as the kernel reads them
  bounds.reserve(ranges.size() * 2);
  for (const model::KeyRange& r : ranges) {
    if (r.lo < 0 || r.lo >= r.hi || r.hi > n_kv) throw Error(internal("key range out of the stored positions"));
    bounds.push_back(static_cast<int>(r.lo));
    bounds.push_back(static_cast<int>(r.hi));
  }
  const AttentionKernels ak = attention_kernels(rope, shape);
  if (!attn_checked_valid_ || !(attn_checked_ == ak)) {
    if (const std::string err = head_dim_error(d, rope.n_rot); !err.empty()) throw Error(err);
    for (const std::string& name : {ak.qkv.name(), ak.attn.name()}) {
      if (!kernels_.contains(name)) {  // not announced by prepare_model(): the unit is built again with them
        kernels_.add(ak.qkv);
        kernels_.add(ak.attn);
        kernels_loaded_ = false;
        break;
      }
    }
    attn_checked_ = ak, attn_checked_valid_ = true;
  }
  load_model_kernels();
  int64_t max_pos = n_kv;
  for (int64_t p : positions) {
    if (p < 0) throw Error(internal("negative query position"));
    max_pos = std::max(max_pos, p + 1);
  }
  const RopeTable& tab = ensure_rope(rope, max_pos);
  if (in_capture_) step_key_.insert(step_key_.end(), {rows, n_kv, static_cast<int64_t>(bounds.size())});
  const size_t l = static_cast<size_t>(layer);
  const int64_t width = s.width[l];
  // The announced output projection's input, quantised in this launch (expect_projection).
  AttnDesc quant_desc = ak.attn;
  quant_desc.quant = true;
  quant_desc.quant_act = act_att_.format;
  const bool fuse = proj_.slot == out.slot && row0 + rows <= proj_.rows && kernels_.contains(quant_desc);
  if (fuse) proj_.covered += rows;
  else if (proj_.slot == out.slot) proj_ = Projection{};  // a row not quantised here: matmul_add quantises them all
  const AttnQuant aq{&act_att_, row0, &gemm_ws_};
  timed(profile_.attention_s, [&] {
    const DevAddr qh = qh_.get(*dev_, packed_heads_bytes(H, d, rows));
    const DevAddr kh = kh_.get(*dev_, packed_heads_bytes(Hkv, d, n_kv));
    const DevAddr vt = vt_.get(*dev_, packed_heads_bytes(Hkv, d, n_kv));
    DevAddr rd = 0;
    if (!bounds.empty()) {
      rd = ranges_.get(*dev_, bounds.size() * sizeof(int));
      dev_->upload(rd, bounds.data(), bounds.size() * sizeof(int));
    }
    gpu_pack_qkv(*dev_, ak, PackArgs{at(q, row0), rows, H * d, vector_addr(bq), positions_addr(positions), qh},
                 PackArgs{s.k_at(layer, 0), n_kv, width, vector_addr(s.bk[l]), pos_.addr(), kh},
                 PackArgs{s.v_at(layer, 0), n_kv, width, vector_addr(s.bv[l]), 0, vt}, tab.cos.addr(), tab.sin.addr());
    gpu_attention(*dev_, ak.attn, qh, rows, kh, vt, n_kv, shape.scale, at(out, row0), rd, fuse ? &aq : nullptr);
  });
}

void GpuExecutor::final_logits(model::WeightHandle output, model::Act x, int64_t rows, model::VectorHandle norm,
                               float eps, float* logits) {
  if (rows <= 0) return;
  const GpuWeight* w = &weight(output);
  const int64_t V = w->layout.n;
  const size_t bytes = static_cast<size_t>(rows * V) * kF32;
  load_model_kernels();
  const DevAddr ld = logits_.get(*dev_, bytes);
  timed(profile_.lm_head_s, [&] {
    gpu_quant_for(*dev_, QuantMode::RmsNorm, std::span(&w, 1), at(x), 0, vector_addr(norm), 0, rows, act(x).cols,
                  eps, act_);
    gpu_gemm(*dev_, gemm_ws_, *w, act_, rows, ld, V, false);
  });
  if (in_capture_) step_key_.push_back(rows);
  end_step_graph(true);
  timed(profile_.transfer_s, [&] { dev_->download(logits, ld, bytes); });
}

std::vector<std::string> GpuExecutor::describe() const {
  std::vector<std::string> lines;
  lines.push_back("gpu: " + dev_->describe());
  const KernelLoadStats& s = dev_->load_stats();
  char buf[256];
  std::snprintf(buf, sizeof buf, "gpu kernels: %d unit(s) compiled by NVRTC in %.2f s, %d from the cache; %.2f s to load",
                s.units_compiled, s.compile_seconds, s.units_from_cache, s.load_seconds);
  lines.push_back(buf);
  lines.push_back("gpu weights: " + fmt_gib(weight_bytes_) + " in device memory (" + std::to_string(weights_.size()) +
                  " matrices)");
  if (const auto* cd = dynamic_cast<const CudaDevice*>(dev_.get())) {
    for (const std::string& n : cd->notes()) lines.push_back("gpu " + n);
  }
  lines.push_back(graphs_line());
  if (profiling_) lines.push_back(profile()->report());
  return lines;
}

std::string GpuExecutor::graphs_line() const {
  std::string off;
  if (!graphs_wanted_) off = "DLLM_GPU_GRAPHS=0";
  else if (profiling_) off = "DLLM_GPU_PROFILE times each operation";
  else if (!dev_->supports_graphs()) off = "the driver has no stream capture, or DLLM_GPU_DEBUG is set";
  else off = graphs_off_;
  const GraphStats g = dev_->graph_stats();
  char buf[256];
  std::snprintf(buf, sizeof buf, "%zu step(s) as one graph each (%zu built, %zu updated), %zu cut short", g.captured,
                g.instantiated, g.updated, g.broken);
  return off.empty() ? std::string("gpu graphs: on, ") + buf : "gpu graphs: off (" + off + "); " + buf;
}

ExecutorReport executor_report(const model::Executor& executor) {
  ExecutorReport r;
  const auto* gpu = dynamic_cast<const GpuExecutor*>(&executor);
  if (!gpu) return r;
  r.gpu = true;
  r.weight_bytes = gpu->weight_bytes();
  r.lines = gpu->describe();
  if (gpu->profiling()) {
    r.profiled = true;
    r.profile = *gpu->profile();
  }
  return r;
}

}  // namespace dllm::jit::cuda
