// ProgressBar: bytes, percentage, rate and ETA, redrawn in place with a carriage return.
#include "cli/progress.h"

#include <unistd.h>

#include <cstdio>

namespace dllm::cli {

std::string human_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) b /= 1024, ++u;
  char buf[32];
  std::snprintf(buf, sizeof buf, u ? "%.1f %s" : "%.0f %s", b, units[u]);
  return buf;
}

ProgressBar::ProgressBar(std::string label)
    : label_(std::move(label)), enabled_(isatty(STDERR_FILENO) != 0),
      start_(std::chrono::steady_clock::now()), last_(start_ - std::chrono::seconds(1)) {}

ProgressBar::~ProgressBar() { finish(); }

void ProgressBar::update(uint64_t done, uint64_t total) {
  if (!enabled_ || finished_) return;
  auto now = std::chrono::steady_clock::now();
  if (done < total && now - last_ < std::chrono::milliseconds(100)) return;
  last_ = now;
  const double secs = std::chrono::duration<double>(now - start_).count();
  const double rate = secs > 0 ? done / secs : 0;
  const double frac = total ? static_cast<double>(done) / total : 1.0;
  const int width = 30, filled = static_cast<int>(frac * width);
  std::string bar(filled, '#');
  bar.resize(width, '.');
  char eta[32] = "";
  if (rate > 0 && done < total) std::snprintf(eta, sizeof eta, " ETA %.0fs", (total - done) / rate);
  std::fprintf(stderr, "\r%s [%s] %5.1f%% %s / %s  %s/s%s   ", label_.c_str(), bar.c_str(), frac * 100,
               human_bytes(done).c_str(), human_bytes(total).c_str(), human_bytes(rate).c_str(), eta);
  std::fflush(stderr);
}

void ProgressBar::finish() {
  if (enabled_ && !finished_) std::fputc('\n', stderr);
  finished_ = true;
}

}  // namespace dllm::cli
