// One file's download: under a lock, into FILE.part (resumed with a Range request), hashed as it arrives,
// checked against the size and sha256 the hub publishes, and renamed to FILE only then. Interrupted transfers
// are retried from where they stopped; every other failure leaves the cache as it was.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "hub/internal.h"
#include "common/printable.h"
#include "hub/sha256.h"
#include "common/interrupt.h"

namespace dllm::hub {

namespace {

std::string base_name(const std::string& path) { return path.substr(path.rfind('/') + 1); }
std::string dir_name(const std::string& path) {
  size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

bool is_gguf_name(const std::string& path) {
  if (path.size() < 5) return false;
  std::string ext = path.substr(path.size() - 5);
  for (char& c : ext) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return ext == ".gguf";
}

uint64_t file_size(int fd) {
  struct stat st;
  return ::fstat(fd, &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
}

// Truncates the partial file back to `keep` bytes, removing it when that is 0: the cache as it was.
void restore_part(const std::string& part, int fd, uint64_t keep) {
  if (keep == 0) {
    ::unlink(part.c_str());
  } else if (::ftruncate(fd, static_cast<off_t>(keep)) != 0) {
    // Best effort: the next pull re-hashes the part and the sha256 check catches anything wrong.
  }
}

void write_small_file(const std::string& path, const std::string& text) {
  std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return;  // the sidecar is only a shortcut: without it the file is hashed again when needed
  bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  ok = ::close(fd) == 0 && ok;
  if (!ok || ::rename(tmp.c_str(), path.c_str()) != 0) ::unlink(tmp.c_str());
}

std::string read_small_file(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "";
  char buf[128];
  ssize_t n = ::read(fd, buf, sizeof buf);
  ::close(fd);
  std::string s = n > 0 ? std::string(buf, static_cast<size_t>(n)) : "";
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

enum class Failure { kNone, kHttp, kHtml, kNotGguf, kWrite, kRangeMismatch, kTooLong };

struct Job {
  const Options& opts;
  std::string url, dest, part, name;  // name: the file name escaped for messages
  std::string part_shown;             // part, escaped for messages (common/printable.h)
  uint64_t size;  // 0: unknown
  std::string sha256;
  uint64_t initial_part = 0;  // the part's size before this pull: what a failure restores
};

// One GET of the missing bytes into the part file. Returns the sha256 of the whole part when it is complete.
// Throws NetworkError for failures worth retrying (the part keeps what arrived) and Error for the others.
std::string fetch_once(Job& job, bool first) {
  int fd = ::open(job.part.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) throw Error("cannot create " + job.part_shown + ": " + std::strerror(errno));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  const bool gguf = is_gguf_name(job.dest);
  uint64_t off = file_size(fd);
  char magic[4];
  if ((job.size && off > job.size) ||
      (off > 0 && gguf && (::pread(fd, magic, 4, 0) != 4 || std::memcmp(magic, "GGUF", 4) != 0))) {
    if (::ftruncate(fd, 0) != 0) throw Error("cannot truncate " + job.part_shown + ": " + std::strerror(errno));
    off = 0;
  }
  if (first) job.initial_part = off;

  // What is already there is hashed first, so the final digest covers the whole file.
  Sha256 hash;
  if (off > 0) {
    if (first) job.opts.say("resuming " + job.name + " at " + format_bytes(off) + " of " + format_bytes(job.size));
    std::vector<char> buf(1 << 20);
    for (uint64_t at = 0; at < off;) {
      throw_if_interrupted("; " + job.part_shown + " is kept and the next pull resumes from there");
      ssize_t n = ::pread(fd, buf.data(), std::min<uint64_t>(buf.size(), off - at), static_cast<off_t>(at));
      if (n <= 0) throw Error("cannot read " + job.part_shown + ": " + std::strerror(n < 0 ? errno : EIO));
      hash.update(buf.data(), static_cast<size_t>(n));
      at += static_cast<uint64_t>(n);
    }
  }
  if (job.size && off == job.size) return hash.hex_digest();

  // Enough room for the rest? Checked up front so a full disk fails fast and clean.
  struct statvfs vfs;
  if (job.size && ::statvfs(dir_name(job.dest).c_str(), &vfs) == 0) {
    uint64_t avail = static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize;
    if (avail < job.size - off) {
      restore_part(job.part, fd, off);
      throw Error("not enough free disk space for " + job.name + " in " + dir_name(job.dest) + ": it needs " +
                  format_bytes(job.size - off) + " more, " + format_bytes(avail) + " are free");
    }
  }

  Failure fail = Failure::kNone;
  long status = 0;
  Headers headers;
  std::string err_body, first_bytes;
  int write_errno = 0;
  uint64_t pos = off;
  uint64_t start_pos = off;  // what the part holds before this transfer writes (0 after a restart)
  Progress progress(job.opts.progress, job.name, job.size, off);
  StreamHandlers h;
  h.on_start = [&](long st, const Headers& hd) {
    status = st;
    headers = hd;
    if (st == 206) {
      auto it = hd.find("content-range");  // bytes FROM-TO/TOTAL
      if (it == hd.end() || it->second.rfind("bytes " + std::to_string(off) + "-", 0) != 0) {
        fail = Failure::kRangeMismatch;
        return false;
      }
    } else if (st == 200) {
      if (pos > 0) {  // the server ignored the Range request: start over
        if (::ftruncate(fd, 0) != 0) {
          write_errno = errno;
          fail = Failure::kWrite;
          return false;
        }
        hash.reset();
        pos = start_pos = 0;
      }
    } else {
      fail = Failure::kHttp;
      return true;  // keep the error page's text for the message
    }
    if (looks_like_html(hd, "")) {
      fail = Failure::kHtml;
      return false;
    }
    return true;
  };
  h.on_data = [&](const char* data, size_t n) {
    if (fail == Failure::kHttp) {
      err_body.append(data, std::min<size_t>(n, 4096));
      return err_body.size() < 4096;
    }
    if (pos < 256) first_bytes.append(data, std::min<size_t>(n, 256));
    if (gguf && pos < 4) {
      for (uint64_t i = pos; i < 4 && i < pos + n; ++i) {
        if (data[i - pos] != "GGUF"[i]) {
          fail = looks_like_html({}, first_bytes) ? Failure::kHtml : Failure::kNotGguf;
          return false;
        }
      }
    }
    if (job.size && pos + n > job.size) {
      fail = Failure::kTooLong;
      return false;
    }
    for (size_t done = 0; done < n;) {
      ssize_t w = ::pwrite(fd, data + done, n - done, static_cast<off_t>(pos + done));
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) {
        write_errno = w < 0 ? errno : EIO;
        fail = Failure::kWrite;
        return false;
      }
      done += static_cast<size_t>(w);
    }
    hash.update(data, n);
    pos += n;
    progress.update(pos);
    return true;
  };

  try {
    http_stream(job.opts, job.url, off, h);
  } catch (const NetworkError&) {
    progress.finish();
    if (pos == 0) ::unlink(job.part.c_str());
    throw;
  } catch (const Interrupted& e) {
    progress.finish();  // the terminal's line is clean again before the message
    if (pos == 0) {
      ::unlink(job.part.c_str());
      throw;
    }
    ::fsync(fd);
    throw Interrupted(std::string(e.what()) + ": " + format_bytes(pos) + " of " + job.name + " are kept in " +
                      job.part_shown + " and the next pull resumes from there");
  } catch (const Error&) {  // permanent (a file: redirect, a redirect loop): nothing new is kept
    progress.finish();
    if (pos == 0) ::unlink(job.part.c_str());
    throw;
  }
  progress.finish();

  const std::string what = job.name + " (" + job.url + ")";
  switch (fail) {
    case Failure::kNone:
      break;
    case Failure::kHttp:
      restore_part(job.part, fd, pos);
      if (status == 416) {  // the server's file no longer fits what we have: start over
        if (::ftruncate(fd, 0) != 0) throw Error("cannot truncate " + job.part_shown + ": " + std::strerror(errno));
        throw NetworkError("the server cannot resume " + job.name + " (416)", false);
      }
      if (status >= 500 || status == 429)
        throw NetworkError(http_status_message(status, headers, err_body, what, job.opts), false);
      throw HttpError(http_status_message(status, headers, err_body, what, job.opts), status);
    case Failure::kHtml:
      restore_part(job.part, fd, start_pos);
      throw Error("the server sent an HTML page instead of " + what +
                  ": a login or error page, or a wrong HF_ENDPOINT; nothing was saved");
    case Failure::kNotGguf:
      restore_part(job.part, fd, start_pos);
      throw Error("the server sent something that is not a GGUF file for " + what + " (bad magic); nothing was saved");
    case Failure::kWrite:
      restore_part(job.part, fd, job.initial_part);
      throw Error("cannot write " + job.part_shown + ": " + std::strerror(write_errno) +
                  (write_errno == ENOSPC || write_errno == EDQUOT || write_errno == EFBIG ? " (the disk is full)" : "") +
                  "; the cache is as it was");
    case Failure::kRangeMismatch:
      if (::ftruncate(fd, 0) != 0) throw Error("cannot truncate " + job.part_shown + ": " + std::strerror(errno));
      throw NetworkError("the server resumed " + job.name + " at the wrong offset; starting again", false);
    case Failure::kTooLong:
      restore_part(job.part, fd, 0);
      throw Error("the server sent more than the " + format_bytes(job.size) + " the hub lists for " + what +
                  "; nothing was saved");
  }
  if (job.size && pos < job.size)
    throw NetworkError("the transfer of " + job.name + " ended at " + format_bytes(pos) + " of " +
                       format_bytes(job.size), false);
  if (::fsync(fd) != 0) {
    int err = errno;
    restore_part(job.part, fd, job.initial_part);
    throw Error("cannot write " + job.part_shown + ": " + std::strerror(err) + "; the cache is as it was");
  }
  return hash.hex_digest();
}

}  // namespace

bool cached_file_matches(const std::string& path, uint64_t size, const std::string& sha256, bool may_hash) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return false;
  if (size && static_cast<uint64_t>(st.st_size) != size) return false;
  if (sha256.empty()) return true;
  if (read_small_file(path + ".sha256") == sha256) return true;
  if (!may_hash) return false;
  // No record of the file's digest (or an old one): hash it once and remember.
  std::string got = sha256_file(path);
  if (got != sha256) return false;
  write_small_file(path + ".sha256", got + "\n");
  return true;
}

void download_file(const Options& opts, const std::string& url, const std::string& dest, uint64_t size,
                   const std::string& sha256) {
  const std::string part = dest + ".part";
  Job job{opts, url, dest, part, shown(base_name(dest)), escape_text(part, part.size()), size, sha256};
  // Nothing to check the bytes against (and no bound on how many may come): refused before anything is created.
  if (size == 0 && sha256.empty())
    throw Error("the hub lists neither a size nor a sha256 for " + job.name + " (" + url +
                "): it cannot be verified, so it is not downloaded");
  make_dirs(dir_name(dest));
  FileLock lock(dest + ".lock", [&](long pid) {
    opts.say("another dllm process" + (pid > 0 ? " (pid " + std::to_string(pid) + ")" : std::string()) +
             " is downloading " + job.name + "; waiting for it to finish");
  });
  // Another process may have finished it while we waited (it records the digest before unlocking).
  if (cached_file_matches(dest, size, sha256, /*may_hash=*/false)) {
    opts.say(job.name + " was downloaded by another dllm process meanwhile");
    return;
  }
  opts.say("downloading " + job.name + (size ? " (" + format_bytes(size) + ")" : std::string()) + " from " + url);
  const double t0 = monotonic_seconds();
  std::string got;
  int delay_ms = opts.retry_delay_ms;
  for (int attempt = 0;; ++attempt) {
    try {
      got = fetch_once(job, attempt == 0);
      break;
    } catch (const NetworkError& e) {
      bool kept = file_exists(job.part);
      if (attempt >= opts.retries) {
        throw Error(std::string(e.what()) +
                    (kept ? "; what arrived is kept in " + job.part_shown + " and the next pull resumes from there"
                          : std::string()));
      }
      opts.say(std::string(e.what()) + "; trying again in " + format_duration(delay_ms / 1000.0) + " (" +
               std::to_string(attempt + 1) + " of " + std::to_string(opts.retries) + ")");
      for (int waited = 0; waited < delay_ms && !interrupted(); waited += 20)
        std::this_thread::sleep_for(std::chrono::milliseconds(std::min(20, delay_ms - waited)));
      throw_if_interrupted(kept ? "; " + job.part_shown + " is kept and the next pull resumes from there" : "");
      delay_ms *= 2;
    }
  }
  if (!sha256.empty() && got != sha256) {
    ::unlink(job.part.c_str());
    throw Error("checksum mismatch for " + job.name + ": the hub publishes sha256 " + sha256 +
                " but the download has " + got + "; it was deleted and the cache is as it was (if a second pull "
                "fails the same way, the hub's copy is damaged)");
  }
  if (sha256.empty())
    opts.say("warning: the hub publishes no sha256 for " + job.name + ": only its size (" + format_bytes(size) +
             ") was checked");
  if (::rename(job.part.c_str(), dest.c_str()) != 0) {
    int err = errno;
    throw Error("cannot rename " + job.part_shown + " to " + escape_text(dest, dest.size()) + ": " + std::strerror(err));
  }
  // The sidecar vouches for a verified digest only: an unverified file gets none.
  if (!sha256.empty()) write_small_file(dest + ".sha256", got + "\n");
  if (int dfd = ::open(dir_name(dest).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
  double secs = monotonic_seconds() - t0;
  uint64_t bytes = size ? size - job.initial_part : 0;
  opts.say("downloaded " + job.name + (bytes ? " (" + format_bytes(bytes) + " in " + format_duration(secs) + ", " +
                                                   format_bytes(static_cast<uint64_t>(bytes / std::max(secs, 1e-3))) +
                                                   "/s)"
                                             : std::string()) +
           (sha256.empty() ? "" : ", sha256 verified"));
}

}  // namespace dllm::hub
