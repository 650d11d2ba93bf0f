// jit::cuda::Device on the CPU emulator (emulator.h): device memory is host memory (poisoned with 0xff
// bytes when allocated, so anything a kernel reads without it having been written shows up as NaN or
// garbage, and guarded by a canary zone checked on free to catch writes past the end), and each kernel
// name maps to a host instantiation of the kernel template. Only the instantiations registered here
// exist: the shapes of the tiny fixture models and of the kernel unit tests. Graph capture is emulated with the
// device's contract (device.h): recorded work runs only at end_capture() (or when a download or synchronize()
// cuts the capture short), uploads are read at the call, frees wait for the recorded work, and the cache of
// executable graphs is the runtime's GraphCache, whose update succeeds when the topology (the sequence of
// operations and kernels) is the same, as CUDA's does.
#pragma once
#include <chrono>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <vector>
#include <set>
#include <stdexcept>
#include <string>

#include "emulator.h"
#include "jit/cuda/device.h"

namespace dllm::test {

using jit::cuda::Launch;
using Launcher = std::function<void(const Launch&, const void*)>;

template <class P, class Body>
Launcher make_launcher(Body body) {
  return [body](const Launch& l, const void* params) {
    P p;
    std::memcpy(&p, params, sizeof p);
    dllm_emu::Emulator::get().run(l.grid_x, l.grid_y, l.block_x, [&] { body(p); }, l.shared_bytes);
  };
}

template <int WT, int N, int K>
void add_gemm(std::map<std::string, Launcher>& r) {
  const jit::cuda::GemmDesc d{static_cast<jit::cuda::WeightFormat>(WT), N, K};
  r[d.name()] = make_launcher<GemmParams>([](const GemmParams& p) { gemm_tc_body<WT, N, K, false>(p); });
  r[d.name() + "_split"] = make_launcher<GemmParams>([](const GemmParams& p) { gemm_tc_body<WT, N, K, true>(p); });
  r[d.name() + "_small"] = make_launcher<GemmParams>([](const GemmParams& p) { gemm_tc_small_body<WT, N, K>(p); });
}
// A group of tiled GEMMs of one activation (N2 = 0: two), every tiling; SWIGLU: the gate/up variant that quantises.
template <int K, int WT0, int N0, int WT1, int N1, int WT2 = 0, int N2 = 0, bool SWIGLU = false, int QACT = ACT_Q8_K>
void add_gemm_group(std::map<std::string, Launcher>& r) {
  using jit::cuda::GemmDesc;
  using jit::cuda::WeightFormat;
  jit::cuda::GemmGroupDesc d;
  d.members = {GemmDesc{static_cast<WeightFormat>(WT0), N0, K}, GemmDesc{static_cast<WeightFormat>(WT1), N1, K}};
  if (N2 > 0) d.members.push_back(GemmDesc{static_cast<WeightFormat>(WT2), N2, K});
  d.swiglu = SWIGLU;
  d.swiglu_act = static_cast<jit::cuda::ActFormat>(QACT);
  r[d.name()] = make_launcher<GemmGroupParams>(
      [](const GemmGroupParams& p) { gemm_tc_group_body<false, K, WT0, N0, WT1, N1, WT2, N2, SWIGLU, QACT>(p); });
  r[d.name() + "_split"] = make_launcher<GemmGroupParams>(
      [](const GemmGroupParams& p) { gemm_tc_group_body<true, K, WT0, N0, WT1, N1, WT2, N2, SWIGLU, QACT>(p); });
  r[d.name() + "_small"] = make_launcher<GemmGroupParams>(
      [](const GemmGroupParams& p) { gemm_tc_group_small_body<K, WT0, N0, WT1, N1, WT2, N2, SWIGLU, QACT>(p); });
}
template <int N, int K>
void add_gemm_all_formats(std::map<std::string, Launcher>& r) {
  add_gemm<WT_Q8_0, N, K>(r);
  add_gemm<WT_Q5_0, N, K>(r);
  if constexpr (K % 256 == 0) {  // the K-quants
    add_gemm<WT_Q4_K, N, K>(r);
    add_gemm<WT_Q5_K, N, K>(r);
    add_gemm<WT_Q6_K, N, K>(r);
  }
}
template <int MODE, int ACT, int K>
void add_quant(std::map<std::string, Launcher>& r) {
  const jit::cuda::QuantDesc d{static_cast<jit::cuda::QuantMode>(MODE), static_cast<jit::cuda::ActFormat>(ACT), K};
  r[d.name()] = make_launcher<QuantRowsParams>([](const QuantRowsParams& p) { quant_rows_body<MODE, ACT, K>(p); });
}
template <int K>
void add_quant_all(std::map<std::string, Launcher>& r) {  // both formats when K allows Q8_K
  add_quant<QR_PLAIN, ACT_Q8_0, K>(r);
  add_quant<QR_RMSNORM, ACT_Q8_0, K>(r);
  add_quant<QR_SWIGLU, ACT_Q8_0, K>(r);
  if constexpr (K % 256 == 0) {
    add_quant<QR_PLAIN, ACT_Q8_K, K>(r);
    add_quant<QR_RMSNORM, ACT_Q8_K, K>(r);
    add_quant<QR_SWIGLU, ACT_Q8_K, K>(r);
  }
}
template <int NH, int D, int NROT, int STYLE, int T>
void add_pack(std::map<std::string, Launcher>& r) {
  const jit::cuda::PackDesc d{NH, D, NROT, static_cast<jit::cuda::PackStyle>(STYLE), T != 0};
  r[d.name()] = make_launcher<PackParams>([](const PackParams& p) { pack_heads_body<NH, D, NROT, STYLE, T>(p); });
}
template <int NH, int NHKV, int D, int NROT, int STYLE>
void add_pack_qkv(std::map<std::string, Launcher>& r) {
  const jit::cuda::PackQkvDesc d{NH, NHKV, D, NROT, static_cast<jit::cuda::PackStyle>(STYLE)};
  r[d.name()] = make_launcher<PackQkvParams>([](const PackQkvParams& p) { pack_qkv_body<NH, NHKV, D, NROT, STYLE>(p); });
}
template <int H, int HKV, int D>
void add_attn(std::map<std::string, Launcher>& r) {
  const jit::cuda::AttnDesc d{H, HKV, D};
  r[d.name()] = make_launcher<AttnParams>([](const AttnParams& p) { attention_body<H, HKV, D>(p); });
  if constexpr (attn_quant_ok(H, D)) {  // the variants that quantise their output for the output projection
    const jit::cuda::AttnDesc q{H, HKV, D, true, jit::cuda::ActFormat::Q8_K}, q0{H, HKV, D, true, jit::cuda::ActFormat::Q8_0};
    r[q.name()] = make_launcher<AttnParams>([](const AttnParams& p) { attention_body<H, HKV, D, true, ACT_Q8_K>(p); });
    r[q0.name()] = make_launcher<AttnParams>([](const AttnParams& p) { attention_body<H, HKV, D, true, ACT_Q8_0>(p); });
  }
}

// Every kernel the tiny fixture models (llada: 4 heads of 64, dream: 4/2 heads of 64, D 256, F 768,
// vocabulary 1024) and the unit tests launch.
inline const std::map<std::string, Launcher>& emulated_kernels() {
  static const std::map<std::string, Launcher> r = [] {
    std::map<std::string, Launcher> m;
    add_gemm_all_formats<256, 256>(m);
    add_gemm_all_formats<128, 256>(m);
    add_gemm_all_formats<768, 256>(m);
    add_gemm_all_formats<256, 768>(m);
    add_gemm_all_formats<1024, 256>(m);
    add_gemm_all_formats<24, 512>(m);  // unit tests: a partial block of columns
    add_gemm_all_formats<136, 96>(m);  // Q8_0 unit test: k-blocks padded (3 -> 4)
    add_gemm<WT_Q4_K, 4096, 4096>(m);  // split-K chunks of two super-blocks (tc_chunks)
    add_quant<QR_PLAIN, ACT_Q8_K, 4096>(m);
    add_quant<QR_PLAIN, ACT_Q8_K, 1024>(m);  // the quantising attention of two heads of 512
    add_quant<QR_PLAIN, ACT_Q8_0, 1024>(m);
    add_gemm<WT_Q4_K, 264, 2048>(m);   // the tiled GEMMs: a deep pipeline, several blocks each way
    add_gemm<WT_Q6_K, 264, 2048>(m);
    add_gemm<WT_Q5_K, 264, 2048>(m);
    add_gemm<WT_Q4_K, 136, 512>(m);
    add_gemm<WT_Q6_K, 136, 512>(m);
    add_gemm<WT_Q5_K, 136, 512>(m);
    add_gemm<WT_Q5_0, 24, 704>(m);     // DiffusionGemma's down-projection width (22 k-blocks -> 24)
    // tiny-diffusion-gemma-A (D 256, 4 heads of 64 sliding / 128 global, F 192, 8 experts of 64, vocabulary
    // 1536) as Q8_0 and Q4_K_M (Q4_K, Q5_K, Q6_K, Q8_0, Q5_0).
    add_gemm<WT_Q8_0, 512, 256>(m);
    add_gemm<WT_Q4_K, 512, 256>(m);
    add_gemm<WT_Q8_0, 256, 512>(m);
    add_gemm<WT_Q5_K, 256, 512>(m);
    add_gemm<WT_Q8_0, 192, 256>(m);
    add_gemm<WT_Q4_K, 192, 256>(m);
    add_gemm<WT_Q8_0, 256, 192>(m);
    add_gemm<WT_Q5_0, 256, 192>(m);
    add_gemm<WT_Q8_0, 64, 256>(m);
    add_gemm<WT_Q4_K, 64, 256>(m);
    add_gemm<WT_Q8_0, 256, 64>(m);
    add_gemm<WT_Q5_0, 256, 64>(m);
    add_gemm<WT_Q8_0, 1536, 256>(m);
    add_gemm<WT_Q6_K, 1536, 256>(m);
    add_quant_all<192>(m);
    add_quant_all<64>(m);
    add_quant_all<256>(m);
    add_quant_all<768>(m);
    add_quant_all<512>(m);
    add_quant_all<96>(m);
    add_quant_all<704>(m);
    add_quant<QR_PLAIN, ACT_Q8_K, 2048>(m);
    add_pack<4, 64, 64, PK_NORM, 0>(m);  // llada q, k
    add_pack<4, 64, 64, PK_NONE, 1>(m);  // llada v
    add_pack<4, 64, 64, PK_NEOX, 0>(m);  // dream q
    add_pack<2, 64, 64, PK_NEOX, 0>(m);  // dream k
    add_pack<2, 64, 64, PK_NONE, 1>(m);  // dream v
    add_pack<4, 64, 64, PK_NONE, 0>(m);  // executor path: q (and llada k)
    add_pack<2, 64, 64, PK_NONE, 0>(m);  // executor path: dream k
    add_pack<2, 128, 128, PK_NONE, 0>(m);
    add_pack<1, 128, 128, PK_NONE, 0>(m);
    add_pack<1, 128, 128, PK_NONE, 1>(m);
    add_pack<4, 128, 128, PK_NEOX, 0>(m);  // diffusion-gemma's global layers: q, k
    add_pack<1, 128, 128, PK_NEOX, 0>(m);
    add_pack<2, 64, 32, PK_NORM, 0>(m);  // partial rotation
    add_pack<2, 64, 32, PK_NEOX, 0>(m);
    add_attn<4, 4, 64>(m);
    add_attn<4, 2, 64>(m);
    add_attn<2, 1, 128>(m);
    add_attn<4, 1, 128>(m);  // diffusion-gemma's global layers (sliding: 4, 2, 64)
    // Heads wider than 128 (the real DiffusionGemma: 256 sliding, 512 global), through the executor's path.
    add_pack<2, 256, 256, PK_NONE, 0>(m);
    add_pack<1, 256, 256, PK_NONE, 0>(m);
    add_pack<1, 256, 256, PK_NONE, 1>(m);
    add_pack<2, 512, 512, PK_NONE, 0>(m);
    add_pack<1, 512, 512, PK_NONE, 0>(m);
    add_pack<1, 512, 512, PK_NONE, 1>(m);
    add_attn<2, 1, 256>(m);
    add_attn<2, 1, 512>(m);
    // The grouped products of the Q4_K_M fixtures (a layer's Q, K, V; K, V; gate, up).
    add_gemm_group<256, WT_Q4_K, 256, WT_Q4_K, 256, WT_Q6_K, 256>(m);  // llada
    add_gemm_group<256, WT_Q4_K, 256, WT_Q4_K, 256, WT_Q4_K, 256>(m);
    add_gemm_group<256, WT_Q4_K, 256, WT_Q6_K, 256>(m);
    add_gemm_group<256, WT_Q4_K, 256, WT_Q4_K, 256>(m);
    add_gemm_group<256, WT_Q4_K, 768, WT_Q4_K, 768>(m);
    add_gemm_group<256, WT_Q4_K, 768, WT_Q4_K, 768, 0, 0, true>(m);  // llada's feed-forward, quantising SwiGLU
    add_gemm_group<512, WT_Q4_K, 768, WT_Q6_K, 768, 0, 0, true>(m);  // unit tests: two column blocks a span, mixed
    add_gemm_group<512, WT_Q4_K, 768, WT_Q6_K, 768>(m);
    add_gemm_group<256, WT_Q4_K, 256, WT_Q4_K, 128, WT_Q6_K, 128>(m);  // dream
    add_gemm_group<256, WT_Q4_K, 256, WT_Q4_K, 128, WT_Q4_K, 128>(m);
    add_gemm_group<256, WT_Q4_K, 128, WT_Q6_K, 128>(m);
    add_gemm_group<256, WT_Q4_K, 128, WT_Q4_K, 128>(m);
    add_gemm_group<256, WT_Q4_K, 192, WT_Q4_K, 192>(m);  // diffusion-gemma: the shared MLP, self-conditioning
    add_gemm_group<512, WT_Q4_K, 136, WT_Q6_K, 24, WT_Q5_K, 136>(m);  // unit test: mixed formats and widths
    add_gemm_group<512, WT_Q4_K, 136, WT_Q6_K, 24>(m);
    // The Q8_0 fixtures' groups (the SwiGLU variant quantises Q8_0 for their down projections).
    add_gemm_group<256, WT_Q8_0, 768, WT_Q8_0, 768, 0, 0, true, ACT_Q8_0>(m);
    add_gemm_group<512, WT_Q8_0, 768, WT_Q5_0, 768, 0, 0, true, ACT_Q8_0>(m);  // unit tests: mixed per-32 types
    add_gemm_group<512, WT_Q8_0, 768, WT_Q5_0, 768>(m);
    add_gemm_group<256, WT_Q8_0, 256, WT_Q8_0, 256, WT_Q8_0, 256>(m);  // llada, llada-moe, rnd1
    add_gemm_group<256, WT_Q8_0, 256, WT_Q8_0, 256>(m);
    add_gemm_group<256, WT_Q8_0, 768, WT_Q8_0, 768>(m);
    add_gemm_group<256, WT_Q8_0, 256, WT_Q8_0, 128, WT_Q8_0, 128>(m);  // dream, diffusion-gemma
    add_gemm_group<256, WT_Q8_0, 128, WT_Q8_0, 128>(m);
    add_gemm_group<256, WT_Q8_0, 192, WT_Q8_0, 192>(m);
    add_gemm_group<256, WT_Q8_0, 512, WT_Q8_0, 128>(m);  // diffusion-gemma's global layers (q, k)
    add_gemm_group<256, WT_Q4_K, 256, WT_Q8_0, 256, WT_Q8_0, 256>(m);  // Q4_K_M fixtures whose k and v are Q8_0
    add_gemm_group<256, WT_Q8_0, 256, WT_Q8_0, 256>(m);
    add_gemm_group<256, WT_Q4_K, 256, WT_Q8_0, 128, WT_Q8_0, 128>(m);
    add_gemm_group<256, WT_Q4_K, 512, WT_Q8_0, 128>(m);
    add_gemm_group<512, WT_Q8_0, 136, WT_Q5_0, 24, WT_Q4_K, 136>(m);  // unit test: per-32 members beside a K-quant
    add_gemm_group<512, WT_Q8_0, 136, WT_Q5_0, 24>(m);
    add_gemm<WT_Q8_0, 136, 512>(m);
    add_gemm<WT_Q5_0, 24, 512>(m);
    add_gemm<WT_Q5_0, 136, 704>(m);  // unit tests: a short last step (tc_last_blocks), several chunks
    add_gemm<WT_Q8_0, 136, 704>(m);
    add_gemm<WT_Q8_0, 24, 704>(m);
    // The fused packs of the forward program's attention, per fixture geometry.
    add_pack_qkv<4, 4, 64, 64, PK_NORM>(m);   // llada
    add_pack_qkv<4, 2, 64, 64, PK_NEOX>(m);   // dream, diffusion-gemma's sliding layers
    add_pack_qkv<4, 4, 64, 64, PK_NEOX>(m);   // llada-moe, rnd1
    add_pack_qkv<4, 1, 128, 128, PK_NEOX>(m); // diffusion-gemma's global layers
    m[jit::cuda::kRowCopyKernel] = make_launcher<RowCopyParams>([](const RowCopyParams& p) { copy_rows_body(p); });
    return m;
  }();
  return r;
}

class EmulatorDevice : public jit::cuda::Device {
 public:
  ~EmulatorDevice() override {
    for (auto& [addr, size] : allocs_) std::free(reinterpret_cast<void*>(addr));
  }
  std::string describe() const override { return "CPU emulator"; }
  // An H100's 132 SMs by default, so the small shapes of the tests take the split tiling; tests set it to 0 for
  // the wide one.
  int sm_count() const override { return sms; }
  int sms = 132;

