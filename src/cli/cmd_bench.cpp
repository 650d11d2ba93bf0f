// `dllm bench peak` (int8 peak and read bandwidth of this machine) and `dllm bench gemm` (the JIT GEMM
// on one shape, against both).
#include <cxxopts.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/commands_jit.h"
#include "jit/bench.h"
#include "jit/gemm_desc.h"
#include "jit/weight_types.h"
#include "common/error.h"
#include "common/thread_pool.h"

namespace dllm::cli {

namespace {

const char* kPeakSynopsis = "bench peak [--threads N] [--isa F] [--json]";
const char* kGemmSynopsis =
    "bench gemm --type Q4_K|Q5_K|Q6_K|Q8_0|Q5_0 --n N --k K --rows M[,M...] [--threads N] [--isa F] [--warm] "
    "[--min-seconds S] [--no-peak] [--json]";

const char* kKernelSynopsis =
    "bench kernel --type Q4_K|Q5_K|Q6_K|Q8_0|Q5_0 --n N --k K [--rows M[,M...]] [--isa F] [--resident] [--json]";

std::string gemm_help() {
  return "  --type T         weight type: Q4_K, Q5_K, Q6_K, Q8_0 or Q5_0\n"
         "  --n N            weight rows (outputs)\n"
         "  --k K            row length (inputs): a multiple of 256 (Q4_K, Q5_K, Q6_K) or 32 (Q8_0, Q5_0)\n"
         "  --rows M[,M...]  activation rows; a list runs each\n"
         "  --threads N      worker threads (default: all logical CPUs)\n"
         "  --isa F          kernel family: " + isa_list() + " (default: the best this CPU\n"
         "                   has, capped by DLLM_ISA)\n"
         "  --warm           reuse one weight copy (cache-warm) instead of cycling through copies that together\n"
         "                   exceed twice the last-level cache (each call then streams its weights from memory)\n"
         "  --min-seconds S  time each shape for at least S seconds (default 0.5; at least 5 runs)\n"
         "  --no-peak        skip measuring the peak and bandwidth first (no fractions are printed)\n"
         "  --json           print one JSON object\n";
}

// Parses args with cxxopts; usage errors for unknown flags and stray words. cxxopts cannot declare
// one-letter long flags, so --n and --k travel as --n-out and --k-in.
cxxopts::ParseResult parse(cxxopts::Options& opts, const std::vector<std::string>& args, const std::string& cmd) {
  std::vector<std::string> words = {"dllm"};
  for (const std::string& a : args) words.push_back(a == "--n" ? "--n-out" : a == "--k" ? "--k-in" : a);
  std::vector<char*> argv;
  for (auto& w : words) argv.push_back(w.data());
  try {
    cxxopts::ParseResult res = opts.parse(static_cast<int>(argv.size()), argv.data());
    if (!res.unmatched().empty())
      throw usage_error("unexpected argument '" + res.unmatched().front() + "' for dllm " + cmd, "see: dllm " + cmd + " --help");
    return res;
  } catch (const cxxopts::exceptions::exception& e) {
    throw usage_error(std::string(e.what()) + " (dllm " + cmd + ")", "see: dllm " + cmd + " --help");
  }
}

int threads_from(const cxxopts::ParseResult& res) {
  if (!res.count("threads")) return ThreadPool::hardware_threads();
  const int t = res["threads"].as<int>();
  if (t < 1 || t > 1024) throw usage_error("--threads must be between 1 and 1024, got " + std::to_string(t));
  return t;
}

std::string fmt(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

nlohmann::json peak_json(const jit::PeakResult& p) {
  return {{"cpu", jit::cpu_features().brand},       {"isa", jit::isa_name(p.isa)},
          {"threads", p.threads},                   {"int8_gops", p.int8_gops},
          {"int8_gops_per_thread", p.int8_gops_per_thread}, {"read_gbs", p.read_gbs},
          {"read_buffer_bytes", p.read_buffer_bytes}, {"cpu_share", p.cpu_share},
          {"int8_gops_per_cpu_second", p.int8_gops_per_cpu_second},
          {"read_gb_per_cpu_second", p.read_gb_per_cpu_second}};
}

std::string peak_text(const jit::PeakResult& p) {
  return "int8 peak: " + fmt(p.int8_gops, 1) + " GOPS with " + std::to_string(p.threads) + " threads (" +
         fmt(p.int8_gops_per_thread, 1) + " GOPS one thread; " + fmt(p.int8_gops_per_cpu_second, 1) +
         " GOPS per CPU-second), " + jit::isa_name(p.isa) + "\n" +
         "read bandwidth: " + fmt(p.read_gbs, 2) + " GB/s (" + std::to_string(p.read_buffer_bytes >> 20) +
         " MiB buffer; " + fmt(p.read_gb_per_cpu_second, 2) + " GB per CPU-second)\n" + (p.cpu_share < 0.9 ? "note: this process got " + fmt(100 * p.cpu_share, 0) +
         "% of its threads' time (a busy machine): the numbers are low\n" : "");
}

int bench_peak(const std::vector<std::string>& args) {
  cxxopts::Options opts("dllm bench peak", "Measures this machine's int8 multiply-accumulate peak and read bandwidth.");
  opts.add_options()("threads", "worker threads (default: all logical CPUs)", cxxopts::value<int>())(
      "isa", "kernel family (default: the best this CPU has, capped by DLLM_ISA)", cxxopts::value<std::string>())(
      "json", "print one JSON object")("h,help", "this help");
  const auto res = parse(opts, args, "bench peak");
  if (res.count("help")) {
    std::cout << "usage: dllm " << kPeakSynopsis << "\n" << opts.help({""}) ;
    return 0;
  }
  const jit::Isa isa = isa_from_flag(res.count("isa") ? res["isa"].as<std::string>() : "", "bench peak");
  if (isa == jit::Isa::Portable) throw usage_error("bench peak needs a JIT kernel family, not portable");
  ThreadPool pool(threads_from(res));
  const jit::PeakResult p = jit::measure_peak(isa, pool);
  if (res.count("json")) std::cout << peak_json(p).dump(1) << "\n";
  else std::cout << peak_text(p);
  return 0;
}

std::vector<int64_t> parse_rows(const std::string& s) {
  std::vector<int64_t> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    char* end = nullptr;
    const long long v = std::strtoll(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || v < 1 || v > 1000000)
      throw usage_error("--rows wants positive integers separated by commas, got '" + s + "'");
    out.push_back(v);
  }
  if (out.empty()) throw usage_error("--rows wants positive integers separated by commas, got '" + s + "'");
  return out;
}

// --type: a weight type of the kernel table.
GgmlType weight_type_flag(const std::string& name) {
  if (const jit::WeightTypeTraits* w = jit::weight_traits_by_name(name)) return w->type;
  throw usage_error("--type must be one of " + jit::jit_type_list() + ", got '" + name + "'");
}

int bench_gemm(const std::vector<std::string>& args) {
  cxxopts::Options opts("dllm bench gemm", "Times the JIT GEMM on random repacked weights.");
  opts.add_options()("type", "weight type: Q4_K, Q5_K, Q6_K, Q8_0 or Q5_0", cxxopts::value<std::string>())(
      "n-out", "weight rows (outputs)", cxxopts::value<int64_t>())("k-in", "row length (inputs)", cxxopts::value<int64_t>())(
      "rows", "activation rows; a comma-separated list runs each", cxxopts::value<std::string>())(
      "threads", "worker threads (default: all logical CPUs)", cxxopts::value<int>())(
      "isa", "kernel family (default: the best this CPU has, capped by DLLM_ISA)", cxxopts::value<std::string>())(
      "warm", "reuse one weight copy (cache-warm) instead of cycling through copies larger than the cache")(
      "min-seconds", "time each shape for at least this long (default 0.5)", cxxopts::value<double>())(
      "no-peak", "skip the peak and bandwidth measurement")(
      "json", "print one JSON object")("h,help", "this help");
  const auto res = parse(opts, args, "bench gemm");
  if (res.count("help")) {
    std::cout << "usage: dllm " << kGemmSynopsis << "\n\n" << gemm_help();
    return 0;
  }
  const std::pair<const char*, const char*> required[] = {{"type", "type"}, {"n-out", "n"}, {"k-in", "k"}, {"rows", "rows"}};
  for (const auto& [key, shown] : required)
    if (!res.count(key)) throw usage_error(std::string("dllm bench gemm needs --") + shown, "see: dllm bench gemm --help");
  const std::string tname = res["type"].as<std::string>();
  const GgmlType type = weight_type_flag(tname);
  const int64_t n = res["n-out"].as<int64_t>(), k = res["k-in"].as<int64_t>();
  const int block = jit::require_weight_traits(type, "--type").block;
  if (n < 1) throw usage_error("--n must be positive");
  if (k < block || k % block) throw usage_error("--k must be a positive multiple of " + std::to_string(block) + " for " + tname);
  const std::vector<int64_t> rows = parse_rows(res["rows"].as<std::string>());
  const double min_s = res.count("min-seconds") ? res["min-seconds"].as<double>() : 0.5;
  if (!(min_s >= 0 && min_s <= 600)) throw usage_error("--min-seconds must be between 0 and 600");
  const jit::Isa isa = isa_from_flag(res.count("isa") ? res["isa"].as<std::string>() : "", "bench gemm");
  const bool json = res.count("json") > 0;

  ThreadPool pool(threads_from(res));
  const jit::Isa peak_isa = isa == jit::Isa::Portable ? jit::cpu_features().best() : isa;
  jit::PeakResult peak;
  const bool with_peak = peak_isa != jit::Isa::Portable && !res.count("no-peak");
  if (with_peak) peak = jit::measure_peak(peak_isa, pool);
  nlohmann::json out = {{"peak", with_peak ? peak_json(peak) : nlohmann::json()}, {"results", nlohmann::json::array()}};
  if (!json && with_peak) std::cout << peak_text(peak);
  for (int64_t m : rows) {
    const jit::GemmBenchResult r = jit::bench_gemm(type, n, k, m, isa, pool, !res.count("warm"), min_s);
    const double fpeak = peak.int8_gops > 0 ? r.gops / peak.int8_gops : 0;
    const double fbw = peak.read_gbs > 0 ? r.weight_gbs / peak.read_gbs : 0;
    if (json) {
      out["results"].push_back({{"type", tname},          {"n", n},
                                {"k", k},                 {"rows", m},
                                {"isa", jit::isa_name(isa)}, {"threads", r.threads},
                                {"kernel", r.kernel},     {"reps", r.reps},
                                {"median_s", r.median_s}, {"min_s", r.min_s},
                                {"gops", r.gops},         {"fraction_of_int8_peak", with_peak ? nlohmann::json(fpeak) : nlohmann::json()},
                                {"weight_gbs", r.weight_gbs},
                                {"fraction_of_read_bandwidth", with_peak ? nlohmann::json(fbw) : nlohmann::json()},
                                {"packed_bytes", r.packed_bytes}, {"gguf_bytes", r.gguf_bytes},
                                {"weight_copies", r.copies}, {"quantize_s", r.quant_s},
                                {"repack_s", r.repack_s}, {"cpu_share", r.cpu_share},
                                {"gops_per_cpu_second", r.gops_per_cpu_second},
                                {"weight_gb_per_cpu_second", r.weight_gb_per_cpu_second},
                                {"fraction_of_int8_peak_per_cpu_second",
                                 with_peak ? nlohmann::json(r.gops_per_cpu_second / peak.int8_gops_per_cpu_second)
                                           : nlohmann::json()}});
    } else {
      std::cout << tname << " n=" << n << " k=" << k << " rows=" << m << " (" << (r.kernel.empty() ? "portable" : r.kernel)
                << ", " << r.threads << " threads): " << fmt(r.median_s * 1e3, 3) << " ms median of " << r.reps
                << " (min " << fmt(r.min_s * 1e3, 3) << "), " << fmt(r.gops, 1) << " GOPS"
                << (with_peak ? " = " + fmt(100 * fpeak, 1) + "% of int8 peak" : "") << ", weights "
                << fmt(r.weight_gbs, 2) << " GB/s" << (with_peak ? " = " + fmt(100 * fbw, 1) + "% of read bandwidth" : "")
                << "; quantise " << fmt(r.quant_s * 1e3, 3) << " ms, repack "
                << fmt(r.repack_s * 1e3, 1) << " ms" << (r.copies > 1 ? ", " + std::to_string(r.copies) + " weight copies" : "")
                << (r.cpu_share < 0.9 ? ", got " + fmt(100 * r.cpu_share, 0) + "% of the threads' time" : "")
                << "; " << fmt(r.gops_per_cpu_second, 1) << " GOPS per CPU-second"
                << (with_peak ? " = " + fmt(100 * r.gops_per_cpu_second / peak.int8_gops_per_cpu_second, 1) + "% of the peak's" : "")
                << "\n";
    }
  }
  if (json) std::cout << out.dump(1) << "\n";
  return 0;
}

}  // namespace

std::string bench_usage() {
  return std::string("usage: dllm ") + kPeakSynopsis + "\n       dllm " + kGemmSynopsis + "\n       dllm " +
         kKernelSynopsis +
         "\n\n  peak   the int8 multiply-accumulate peak (JIT'd vpdpbusd chains on every thread) and the\n"
         "         streaming read bandwidth: the ceilings GEMM throughput is measured against\n"
         "  gemm   the JIT GEMM on random repacked weights of one shape: median time, GOPS, and the\n"
         "         fractions of the measured peak and bandwidth\n"
         "  kernel   one kernel alone on one thread, timed by its own CPU time (robust on a busy machine),\n"
         "         over --rows rows (default 128) in full tiles: the kernel's share of the int8 peak;\n"
         "         --resident: one tile over 32 KB of weights, called repeatedly (operands stay in\n"
         "         L1/L2), the kernel's ceiling without memory traffic (--rows is then ignored)\n\n"
         "bench peak:\n"
         "  --threads N      worker threads (default: all logical CPUs)\n"
         "  --isa F          kernel family (default: the best this CPU has, capped by DLLM_ISA)\n"
         "  --json           print one JSON object\n\n"
         "bench gemm:\n" +
         gemm_help();
}

std::string isa_list(bool generated_only) {
  std::vector<const char*> names;
  for (jit::Isa isa : jit::kAllIsas)
    if (!generated_only || isa != jit::Isa::Portable) names.push_back(jit::isa_name(isa));
  std::string list;
  for (size_t i = 0; i < names.size(); ++i)
    list += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + std::string(names[i]);
  return list;
}

jit::Isa isa_from_flag(const std::string& flag, const char* command, bool any_cpu, bool generated_only) {
  const std::string see = std::string("see: dllm ") + command + " --help";
  if (flag.empty()) {
    const jit::Isa isa = jit::default_isa();
    if (generated_only && isa == jit::Isa::Portable)
      throw usage_error("the portable family (DLLM_ISA) has no generated kernels; use --isa " + isa_list(true), see);
    return isa;
  }
  const auto isa = jit::parse_isa(flag);
  if (!isa || (generated_only && *isa == jit::Isa::Portable))
    throw usage_error("--isa must be " + isa_list(generated_only) + ", got '" + flag + "'" +
                          (isa ? " (the portable family has no generated kernels)" : ""),
                      see);
  if (!any_cpu && !jit::cpu_features().supports(*isa))
    throw Error(std::string("--isa ") + flag + ": this CPU lacks " + jit::isa_name(*isa) + "; it supports up to " +
                jit::isa_name(jit::cpu_features().best()));
  return *isa;
}

static int bench_kernel(const std::vector<std::string>& args) {
  cxxopts::Options opts("dllm bench kernel", "Times one GEMM kernel alone on one thread (CPU time).");
  opts.add_options()("type", "", cxxopts::value<std::string>())("n-out", "", cxxopts::value<int64_t>())(
      "k-in", "", cxxopts::value<int64_t>())("rows", "", cxxopts::value<std::string>())(
      "isa", "", cxxopts::value<std::string>())("resident", "")("json", "")("h,help", "");
  const auto res = parse(opts, args, "bench kernel");
  if (res.count("help")) {
    std::cout << bench_usage();
    return 0;
  }
  const std::pair<const char*, const char*> required[] = {{"type", "type"}, {"n-out", "n"}, {"k-in", "k"}};
  for (const auto& [key, shown] : required)
    if (!res.count(key)) throw usage_error(std::string("dllm bench kernel needs --") + shown, "see: dllm bench --help");
  const std::string tname = res["type"].as<std::string>();
  const GgmlType type = weight_type_flag(tname);
  const int64_t n = res["n-out"].as<int64_t>(), k = res["k-in"].as<int64_t>();
  const int block = jit::require_weight_traits(type, "--type").block;
  if (n < 1) throw usage_error("--n must be positive");
  if (k < block || k % block) throw usage_error("--k must be a positive multiple of " + std::to_string(block) + " for " + tname);
  const std::vector<int64_t> rows = res.count("rows") ? parse_rows(res["rows"].as<std::string>()) : std::vector<int64_t>{128};
  const jit::Isa isa = isa_from_flag(res.count("isa") ? res["isa"].as<std::string>() : "", "bench kernel");
  if (isa == jit::Isa::Portable) throw usage_error("bench kernel needs a JIT kernel family, not portable");
  nlohmann::json out = nlohmann::json::array();
  for (int64_t m : rows) {
    const jit::KernelBenchResult r = jit::bench_kernel(type, n, k, m, isa, res.count("resident") > 0);
    const double f = r.gops_per_cpu_second / r.peak_gops_per_cpu_second;
    if (res.count("json")) {
      out.push_back({{"type", tname}, {"n", n}, {"k", k}, {"rows", m}, {"rows_timed", r.rows}, {"isa", jit::isa_name(isa)},
                     {"kernel", r.kernel}, {"resident", r.resident}, {"panels", r.panels},
                     {"gops_per_cpu_second", r.gops_per_cpu_second},
                     {"peak_gops_per_cpu_second", r.peak_gops_per_cpu_second}, {"fraction_of_peak", f}});
    } else {
      std::cout << r.kernel << " (" << r.rows << " rows, "
                << (r.resident ? std::to_string(r.panels) + (r.panels == 1 ? " panel" : " panels") + " resident in cache, " : "")
                << "one thread): " << fmt(r.gops_per_cpu_second, 1)
                << " GOPS per CPU-second = " << fmt(100 * f, 1) << "% of the int8 peak loop ("
                << fmt(r.peak_gops_per_cpu_second, 1) << ")\n";
    }
  }
  if (res.count("json")) std::cout << out.dump(1) << "\n";
  return 0;
}

int cmd_bench(const std::vector<std::string>& args) {
  if (args.empty()) throw usage_error("dllm bench needs peak, gemm or kernel", "see: dllm bench --help");
  if (args[0] == "-h" || args[0] == "--help") {
    std::cout << bench_usage();
    return 0;
  }
  const std::vector<std::string> rest(args.begin() + 1, args.end());
  if (args[0] == "peak") return bench_peak(rest);
  if (args[0] == "gemm") return bench_gemm(rest);
  if (args[0] == "kernel") return bench_kernel(rest);
  throw usage_error("unknown bench '" + args[0] + "': use peak, gemm or kernel", "see: dllm bench --help");
}

}  // namespace dllm::cli
