// Pieces shared by the hub's source files and not by its users: the libcurl wrapper, the download lock,
// the progress display, and small file-system helpers.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <string>

#include "hub/hub.h"
#include "common/error.h"

namespace dllm::hub {

// choose_gguf's error when a quant matches several files.
class AmbiguousError : public Error {
 public:
  using Error::Error;
};

// ---- HTTP (http.cpp) ----

using Headers = std::map<std::string, std::string>;  // names lower-cased; the final response's only

// A transfer that failed below HTTP (DNS, connection, TLS, a cut connection, a stall).
class NetworkError : public Error {
 public:
  NetworkError(const std::string& msg, bool unreachable) : Error(msg), unreachable_(unreachable) {}
  // The host could not be reached at all (no network, DNS failure, connection refused).
  bool unreachable() const { return unreachable_; }

 private:
  bool unreachable_;
};

// An HTTP failure status (4xx, 5xx) with its explanation.
class HttpError : public Error {
 public:
  HttpError(const std::string& msg, long status) : Error(msg), status_(status) {}
  long status() const { return status_; }

 private:
  long status_;
};

// "host[:port]" of a URL.
std::string host_of(const std::string& url);
// "scheme://host:port" of a URL, lower-cased, with the scheme's default port made explicit ("" when the URL has no
// scheme): two URLs of the same origin may share credentials, no others.
std::string origin_of(const std::string& url);

struct HttpResponse {
  long status = 0;
  Headers headers;
  std::string body;
};

// GET into memory (at most max_body bytes kept). Redirects are followed. Throws NetworkError.
HttpResponse http_get(const Options& opts, const std::string& url, size_t max_body = 64u << 20);

struct StreamHandlers {
  // Called once, with the final response's status and headers, before any body byte; false aborts.
  std::function<bool(long status, const Headers& headers)> on_start;
  // Called with each piece of the body; false aborts the transfer.
  std::function<bool(const char* data, size_t n)> on_data;
};
// GET streamed to handlers, from byte offset `from` (a Range request when from > 0). Returns the final status.
// Throws NetworkError for transport failures, unless a handler aborted (then the handler's state tells why).
long http_stream(const Options& opts, const std::string& url, uint64_t from, StreamHandlers& handlers);

// "401 Unauthorized ..." style explanations of an HTTP failure status; `what` names the repo or file.
std::string http_status_message(long status, const Headers& headers, const std::string& body,
                                const std::string& what, const Options& opts);
// True when a body is an HTML page (by its Content-Type or its first bytes).
bool looks_like_html(const Headers& headers, const std::string& first_bytes);

// ---- the lock (cache.cpp) ----

// An exclusive flock() on a lock file. The holder removes the file when done; a waiter that wakes on a removed
// file retries, so two processes never both hold the lock. Works between processes and between threads.
class FileLock {
 public:
  // on_wait(pid of the holder, 0 if unknown) is called once if another holder makes us wait.
  FileLock(const std::string& path, const std::function<void(long holder_pid)>& on_wait);
  ~FileLock();
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;

 private:
  std::string path_;
  int fd_ = -1;
};

// True when path is a regular file of the given size (0: any) whose sha256 is the given one ("": any). The
// digest recorded beside it at download (path + ".sha256") saves hashing it; without that record the file is
// hashed (and the record written) only when may_hash.
bool cached_file_matches(const std::string& path, uint64_t size, const std::string& sha256, bool may_hash = true);

// mkdir -p; throws dllm::Error naming the folder.
void make_dirs(const std::string& dir);
bool file_exists(const std::string& path);
// A repo-relative path that is safe to join under the cache (no "..", no absolute path, no empty segment).
bool safe_relative_path(const std::string& path);

// ---- progress (progress.cpp) ----

// Shows a download's progress on stderr: a redrawn bar (bytes, rate, ETA) on a terminal, nothing otherwise.
class Progress {
 public:
  Progress(bool enabled, std::string name, uint64_t total, uint64_t start);
  void update(uint64_t done);  // bytes of the file present so far (redraws at most ~10 times a second)
  void finish();               // erases the bar
 private:
  void draw(double now);
  bool enabled_;
  std::string name_;
  uint64_t total_, done_;
  double last_draw_ = -1, last_t_, rate_ = 0;
  uint64_t last_done_;
  bool drawn_ = false;
};
double monotonic_seconds();

}  // namespace dllm::hub