  jit::cuda::DevAddr alloc(size_t bytes) override {
    void* p = std::aligned_alloc(256, (bytes + kRedZone + 255) / 256 * 256);
    if (!p) throw std::bad_alloc();
    std::memset(p, 0xff, bytes);
    std::memset(static_cast<char*>(p) + bytes, kCanary, kRedZone);
    const auto a = reinterpret_cast<jit::cuda::DevAddr>(p);
    allocs_[a] = bytes;
    return a;
  }
  void free(jit::cuda::DevAddr a) noexcept override {
    if (capturing_) {
      deferred_free_.push_back(a);
      return;
    }
    auto it = allocs_.find(a);
    if (it == allocs_.end()) {
      ++bad_frees_;
      return;
    }
    const unsigned char* z = reinterpret_cast<const unsigned char*>(a) + it->second;
    for (size_t i = 0; i < kRedZone; ++i) overruns_ += z[i] != kCanary;
    std::free(reinterpret_cast<void*>(a));
    allocs_.erase(it);
  }
  void upload(jit::cuda::DevAddr dst, const void* src, size_t bytes) override {
    check_range(dst, bytes);
    if (capturing_) {
      auto staged = std::make_shared<std::vector<char>>(static_cast<const char*>(src), static_cast<const char*>(src) + bytes);
      record("upload", [this, dst, staged] {
        check_range(dst, staged->size());
        std::memcpy(reinterpret_cast<void*>(dst), staged->data(), staged->size());
      });
      return;
    }
    std::memcpy(reinterpret_cast<void*>(dst), src, bytes);
  }
  void download(void* dst, jit::cuda::DevAddr src, size_t bytes) override {
    if (capturing_) end_capture({});
    check_range(src, bytes);
    ++downloads_;
    download_bytes_ += bytes;
    std::memcpy(dst, reinterpret_cast<const void*>(src), bytes);
  }
  void zero(jit::cuda::DevAddr dst, size_t bytes) override {
    check_range(dst, bytes);
    if (capturing_) {
      record("zero", [this, dst, bytes] { zero(dst, bytes); });
      return;
    }
    std::memset(reinterpret_cast<void*>(dst), 0, bytes);
  }
  void copy(jit::cuda::DevAddr dst, jit::cuda::DevAddr src, size_t bytes) override {
    check_range(dst, bytes);
    check_range(src, bytes);
    ++copies_;
    if (capturing_) {
      record("copy", [this, dst, src, bytes] {
        check_range(dst, bytes);
        check_range(src, bytes);
        std::memcpy(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), bytes);
      });
      return;
    }
    std::memcpy(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), bytes);
  }
  void synchronize() override {
    ++synchronizes_;
    if (capturing_) end_capture({});
  }
  // The profile's timers: the host's clock when the mark is made (work outside a capture runs at its call).
  bool has_timers() const override { return timers_; }
  size_t mark() override {
    if (capturing_) throw std::runtime_error("emulator: a profile timer inside a capture");
    marks_.push_back(std::chrono::steady_clock::now());
    ++marks_made_;
    return marks_.size() - 1;
  }
  double seconds_between(size_t a, size_t b) override {
    if (a >= marks_.size() || b >= marks_.size()) throw std::runtime_error("emulator: an unknown profile timer");
    return std::chrono::duration<double>(marks_[b] - marks_[a]).count();
  }
  void clear_marks() override { marks_.clear(); }
  bool timers_ = true;  // false: a device without timers (the executor synchronises instead)
  size_t synchronizes() const { return synchronizes_; }
  size_t marks_made() const { return marks_made_; }

  void load_kernels(const jit::cuda::KernelSet& set) override {
    bool added = false;
    for (const std::string& n : set.names()) {
      if (!emulated_kernels().count(n)) throw std::runtime_error("the emulator has no instantiation of " + n);
      added = loaded_.insert(n).second || added;
    }
    if (added) ++stats_.units_compiled;
  }
  bool has_kernel(const std::string& name) const override { return loaded_.count(name) != 0; }
  void launch(const std::string& name, const Launch& dims, const void* params, size_t bytes) override {
    if (!loaded_.count(name)) throw std::runtime_error("kernel " + name + " launched before load_kernels()");
    if (capturing_) {  // the parameters are read at the call, as cuLaunchKernel does
      auto p = std::make_shared<std::vector<char>>(static_cast<const char*>(params), static_cast<const char*>(params) + bytes);
      ++captured_kernels_;
      record(name, [this, name, dims, p] { run_kernel(name, dims, p->data()); });
      return;
    }
    ++eager_launches_;
    run_kernel(name, dims, params);
  }
  const jit::cuda::KernelLoadStats& load_stats() const override { return stats_; }

  bool supports_graphs() const override { return graphs; }
  bool graphs = true;  // tests turn graph capture off to compare
  void begin_capture() override {
    if (!graphs || capturing_) return;
    capturing_ = true;
    recorded_.clear();
    captured_kernels_ = 0;
  }
  bool end_capture(std::span<const int64_t> key) override {
    if (!capturing_) return false;
    capturing_ = false;
    std::vector<std::string> topology;
    for (const auto& [kind, run] : recorded_) topology.push_back(kind);
    const bool kept = !key.empty();
    if (!kept) {
      ++stats_g_.broken;
    } else {
      ++stats_g_.captured;
      bool updated = false;
      for (auto* e : cache_.candidates(key)) {
        if (e->exec == topology) {  // CUDA updates a graph of the same nodes and edges
          ++stats_g_.updated;
          cache_.touch(*e, key);
          updated = true;
          break;
        }
      }
      if (!updated) {
        ++stats_g_.instantiated;
        cache_.add(key, topology);
      }
    }
    ++graph_launches_;
    stats_g_.graph_kernels += captured_kernels_;
    std::vector<std::pair<std::string, std::function<void()>>> work;
    work.swap(recorded_);
    for (auto& [kind, run] : work) run();
    std::vector<jit::cuda::DevAddr> frees;
    frees.swap(deferred_free_);
    for (jit::cuda::DevAddr a : frees) free(a);
    return kept;
  }
  bool capturing() const override { return capturing_; }
  jit::cuda::GraphStats graph_stats() const override { return stats_g_; }
  size_t graph_launches() const { return graph_launches_; }  // graphs run, kept or not
  size_t eager_launches() const { return eager_launches_; }  // kernels launched one by one
  size_t copies() const { return copies_; }                  // device-to-device copies
  size_t cached_graphs() const { return cache_.size(); }

  // Checks for tests: writes past an allocation (seen when it is freed) and frees of unknown addresses.
  size_t overruns() const { return overruns_; }
  size_t bad_frees() const { return bad_frees_; }
  size_t live_allocations() const { return allocs_.size(); }
  size_t launches() const { return launches_; }  // kernels run, in graphs or not
  const std::map<std::string, size_t>& launch_counts() const { return launch_counts_; }  // by kernel name
  size_t downloads() const { return downloads_; }  // device-to-host copies, and their bytes
  size_t download_bytes() const { return download_bytes_; }
  // Checks every live allocation's canary zone.
  size_t live_overruns() const {
    size_t n = 0;
    for (const auto& [a, size] : allocs_) {
      const unsigned char* z = reinterpret_cast<const unsigned char*>(a) + size;
      for (size_t i = 0; i < kRedZone; ++i) n += z[i] != kCanary;
    }
    return n;
  }

 private:
  void run_kernel(const std::string& name, const Launch& dims, const void* params) {
    ++launches_;
    ++launch_counts_[name];
    emulated_kernels().at(name)(dims, params);
  }
  void record(std::string kind, std::function<void()> run) { recorded_.emplace_back(std::move(kind), std::move(run)); }

  static constexpr size_t kRedZone = 256;
  static constexpr unsigned char kCanary = 0xa5;
  void check_range(jit::cuda::DevAddr a, size_t bytes) const {
    auto it = allocs_.upper_bound(a);
    if (it == allocs_.begin()) throw std::runtime_error("emulator: copy outside any allocation");
    --it;
    if (a + bytes > it->first + it->second) throw std::runtime_error("emulator: copy past the end of an allocation");
  }

  std::map<jit::cuda::DevAddr, size_t> allocs_;
  std::set<std::string> loaded_;
  std::map<std::string, size_t> launch_counts_;
  jit::cuda::KernelLoadStats stats_;
  size_t overruns_ = 0, bad_frees_ = 0, launches_ = 0, downloads_ = 0, download_bytes_ = 0;
  size_t eager_launches_ = 0, copies_ = 0, graph_launches_ = 0, captured_kernels_ = 0;
  size_t synchronizes_ = 0, marks_made_ = 0;
  std::vector<std::chrono::steady_clock::time_point> marks_;
  bool capturing_ = false;
  std::vector<std::pair<std::string, std::function<void()>>> recorded_;
  std::vector<jit::cuda::DevAddr> deferred_free_;
  jit::cuda::GraphCache<std::vector<std::string>> cache_;
  jit::cuda::GraphStats stats_g_;
};

}  // namespace dllm::test
