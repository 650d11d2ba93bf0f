// GPU benchmarks, run by bench/gpu/device-check.sh on a GPU machine; every test skips unless
// DLLM_GPU_BENCH=1 and a usable GPU is present. Each kernel is first checked against a reference on a
// sample of outputs, then timed; results are printed and, when DLLM_GPU_BENCH_OUT names a directory,
// written there as JSON lines (kernels.jsonl, forward.jsonl).
//   GpuBench.Gemm:      int8 tensor-core GEMM of every format at LLaDA-8B shapes, 1, 64, 288, 1024 rows (TOPS)
//   GpuBench.Attention: flash attention at LLaDA-8B / Dream-7B head shapes, 256..4096 tokens (TFLOPS)
//   GpuBench.Forward:   whole forward pass of DLLM_GPU_BENCH_MODEL (a `dllm synth` model): load time,
//                       ms per forward for several canvas lengths, and the DLLM_GPU_PROFILE split.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <span>

#include "jit/cuda/cuda_device.h"
#include "jit/cuda/device_select.h"
#include "jit/cuda/gpu_executor.h"
#include "jit/cuda/gpu_ops.h"
#include "model/arch.h"
#include "model/forward.h"
#include "model/gguf.h"
#include "model/quant.h"
#include "support.h"

namespace dllm::test {
namespace {

namespace jc = dllm::jit::cuda;
using Clock = std::chrono::steady_clock;

std::string skip_reason() {
  const char* on = std::getenv("DLLM_GPU_BENCH");
  if (!on || std::string(on) != "1") return "set DLLM_GPU_BENCH=1 to run the GPU benchmarks";
  const jc::DeviceChoice c = jc::select_device("auto", 0);
  return c.device == jc::DeviceKind::Gpu ? std::string() : "no usable GPU: " + c.reason;
}

#define REQUIRE_BENCH()                                             \
  if (const std::string why = skip_reason(); !why.empty()) GTEST_SKIP() << why

void emit(const std::string& file, const nlohmann::json& j) {
  std::printf("%s\n", j.dump().c_str());
  if (const char* dir = std::getenv("DLLM_GPU_BENCH_OUT"); dir && *dir) {
    std::ofstream(std::string(dir) + "/" + file, std::ios::app) << j.dump() << "\n";
  }
}

// Median seconds of `reps` timed runs of f (after 2 warm-ups), synchronising around each.
template <class F>
double time_median(jc::Device& dev, int reps, F&& f) {
  for (int i = 0; i < 2; ++i) f();
  dev.synchronize();
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = Clock::now();
    f();
    dev.synchronize();
    t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

struct Synth {
  std::vector<uint8_t> bytes;
  std::string name;
  gguf::TensorInfo info;
};

Synth random_tensor(GgmlType type, int64_t n, int64_t k) {
  Synth s;
  s.name = "bench." + ggml_type_name(type);
  const auto ti = ggml_type_info(static_cast<uint32_t>(type));
  s.bytes.resize(static_cast<size_t>(n * k / ti->block_size * ti->type_size));
  std::mt19937 rng(3);
  for (size_t i = 0; i < s.bytes.size(); i += 4) {
    const uint32_t r = rng();
    std::memcpy(&s.bytes[i], &r, std::min<size_t>(4, s.bytes.size() - i));
  }
  const uint16_t d = quant::f32_to_fp16(0.01f);
  for (size_t off = 0; off < s.bytes.size(); off += ti->type_size) {
    if (type == GgmlType::Q6_K) {
      std::memcpy(&s.bytes[off + ti->type_size - 2], &d, 2);
    } else {
      std::memcpy(&s.bytes[off], &d, 2);
      if (type == GgmlType::Q4_K) std::memcpy(&s.bytes[off + 2], &d, 2);
    }
  }
  s.info.name = s.name;
  s.info.type_id = static_cast<uint32_t>(type);
  s.info.type_info = *ti;
  s.info.n_dims = 2;
  s.info.ne[0] = k;
  s.info.ne[1] = n;
  s.info.nbytes = s.bytes.size();
  s.info.data = s.bytes.data();
  return s;
}

TEST(GpuBench, Gemm) {
  REQUIRE_BENCH();
  ThreadPool pool(8);
  auto gpu = jc::GpuExecutor::open(pool);
  jc::Device& dev = gpu->device();
  struct Shape {
    int64_t n, k;
    const char* what;
  };
  // Every weight first, so the per-call path compiles one kernel unit for all of them.
  struct Case {
    GgmlType type;
    Shape sh;
    Synth t;
    model::WeightHandle h;
  };
  std::vector<Case> cases;
  for (GgmlType type : {GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::Q8_0}) {
    for (const Shape& sh : {Shape{12288, 4096, "llada ffn gate/up"}, Shape{4096, 12288, "llada ffn down"},
                            Shape{4096, 4096, "llada q/k/v/o"}}) {
      cases.push_back(Case{type, sh, random_tensor(type, sh.n, sh.k), {}});
    }
  }
  for (Case& c : cases) {
    c.t.info.data = c.t.bytes.data();
    c.t.info.name = c.t.name;
    c.h = gpu->prepare_weight(c.t.info);
  }
  for (const Case& c : cases) {
    {
      const GgmlType type = c.type;
      const Shape& sh = c.sh;
      const Synth& t = c.t;
      const model::WeightHandle h = c.h;
      const jc::GpuWeight& w = gpu->weight(h);
      // 1 row (decoding one token), 64 (a canvas of 64), 288 (a 256 canvas after a 32-token prompt), 1024.
      for (int64_t rows : {1, 64, 288, 1024}) {
        std::mt19937 rng(9);
        std::uniform_real_distribution<float> u(-1.f, 1.f);
        std::vector<float> x(static_cast<size_t>(rows * sh.k));
        for (float& v : x) v = u(rng);
        // Correctness first: a sample of outputs against the dequantised weights (int8 activations
        // cost about 1% here).
        std::vector<float> y(static_cast<size_t>(rows * sh.n));
        gpu->matmul(h, x.data(), rows, y.data());
        std::vector<float> wrow(static_cast<size_t>(sh.k));
        double err = 0, norm = 0;
        for (int s = 0; s < 16; ++s) {
          const int64_t r = static_cast<int64_t>(rng() % rows), j = static_cast<int64_t>(rng() % sh.n);
          quant::dequantize_row(type, t.info.data + j * t.info.row_bytes(), wrow.data(), sh.k);
          double ref = 0;
          for (int64_t c = 0; c < sh.k; ++c) ref += double(x[r * sh.k + c]) * wrow[c];
          err += (y[r * sh.n + j] - ref) * (y[r * sh.n + j] - ref);
          norm += ref * ref;
        }
        EXPECT_LT(std::sqrt(err / norm), 3e-2) << ggml_type_name(type) << " " << sh.what << " rows " << rows;
        // Then time the device part only (activations already quantised on the device).
        jc::DeviceBuffer xd(dev, x.size() * 4), yd(dev, y.size() * 4);
        dev.upload(xd.addr(), x.data(), x.size() * 4);
        jc::ActBuffers act;
        const jc::ActFormat fmt = jc::act_format_for(w.layout.format);
        jc::gpu_quant(dev, jc::QuantMode::Plain, fmt, sh.k, xd.addr(), 0, 0, 0, rows, sh.k, 0.f, act);
        jc::GemmWorkspace work;
        const double sec = time_median(dev, 10, [&] { jc::gpu_gemm(dev, work, w, act, rows, yd.addr(), sh.n, false); });
        const double quant_sec =
            time_median(dev, 10, [&] { jc::gpu_quant(dev, jc::QuantMode::Plain, fmt, sh.k, xd.addr(), 0, 0, 0, rows, sh.k, 0.f, act); });
        emit("kernels.jsonl", {{"bench", "gemm"},
                               {"type", ggml_type_name(type)},
                               {"n", sh.n},
                               {"k", sh.k},
                               {"rows", rows},
                               {"shape", sh.what},
                               {"ms", sec * 1e3},
                               {"tops", 2.0 * rows * sh.n * sh.k / sec / 1e12},
                               {"weight_gbps", double(w.layout.device_bytes()) / sec / 1e9},
                               {"weight_bytes", w.layout.device_bytes()},
                               {"device", dev.describe()},
                               {"quant_ms", quant_sec * 1e3}});
      }
    }
  }
}

TEST(GpuBench, Attention) {
  REQUIRE_BENCH();
  ThreadPool pool(8);
  auto gpu = jc::GpuExecutor::open(pool);
  jc::Device& dev = gpu->device();
  for (const auto& [H, Hkv] : {std::pair<int64_t, int64_t>{32, 32}, {28, 4}}) {
    const int64_t d = 128;
    const jc::AttnDesc ad{H, Hkv, d};
    const jc::PackDesc pq{H, d, d, jc::PackStyle::None, false}, pk{Hkv, d, d, jc::PackStyle::None, false},
        pv{Hkv, d, d, jc::PackStyle::None, true};
    jc::KernelSet set;
    set.add(ad);
    set.add(pq);
    set.add(pk);
    set.add(pv);
    dev.load_kernels(set);
    for (int64_t n : {256, 1024, 4096}) {
      std::mt19937 rng(5);
      std::uniform_real_distribution<float> u(-1.f, 1.f);
      std::vector<float> q(static_cast<size_t>(n * H * d)), k(static_cast<size_t>(n * Hkv * d)), v(k.size());
      for (float& e : q) e = u(rng);
      for (float& e : k) e = u(rng);
      for (float& e : v) e = u(rng);
      jc::DeviceBuffer qd(dev, q.size() * 4), kd(dev, k.size() * 4), vd(dev, v.size() * 4), od(dev, q.size() * 4);
      jc::DeviceBuffer qh(dev, jc::packed_heads_bytes(H, d, n)), kh(dev, jc::packed_heads_bytes(Hkv, d, n)),
          vt(dev, jc::packed_heads_bytes(Hkv, d, n));
      dev.upload(qd.addr(), q.data(), q.size() * 4);
      dev.upload(kd.addr(), k.data(), k.size() * 4);
      dev.upload(vd.addr(), v.data(), v.size() * 4);
      jc::gpu_pack(dev, pq, qd.addr(), n, H * d, 0, 0, 0, 0, qh.addr());
      jc::gpu_pack(dev, pk, kd.addr(), n, Hkv * d, 0, 0, 0, 0, kh.addr());
      jc::gpu_pack(dev, pv, vd.addr(), n, Hkv * d, 0, 0, 0, 0, vt.addr());
      const float scale = static_cast<float>(1.0 / std::sqrt(double(d)));
      const double sec = time_median(dev, 10, [&] {
        jc::gpu_attention(dev, ad, qh.addr(), n, kh.addr(), vt.addr(), n, scale, od.addr());
      });
      // One row of one head against an exact softmax in double (f16 operands: ~1e-3).
      std::vector<float> out(q.size());
      dev.download(out.data(), od.addr(), out.size() * 4);
      const int64_t i = n / 3, h = H - 1, g = h / (H / Hkv);
      std::vector<double> s(static_cast<size_t>(n));
      double mx = -1e300, sum = 0, err = 0, norm = 0;
      for (int64_t j = 0; j < n; ++j) {
        double dot = 0;
        for (int64_t c = 0; c < d; ++c) dot += double(q[(i * H + h) * d + c]) * k[(j * Hkv + g) * d + c];
        mx = std::max(mx, s[j] = dot * scale);
      }
      for (double& e : s) sum += (e = std::exp(e - mx));
      for (int64_t c = 0; c < d; ++c) {
        double ref = 0;
        for (int64_t j = 0; j < n; ++j) ref += s[j] * v[(j * Hkv + g) * d + c];
        ref /= sum;
        err += (out[(i * H + h) * d + c] - ref) * (out[(i * H + h) * d + c] - ref);
        norm += ref * ref;
      }
      EXPECT_LT(std::sqrt(err / norm), 2e-2) << "H " << H << " n " << n;
      emit("kernels.jsonl", {{"bench", "attention"}, {"heads", H}, {"kv_heads", Hkv}, {"head_dim", d}, {"tokens", n},
                             {"ms", sec * 1e3}, {"tflops", 4.0 * n * n * d * H / sec / 1e12}});
    }
  }
}

// The model of DLLM_GPU_BENCH_MODEL on the GPU, weights uploaded once.
struct BenchModel {
  std::unique_ptr<gguf::File> file;
  model::HParams hp;
  model::ModelTensors tensors;
  std::unique_ptr<ThreadPool> pool;
  std::unique_ptr<jc::GpuExecutor> gpu;
  model::ForwardWeights fw;
  double load_s = 0;

  explicit BenchModel(const std::string& path) {
    const auto t0 = Clock::now();
    file = gguf::File::open(path);
    hp = model::read_hparams(*file);
    tensors = model::check_tensors(*file, hp);
    pool = std::make_unique<ThreadPool>(ThreadPool::hardware_threads());
    gpu = jc::GpuExecutor::open(*pool);
    fw = model::prepare_forward_weights(hp, tensors, *gpu);
    load_s = std::chrono::duration<double>(Clock::now() - t0).count();
  }
  void forward(std::span<const int32_t> ids, std::span<const int64_t> rows, float* out) {
    model::forward(hp, fw, *gpu, model::ForwardRequest{ids, rows, out});
  }
};

const char* bench_model_path() {
  const char* path = std::getenv("DLLM_GPU_BENCH_MODEL");
  return path && *path ? path : nullptr;
}

TEST(GpuBench, Forward) {
  REQUIRE_BENCH();
  const char* path = bench_model_path();
  if (!path) GTEST_SKIP() << "set DLLM_GPU_BENCH_MODEL to a model file (dllm synth makes one)";
  BenchModel bm(path);
  std::mt19937 rng(1);
  for (int64_t n : {128, 512, 1024}) {
    std::vector<int32_t> ids(static_cast<size_t>(n));
    for (auto& id : ids) id = static_cast<int32_t>(rng() % bm.hp.n_vocab);
    std::vector<int64_t> rows(32);  // one block's rows, as a sampler step asks
    for (size_t i = 0; i < rows.size(); ++i) rows[i] = n - 32 + static_cast<int64_t>(i);
    std::vector<float> logits(rows.size() * static_cast<size_t>(bm.hp.n_vocab));
    const auto c0 = Clock::now();
    bm.forward(ids, rows, logits.data());  // the first pass compiles (or loads) the kernels
    const double first_s = std::chrono::duration<double>(Clock::now() - c0).count();
    const double sec = time_median(bm.gpu->device(), 5, [&] { bm.forward(ids, rows, logits.data()); });
    for (float f : logits) ASSERT_TRUE(std::isfinite(f));
    emit("forward.jsonl", {{"bench", "forward"},
                           {"model", path},
                           {"layers", bm.hp.n_layer},
                           {"canvas", n},
                           {"logit_rows", rows.size()},
                           {"ms", sec * 1e3},
                           {"first_forward_s", first_s},
                           {"load_s", bm.load_s},
                           {"weights_gib", double(bm.gpu->weight_bytes()) / (1 << 30)}});
  }
  for (const std::string& line : bm.gpu->describe()) emit("forward.jsonl", {{"describe", line}});
}

TEST(GpuBench, ForwardProfileSplit) {
  REQUIRE_BENCH();
  const char* path = bench_model_path();
  if (!path) GTEST_SKIP() << "set DLLM_GPU_BENCH_MODEL to a model file (dllm synth makes one)";
  setenv("DLLM_GPU_PROFILE", "1", 1);
  BenchModel bm(path);
  unsetenv("DLLM_GPU_PROFILE");
  ASSERT_TRUE(bm.gpu->profiling());
  std::vector<int32_t> ids(512, 7);
  std::vector<int64_t> rows(32);
  for (size_t i = 0; i < rows.size(); ++i) rows[i] = 480 + static_cast<int64_t>(i);
  std::vector<float> logits(rows.size() * static_cast<size_t>(bm.hp.n_vocab));
  for (int i = 0; i < 4; ++i) bm.forward(ids, rows, logits.data());
  ASSERT_NE(bm.gpu->profile(), nullptr);
  emit("forward.jsonl", {{"bench", "profile"}, {"canvas", 512}, {"report", bm.gpu->profile()->report()}});
}

}  // namespace
}  // namespace dllm::test
