// Measurements behind `dllm bench`: this machine's int8 multiply-accumulate peak and streaming read
// bandwidth (JIT'd loops, every thread), and the GEMM kernels' throughput on given shapes with random
// repacked weights, against both ceilings.
#pragma once
#include <cstdint>
#include <string>

#include "jit/cpu_features.h"
#include "model/ggml_types.h"

namespace dllm {
class ThreadPool;
}

namespace dllm::jit {

struct PeakResult {
  Isa isa = Isa::Avx512Vnni;
  int threads = 1;
  double int8_gops = 0;             // 2 ops (multiply + add) per int8 MAC, all threads, best of the runs
  double int8_gops_per_thread = 0;  // one thread alone
  double read_gbs = 0;              // streaming read, all threads, best of the runs (1 GB = 1e9 bytes)
  int64_t read_buffer_bytes = 0;    // twice the last-level cache, at least 256 MiB
  double cpu_share = 0;             // process CPU time / (wall time x threads) while measuring: below 1
                                    // when other processes took cores from us (a loaded machine)
  double int8_gops_per_cpu_second = 0;  // one thread, per second of its own CPU time: the per-core peak,
                                        // meaningful even on a machine shared with other processes
  double read_gb_per_cpu_second = 0;    // the read loop's bytes per second of process CPU time
};

// Runs the peak loop and the read loop (about a second in all).
PeakResult measure_peak(Isa isa, ThreadPool& pool);

struct GemmBenchResult {
  GgmlType type = GgmlType::Q4_K;
  int64_t n = 0, k = 0, rows = 0;
  Isa isa = Isa::Avx512Vnni;
  int threads = 1;
  int reps = 0;
  double median_s = 0, min_s = 0;  // gemm() only (activations already quantised)
  double quant_s = 0;              // quantising the activation rows once (median)
  double repack_s = 0;             // preparing the weights once
  double gops = 0;                 // 2*rows*n*k / median
  double weight_gbs = 0;           // packed weight bytes / median (each weight byte is read once per call)
  int64_t packed_bytes = 0, gguf_bytes = 0;
  int64_t copies = 1;              // weight copies cycled through so that every call reads from memory
  std::string kernel;              // the full-tile kernel's name
  double cpu_share = 0;            // process CPU time / (wall time x threads) over the timed calls
  double gops_per_cpu_second = 0;  // operations per second of process CPU time (compare with the peak's)
  double weight_gb_per_cpu_second = 0;  // packed weight bytes per second of process CPU time
};

// Times gemm() on random weights of the given type and shape (rows activation rows), cycling through
// enough copies of the weights to exceed twice the last-level cache when cold is set.
GemmBenchResult bench_gemm(GgmlType type, int64_t n, int64_t k, int64_t rows, Isa isa, ThreadPool& pool,
                           bool cold = true, double min_seconds = 0.5);

struct KernelBenchResult {
  std::string kernel;
  int64_t rows = 0;                // rows actually timed: whole tiles, at least one
  double ops_per_call = 0;
  double gops_per_cpu_second = 0;  // one thread, kernel calls only (no driver, no threads), best of 5 passes
  double peak_gops_per_cpu_second = 0;  // the same thread's int8 peak loop
  bool resident = false;           // one tile over panels whose weights fit in 32 KB, called repeatedly
  int64_t panels = 0;              // resident: the panels each call covers
};

// The kernel alone on one thread, timed with the thread's own CPU time (robust on a busy machine):
// `rows` activation rows in full tiles (rows rounded down to the family's tile; at least one tile),
// panel runs of 4 panels with every row tile passing over each run (the driver's blocking). With
// resident set: one full tile over the first panels (weights within 32 KB), called over and over, so
// that weights and activations stay in L1/L2: the kernel's instruction-bound ceiling, no memory traffic.
KernelBenchResult bench_kernel(GgmlType type, int64_t n, int64_t k, int64_t rows, Isa isa, bool resident = false);

// Random rows in ggml's block format (random quants, plausible finite scales); for benches and tests.
void random_ggml_rows(GgmlType type, int64_t n, int64_t k, uint64_t seed, uint8_t* out);

// The last-level cache size (bytes) the OS reports, or 32 MiB when it reports none.
int64_t last_level_cache_bytes();

}  // namespace dllm::jit
