// The peak and bandwidth measurements and the GEMM bench (random weights, median of repeated calls).
#include "jit/bench.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <ctime>
#include <random>
#include <vector>

#include "jit/gemm.h"
#include "jit/kernel_cache.h"
#include "jit/x64/bench_gen.h"
#include "common/error.h"
#include "model/quant.h"
#include "common/thread_pool.h"

namespace dllm::jit {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// User + system CPU time of the whole process, seconds.
double process_cpu_seconds() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_utime.tv_sec + ru.ru_stime.tv_sec + 1e-6 * (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
}

double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

int64_t last_level_cache_bytes() {
  long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
  if (l3 <= 0) l3 = sysconf(_SC_LEVEL2_CACHE_SIZE);
  return l3 > 0 ? l3 : 32 << 20;
}

PeakResult measure_peak(Isa isa, ThreadPool& pool) {
  PeakResult res;
  res.isa = isa;
  res.threads = pool.size();

  PeakGen peak(isa);
  peak.create();
  const auto peak_fn = peak.fn();
  const int64_t iters = 200000;  // ~1-2 ms per item
  peak_fn(iters);                // warm up (clocks, code)
  double best_one = 0, best_all = 0, cpu = 0, wall = 0;
  for (int run = 0; run < 3; ++run) {
    auto t0 = Clock::now();
    const double tc0 = thread_cpu_seconds();
    peak_fn(iters * 10);
    const double ops = 2.0 * peak.macs_per_iteration() * iters * 10;
    best_one = std::max(best_one, ops / seconds_since(t0) / 1e9);
    res.int8_gops_per_cpu_second = std::max(res.int8_gops_per_cpu_second, ops / (thread_cpu_seconds() - tc0) / 1e9);
    const int64_t items = 16 * res.threads;
    const double c0 = process_cpu_seconds();
    t0 = Clock::now();
    pool.parallel_for(items, [&](int64_t, int) { peak_fn(iters); });
    const double w = seconds_since(t0);
    cpu += process_cpu_seconds() - c0;
    wall += w;
    best_all = std::max(best_all, 2.0 * peak.macs_per_iteration() * iters * items / w / 1e9);
  }
  res.cpu_share = cpu / (wall * res.threads);
  res.int8_gops = best_all;
  res.int8_gops_per_thread = best_one;

  ReadGen reader(isa);
  reader.create();
  const auto read_fn = reader.fn();
  res.read_buffer_bytes = std::max<int64_t>(256 << 20, 2 * last_level_cache_bytes());
  AlignedArray<uint8_t> buf(static_cast<size_t>(res.read_buffer_bytes));
  std::memset(buf.data(), 1, buf.size());  // touch every page
  const int64_t chunk = 4 << 20;
  const int64_t chunks = res.read_buffer_bytes / chunk;
  for (int run = 0; run < 4; ++run) {
    const double c0 = process_cpu_seconds();
    const auto t0 = Clock::now();
    pool.parallel_for(chunks, [&](int64_t c, int) { read_fn(buf.data() + c * chunk, chunk); });
    res.read_gbs = std::max(res.read_gbs, chunks * chunk / seconds_since(t0) / 1e9);
    res.read_gb_per_cpu_second =
        std::max(res.read_gb_per_cpu_second, chunks * chunk / (process_cpu_seconds() - c0) / 1e9);
  }
  return res;
}

void random_ggml_rows(GgmlType type, int64_t n, int64_t k, uint64_t seed, uint8_t* out) {
  const auto info = ggml_type_info(static_cast<uint32_t>(type));
  if (!info || k % info->block_size) throw Error("random_ggml_rows: bad type or row length");
  const int64_t blocks = n * (k / info->block_size);
  std::mt19937_64 rng(seed);
  const size_t bytes = static_cast<size_t>(blocks) * info->type_size;
  for (size_t i = 0; i < bytes; i += 8) {
    const uint64_t v = rng();
    std::memcpy(out + i, &v, std::min<size_t>(8, bytes - i));
  }
  std::uniform_real_distribution<float> mag(1e-3f, 2e-2f);
  for (int64_t b = 0; b < blocks; ++b) {
    uint8_t* p = out + b * info->type_size;
    const uint16_t d = quant::f32_to_fp16(mag(rng)), dmin = quant::f32_to_fp16(mag(rng));
    switch (type) {
      case GgmlType::Q4_K:
      case GgmlType::Q5_K: std::memcpy(p, &d, 2); std::memcpy(p + 2, &dmin, 2); break;
      case GgmlType::Q6_K: std::memcpy(p + 208, &d, 2); break;
      case GgmlType::Q8_0:
      case GgmlType::Q5_0: std::memcpy(p, &d, 2); break;
      default: throw Error("random_ggml_rows: no random blocks for " + ggml_type_name(type));
    }
  }
}

GemmBenchResult bench_gemm(GgmlType type, int64_t n, int64_t k, int64_t rows, Isa isa, ThreadPool& pool, bool cold,
                           double min_seconds) {
  if (!jit_supports_type(type)) throw Error("bench gemm: no kernel for " + ggml_type_name(type));
  if (rows < 1 || n < 1 || k < 1) throw Error("bench gemm: --n, --k and --rows must be positive");
  GemmBenchResult res;
  res.type = type;
  res.n = n;
  res.k = k;
  res.rows = rows;
  res.isa = isa;
  res.threads = pool.size();

  const auto info = ggml_type_info(static_cast<uint32_t>(type));
  res.gguf_bytes = n * (k / info->block_size) * info->type_size;
  std::vector<uint8_t> src(static_cast<size_t>(res.gguf_bytes));
  random_ggml_rows(type, n, k, 42, src.data());

  std::vector<QuantMatrix> mats;
  mats.push_back(prepare_matrix(type, k, n, src.data(), isa, pool, "bench matrix"));
  res.repack_s = mats[0].repack_seconds;
  res.packed_bytes = isa == Isa::Portable ? res.gguf_bytes : mats[0].layout.total_bytes();
  if (cold && isa != Isa::Portable) {
    const int64_t want = 2 * last_level_cache_bytes();
    const int64_t cap = int64_t{3} << 30;
    res.copies = std::clamp<int64_t>((want + res.packed_bytes - 1) / res.packed_bytes, 1,
                                     std::max<int64_t>(1, cap / res.packed_bytes));
    for (int64_t c = 1; c < res.copies; ++c) {
      QuantMatrix m;
      m.type = mats[0].type;
      m.isa = mats[0].isa;
      m.n = n;
      m.k = k;
      m.layout = mats[0].layout;
      m.src = mats[0].src;
      m.packed.resize(mats[0].packed.size());
      std::memcpy(m.packed.data(), mats[0].packed.data(), m.packed.size());
      mats.push_back(std::move(m));
    }
  }

  std::vector<float> x(static_cast<size_t>(rows * k));
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (auto& v : x) v = nd(rng);
  std::vector<float> y(static_cast<size_t>(rows * n));
  QuantizedActs acts;
  std::vector<double> qtimes;
  for (int i = 0; i < 3; ++i) {
    const auto t0 = Clock::now();
    quantize_acts(act_format_for(type), x.data(), rows, k, acts, pool);
    qtimes.push_back(seconds_since(t0));
  }
  res.quant_s = median(qtimes);
  if (isa != Isa::Portable) res.kernel = kernels_for(mats[0], rows).front()->name();

  gemm(mats[0], acts, y.data(), pool);  // warm-up: kernels generated, pages touched
  std::vector<double> times;
  const double c0 = process_cpu_seconds();
  const auto start = Clock::now();
  for (int64_t i = 0; times.size() < 5 || (seconds_since(start) < min_seconds && times.size() < 200); ++i) {
    const QuantMatrix& m = mats[static_cast<size_t>(i % res.copies)];
    const auto t0 = Clock::now();
    gemm(m, acts, y.data(), pool);
    times.push_back(seconds_since(t0));
  }
  const double cpu = process_cpu_seconds() - c0;
  res.cpu_share = cpu / (seconds_since(start) * res.threads);
  res.gops_per_cpu_second = 2.0 * rows * n * k * static_cast<double>(times.size()) / cpu / 1e9;
  res.weight_gb_per_cpu_second = static_cast<double>(res.packed_bytes) * static_cast<double>(times.size()) / cpu / 1e9;
  res.reps = static_cast<int>(times.size());
  res.median_s = median(times);
  res.min_s = *std::min_element(times.begin(), times.end());
  res.gops = 2.0 * rows * n * k / res.median_s / 1e9;
  res.weight_gbs = res.packed_bytes / res.median_s / 1e9;
  return res;
}

KernelBenchResult bench_kernel(GgmlType type, int64_t n, int64_t k, int64_t rows, Isa isa, bool resident) {
  if (!jit_supports_type(type)) throw Error("bench kernel: no kernel for " + ggml_type_name(type));
  if (isa == Isa::Portable) throw Error("bench kernel: the portable family has no kernels");
  ThreadPool one(1);
  KernelBenchResult res;
  PeakGen peak(isa);
  peak.create();
  peak.fn()(100000);
  for (int i = 0; i < 5; ++i) {
    const double t0 = thread_cpu_seconds();
    peak.fn()(1000000);
    res.peak_gops_per_cpu_second = std::max(res.peak_gops_per_cpu_second,
                                            2.0 * peak.macs_per_iteration() * 1e6 / (thread_cpu_seconds() - t0) / 1e9);
  }
  const auto info = ggml_type_info(static_cast<uint32_t>(type));
  std::vector<uint8_t> src(static_cast<size_t>(n * (k / info->block_size) * info->type_size));
  random_ggml_rows(type, n, k, 1, src.data());
  const QuantMatrix w = prepare_matrix(type, k, n, src.data(), isa, one, "bench matrix");
  const int m = max_row_tile(isa, type, k);
  const int64_t tiles = resident ? 1 : std::max<int64_t>(1, rows / m);
  res.rows = tiles * m;
  res.resident = resident;
  std::vector<float> x(static_cast<size_t>(tiles * m * k));
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (auto& v : x) v = nd(rng);
  QuantizedActs a;
  quantize_acts(act_format_for(type), x.data(), tiles * m, k, a, one);
  if (isa == Isa::Amx) build_amx_tiles(a, one);
  GemmDesc d;
  d.isa = isa;
  d.wtype = type;
  d.n = n;
  d.k = k;
  d.m = m;
  const auto kernel = KernelCache::global().get(d);
  res.kernel = kernel->name();
  std::vector<float> y(static_cast<size_t>(tiles * m * n));
  const PackedLayout& L = w.layout;
  if (resident) {
    // One tile over the first panels, their weights within 32 KB (at least one panel), called until a
    // pass has taken 0.1 s of CPU time: the kernel with its operands in L1/L2, no memory traffic.
    res.panels = std::clamp<int64_t>((32 * 1024) / L.panel_bytes, 1, L.n_panels);
    GemmKernelArgs args{};
    args.w = w.packed.data();
    args.n_panels = res.panels;
    args.tail_cols = res.panels == L.n_panels ? n - (L.n_panels - 1) * L.p : L.p;
    point_at_rows(args, a, isa, 0);
    args.y = y.data();
    int64_t calls = 1;
    for (double t = 0; t < 0.1; calls *= 2) {
      const double t0 = thread_cpu_seconds();
      for (int64_t i = 0; i < calls; ++i) kernel->fn()(&args);
      t = thread_cpu_seconds() - t0;
    }
    calls /= 2;
    double best = 1e30;
    for (int pass = 0; pass < 5; ++pass) {
      const double t0 = thread_cpu_seconds();
      for (int64_t i = 0; i < calls; ++i) kernel->fn()(&args);
      best = std::min(best, thread_cpu_seconds() - t0);
    }
    res.ops_per_call = 2.0 * m * std::min(n, res.panels * L.p) * k;
    res.gops_per_cpu_second = res.ops_per_call * static_cast<double>(calls) / best / 1e9;
    return res;
  }
  const int64_t run = 4;
  double best = 1e30;
  for (int pass = 0; pass < 5; ++pass) {
    const double t0 = thread_cpu_seconds();
    for (int64_t p0 = 0; p0 < L.n_panels; p0 += run) {
      GemmKernelArgs args{};
      args.w = w.packed.data() + p0 * L.panel_bytes;
      args.n_panels = std::min(run, L.n_panels - p0);
      args.tail_cols = p0 + args.n_panels == L.n_panels ? n - (L.n_panels - 1) * L.p : L.p;
      for (int64_t t = 0; t < tiles; ++t) {
        const int64_t r0 = t * m;
        point_at_rows(args, a, isa, r0);
        args.y = y.data() + r0 * n + p0 * L.p;
        kernel->fn()(&args);
      }
    }
    best = std::min(best, thread_cpu_seconds() - t0);
  }
  res.ops_per_call = 2.0 * static_cast<double>(tiles * m) * n * k;
  res.gops_per_cpu_second = res.ops_per_call / best / 1e9;
  return res;
}

}  // namespace dllm::jit
