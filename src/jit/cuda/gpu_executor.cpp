// The GPU executor (gpu_executor.h): weight upload at load, the per-call operations, and the hook into
// the whole-model forward pass.
#include "jit/cuda/gpu_executor.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "jit/cuda/cuda_device.h"
#include "model/error.h"

namespace dllm::jit::cuda {

namespace {

constexpr size_t kStageBytes = size_t{64} << 20;  // host staging per upload chunk
constexpr int64_t kTilesPerTask = 16;             // 8-column tiles packed by one pool task

std::string fmt_gib(size_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f GiB", static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0));
  return buf;
}

}  // namespace

GpuExecutor::GpuExecutor(std::unique_ptr<Device> device, ThreadPool& pool)
    : Executor(&pool), dev_(std::move(device)), pool_(pool) {
  const char* prof = std::getenv("DLLM_GPU_PROFILE");
  profiling_ = prof && *prof && std::string(prof) != "0";
}

GpuExecutor::~GpuExecutor() = default;

std::unique_ptr<GpuExecutor> GpuExecutor::open(ThreadPool& pool, int ordinal) {
  return std::make_unique<GpuExecutor>(CudaDevice::open(ordinal), pool);
}

model::WeightHandle GpuExecutor::prepare_weight(const gguf::TensorInfo& t) {
  const PackedLayout L = packed_layout(t);  // throws for types without a GPU kernel
  GpuWeight w;
  w.name = std::string(t.name);
  w.layout = L;
  const size_t qpt = L.quant_bytes_per_tile(), spt = L.scales_per_tile();
  w.quants = DeviceBuffer(*dev_, L.quant_bytes());
  w.scales = DeviceBuffer(*dev_, L.scale_count() * sizeof(float));
  if (L.has_mins()) w.mins = DeviceBuffer(*dev_, L.scale_count() * sizeof(float));

  // Pack and upload in chunks of whole pool tasks, so host memory stays bounded for any matrix size.
  const int64_t chunk =
      std::max<int64_t>(kTilesPerTask, static_cast<int64_t>(kStageBytes / qpt) / kTilesPerTask * kTilesPerTask);
  const int64_t stage_tiles = std::min(chunk, L.ntiles);
  std::vector<uint8_t> sq(static_cast<size_t>(stage_tiles) * qpt);
  std::vector<float> ss(static_cast<size_t>(stage_tiles) * spt), sm(L.has_mins() ? ss.size() : 0);
  for (int64_t t0 = 0; t0 < L.ntiles; t0 += chunk) {
    const int64_t t1 = std::min(L.ntiles, t0 + chunk);
    const int64_t tasks = (t1 - t0 + kTilesPerTask - 1) / kTilesPerTask;
    pool_.parallel_for(tasks, [&](int64_t task, int) {
      const int64_t a = t0 + task * kTilesPerTask, b = std::min(t1, a + kTilesPerTask);
      const size_t off = static_cast<size_t>(a - t0);
      pack_tiles(t, L, a, b, sq.data() + off * qpt, ss.data() + off * spt,
                 L.has_mins() ? sm.data() + off * spt : nullptr);
    });
    const size_t tiles = static_cast<size_t>(t1 - t0), first = static_cast<size_t>(t0);
    dev_->upload(w.quants.addr() + first * qpt, sq.data(), tiles * qpt);
    dev_->upload(w.scales.addr() + first * spt * sizeof(float), ss.data(), tiles * spt * sizeof(float));
    if (L.has_mins()) dev_->upload(w.mins.addr() + first * spt * sizeof(float), sm.data(), tiles * spt * sizeof(float));
  }
  weight_bytes_ += L.device_bytes();
  matmul_kernels_.add(w.desc());
  matmul_kernels_.add(QuantDesc{QuantMode::Plain, act_format_for(L.format), L.k});
  weights_.push_back(std::move(w));
  return model::WeightHandle{static_cast<int32_t>(weights_.size() - 1)};
}

const GpuWeight& GpuExecutor::weight(model::WeightHandle h) const {
  if (h.index < 0 || static_cast<size_t>(h.index) >= weights_.size()) {
    throw Error("internal error: invalid GPU weight handle " + std::to_string(h.index));
  }
  return weights_[static_cast<size_t>(h.index)];
}

void GpuExecutor::matmul(model::WeightHandle h, const float* x, int64_t rows, float* y) {
  matmul_shared(&h, &y, 1, x, rows);
}

void GpuExecutor::matmul_shared(const model::WeightHandle* ws, float* const* ys, int n, const float* x,
                                int64_t rows) {
  if (rows <= 0 || n <= 0) return;
  const int64_t k = weight(ws[0]).layout.k;
  for (int i = 1; i < n; ++i) {
    if (weight(ws[i]).layout.k != k) throw Error("internal error: matmul_shared over matrices of different widths");
  }
  dev_->load_kernels(matmul_kernels_);  // one unit for every prepared weight; a no-op once loaded
  const DevAddr xd = x_.get(*dev_, static_cast<size_t>(rows * k) * sizeof(float));
  dev_->upload(xd, x, static_cast<size_t>(rows * k) * sizeof(float));
  // One quantisation per activation format the matrices read (Q8_0 and/or Q8_K).
  bool done[2] = {false, false};
  for (int i = 0; i < n; ++i) {
    const ActFormat f = act_format_for(weight(ws[i]).layout.format);
    if (done[static_cast<size_t>(f)]) continue;
    gpu_quant(*dev_, QuantMode::Plain, f, k, xd, 0, 0, 0, rows, k, 0.f, act_[static_cast<size_t>(f)]);
    done[static_cast<size_t>(f)] = true;
  }
  for (int i = 0; i < n; ++i) {
    const GpuWeight& w = weight(ws[i]);
    const size_t bytes = static_cast<size_t>(rows * w.layout.n) * sizeof(float);
    const DevAddr yd = y_.get(*dev_, bytes);
    gpu_gemm(*dev_, w, act_, rows, yd, w.layout.n, false);
    dev_->download(ys[i], yd, bytes);
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
  const size_t qb = static_cast<size_t>(n_q * H * d) * sizeof(float), kb = static_cast<size_t>(n_kv * Hkv * d) * sizeof(float);
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

bool GpuExecutor::run_forward(const model::HParams& hp, const model::ForwardWeights& weights,
                              const model::ForwardRequest& req) {
  if (req.cache_mode != model::CacheMode::None) return false;
  if (!forward_ || forward_weights_ != &weights) {
    forward_.reset();
    forward_ = std::make_unique<GpuForward>(*dev_, pool_, hp, weights, weights_, *this);
    forward_->set_profiling(profiling_);
    forward_weights_ = &weights;
  }
  forward_->forward(req);
  return true;
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
  if (profiling_) lines.push_back(forward_ ? forward_->profile().report() : GpuProfile{}.report());
  return lines;
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
    if (const GpuProfile* p = gpu->profile()) r.profile = *p;  // none yet: no whole-model pass ran
  }
  return r;
}

}  // namespace dllm::jit::cuda
