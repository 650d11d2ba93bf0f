// Tokenizer benchmark: builds a deterministic mixed-script text from the tokenizer case files, then
// times dllm's tokenizer on it (first pass with an empty piece cache, then warm passes) and reports
// MB/s. Optionally writes the ids, one per line, so run.sh can compare them with llama-tokenize's.
//
//   bench_tokenize make-text OUT.txt CASES.jsonl... [--bytes N] [--seed S]
//   bench_tokenize run VOCAB.gguf TEXT.txt [--repeat N] [--ids-out FILE] [--no-parse-special]
#include <algorithm>
#include <chrono>
#include <ctime>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "common/error.h"
#include "model/gguf.h"
#include "model/pretokenizer.h"
#include "model/tokenizer.h"

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// CPU time of this thread: on a shared machine it moves much less than wall time.
double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

std::string read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw dllm::Error("cannot read " + path);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

int usage() {
  std::cerr << "usage: bench_tokenize make-text OUT.txt CASES.jsonl... [--bytes N] [--seed S]\n"
               "       bench_tokenize run VOCAB.gguf TEXT.txt [--repeat N] [--ids-out FILE] [--no-parse-special]\n";
  return 2;
}

// The case texts, shuffled with a fixed seed and joined by newlines, repeated until `bytes` long,
// then cut at a character boundary.
int make_text(const std::vector<std::string>& args) {
  std::string out_path;
  std::vector<std::string> inputs;
  size_t bytes = 1 << 20;
  uint32_t seed = 1;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--bytes" && i + 1 < args.size()) bytes = std::stoul(args[++i]);
    else if (args[i] == "--seed" && i + 1 < args.size()) seed = static_cast<uint32_t>(std::stoul(args[++i]));
    else if (out_path.empty()) out_path = args[i];
    else inputs.push_back(args[i]);
  }
  if (out_path.empty() || inputs.empty()) return usage();
  std::vector<std::string> texts;
  for (const auto& path : inputs) {
    std::istringstream in(read_all(path));
    for (std::string line; std::getline(in, line);)
      if (!line.empty()) texts.push_back(nlohmann::json::parse(line)["text"].get<std::string>());
  }
  std::mt19937 rng(seed);
  std::string text;
  while (text.size() < bytes) {
    std::shuffle(texts.begin(), texts.end(), rng);
    for (const auto& t : texts) text += t + "\n";
  }
  text.resize(dllm::model::utf8_complete_prefix(std::string_view(text).substr(0, bytes)));
  std::ofstream(out_path, std::ios::binary) << text;
  std::cout << "wrote " << out_path << ": " << text.size() << " bytes from " << texts.size() << " texts\n";
  return 0;
}

int run(const std::vector<std::string>& args) {
  if (args.size() < 2) return usage();
  int repeat = 5;
  bool parse_special = true;
  std::string ids_out;
  for (size_t i = 2; i < args.size(); ++i) {
    if (args[i] == "--repeat" && i + 1 < args.size()) repeat = std::max(1, std::atoi(args[++i].c_str()));
    else if (args[i] == "--ids-out" && i + 1 < args.size()) ids_out = args[++i];
    else if (args[i] == "--no-parse-special") parse_special = false;
    else return usage();
  }
  const std::string text = read_all(args[1]);
  const double mb = double(text.size()) / (1024.0 * 1024.0);

  auto t0 = Clock::now();
  const auto file = dllm::gguf::File::open(args[0]);
  const double t_open = seconds_since(t0);
  t0 = Clock::now();
  const dllm::model::Tokenizer tok(*file);
  const double t_load = seconds_since(t0);

  t0 = Clock::now();
  double c0 = thread_cpu_seconds();
  const std::vector<int32_t> ids = tok.encode(text, parse_special, false);
  const double t_cold = seconds_since(t0), cpu_cold = thread_cpu_seconds() - c0;
  std::vector<double> warm, warm_cpu;
  for (int r = 0; r < repeat; ++r) {
    t0 = Clock::now();
    c0 = thread_cpu_seconds();
    const auto again = tok.encode(text, parse_special, false);
    warm.push_back(seconds_since(t0));
    warm_cpu.push_back(thread_cpu_seconds() - c0);
    if (again != ids) throw dllm::Error("repeated tokenization gave different ids");
  }
  std::sort(warm.begin(), warm.end());
  std::sort(warm_cpu.begin(), warm_cpu.end());
  const double t_warm = warm[warm.size() / 2], cpu_warm = warm_cpu[warm_cpu.size() / 2];

  t0 = Clock::now();
  const std::string back = tok.detokenize(ids, {false, true, false});
  const double t_detok = seconds_since(t0);
  if (back != text && dllm::model::is_valid_utf8(text)) throw dllm::Error("round trip failed");

  std::printf("vocab %s (pre %s, %d tokens)\n", args[0].c_str(), tok.pre().c_str(), tok.n_vocab());
  std::printf("text  %s: %zu bytes, %zu tokens (%.2f bytes/token)\n", args[1].c_str(), text.size(), ids.size(),
              double(text.size()) / double(std::max<size_t>(1, ids.size())));
  std::printf("load  gguf %.0f ms + tokenizer %.0f ms\n", t_open * 1e3, t_load * 1e3);
  std::printf("encode cold  %.3f s  %.2f MB/s wall, %.2f MB/s CPU time\n", t_cold, mb / t_cold, mb / cpu_cold);
  std::printf("encode warm  %.3f s  %.2f MB/s wall, %.2f MB/s CPU time (median of %d)\n", t_warm, mb / t_warm,
              mb / cpu_warm, repeat);
  std::printf("decode       %.3f s  %.2f MB/s\n", t_detok, mb / t_detok);
  std::printf("RESULT dllm_cold_mbps=%.3f dllm_warm_mbps=%.3f dllm_warm_cpu_mbps=%.3f tokens=%zu\n", mb / t_cold,
              mb / t_warm, mb / cpu_warm, ids.size());

  if (!ids_out.empty()) {
    std::ofstream out(ids_out);
    for (int32_t id : ids) out << id << "\n";
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return usage();
  const std::string cmd = argv[1];
  const std::vector<std::string> args(argv + 2, argv + argc);
  try {
    if (cmd == "make-text") return make_text(args);
    if (cmd == "run") return run(args);
  } catch (const std::exception& e) {
    std::cerr << "ERROR: " << e.what() << "\n";
    return 1;
  }
  return usage();
}
