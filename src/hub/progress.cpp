// A download's progress bar on stderr (bytes so far and in all, rate, time left), redrawn in place on a
// terminal; plus the size and duration formats the hub's messages use.
#include <cmath>
#include <cstdio>
#include <ctime>

#include "hub/internal.h"

namespace dllm::hub {

double monotonic_seconds() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

std::string format_bytes(uint64_t n) {
  static const char* kUnits[] = {"B", "kB", "MB", "GB", "TB"};
  double v = static_cast<double>(n);
  int u = 0;
  while (v >= 1000 && u < 4) v /= 1000, ++u;
  char buf[32];
  if (u == 0) {
    std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(n));
  } else {
    std::snprintf(buf, sizeof buf, v < 10 ? "%.2f %s" : v < 100 ? "%.1f %s" : "%.0f %s", v, kUnits[u]);
  }
  return buf;
}

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  long s = std::lround(seconds);
  char buf[32];
  if (s >= 3600) {
    std::snprintf(buf, sizeof buf, "%ldh%02ldm", s / 3600, (s / 60) % 60);
  } else if (s >= 60) {
    std::snprintf(buf, sizeof buf, "%ldm%02lds", s / 60, s % 60);
  } else {
    std::snprintf(buf, sizeof buf, "%lds", s);
  }
  return buf;
}

Progress::Progress(bool enabled, std::string name, uint64_t total, uint64_t start)
    : enabled_(enabled), name_(std::move(name)), total_(total), done_(start) {
  last_t_ = monotonic_seconds();
  last_done_ = start;
  if (name_.size() > 32) name_ = name_.substr(0, 29) + "...";
}

void Progress::update(uint64_t done) {
  done_ = done;
  if (!enabled_) return;
  double now = monotonic_seconds();
  if (last_draw_ >= 0 && now - last_draw_ < 0.1 && done < total_) return;
  draw(now);
}

void Progress::draw(double now) {
  // The rate is a moving average over roughly the last few seconds, so the ETA follows the link's speed.
  double dt = now - last_t_;
  if (dt > 0.05) {
    double inst = static_cast<double>(done_ - last_done_) / dt;
    rate_ = rate_ == 0 ? inst : 0.7 * rate_ + 0.3 * inst;
    last_t_ = now;
    last_done_ = done_;
  }
  last_draw_ = now;
  double frac = total_ ? static_cast<double>(done_) / static_cast<double>(total_) : 0;
  constexpr int kWidth = 24;
  int fill = static_cast<int>(frac * kWidth);
  std::string bar(static_cast<size_t>(fill), '#');
  bar.resize(kWidth, '.');
  std::string eta = rate_ > 0 && total_ >= done_ ? format_duration(static_cast<double>(total_ - done_) / rate_) : "?";
  std::fprintf(stderr, "\r%s [%s] %3d%% %s / %s  %s/s  ETA %s\x1b[K", name_.c_str(), bar.c_str(),
               static_cast<int>(frac * 100), format_bytes(done_).c_str(), format_bytes(total_).c_str(),
               format_bytes(static_cast<uint64_t>(rate_)).c_str(), eta.c_str());
  std::fflush(stderr);
  drawn_ = true;
}

void Progress::finish() {
  if (drawn_) {
    std::fprintf(stderr, "\r\x1b[K");
    std::fflush(stderr);
    drawn_ = false;
  }
}

}  // namespace dllm::hub
