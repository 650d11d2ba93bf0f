// The cache folder and what lives in it: where it is (DLLM_CACHE / XDG / HOME), the options read from the
// environment, finding an id's file among cached ones, and the per-file download lock.
#include <dirent.h>
#include <fcntl.h>
#include <pwd.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>

#include "hub/internal.h"
#include "common/interrupt.h"
#include "common/printable.h"

namespace dllm::hub {

namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

bool env_true(const char* name) {
  std::string v = env(name);
  for (char& c : v) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return v == "1" || v == "true" || v == "yes" || v == "on";
}

// Every *.gguf file under dir (recursively), as paths relative to dir, with their sizes.
void list_gguf(const std::string& dir, const std::string& rel, std::vector<RemoteFile>& out) {
  DIR* d = opendir(dir.c_str());
  if (!d) return;
  while (dirent* e = readdir(d)) {
    std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    std::string full = dir + "/" + name, sub = rel.empty() ? name : rel + "/" + name;
    struct stat st;
    if (::stat(full.c_str(), &st) != 0) continue;
    if (S_ISDIR(st.st_mode)) {
      list_gguf(full, sub, out);
    } else if (S_ISREG(st.st_mode) && name.size() > 5) {
      std::string ext = name.substr(name.size() - 5);
      for (char& c : ext) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      if (ext == ".gguf") out.push_back({sub, static_cast<uint64_t>(st.st_size), ""});
    }
  }
  closedir(d);
}

}  // namespace

void Options::say(const std::string& line) const {
  if (note) {
    note(line);
  } else {
    std::fprintf(stderr, "dllm: %s\n", line.c_str());
  }
}

std::string default_model_id() {
  std::string v = env("DLLM_MODEL");
  return v.empty() ? kDefaultModel : v;
}

std::string cache_dir_from_env() {
  std::string v = env("DLLM_CACHE");
  if (!v.empty()) return v;
  v = env("XDG_CACHE_HOME");
  if (!v.empty() && v[0] == '/') return v + "/dllm";  // the XDG spec ignores relative values
  std::string home = env("HOME");
  if (home.empty()) {
    if (const passwd* pw = getpwuid(getuid()); pw && pw->pw_dir) home = pw->pw_dir;
  }
  if (home.empty()) throw Error("cannot find a cache folder: set DLLM_CACHE (HOME is not set)");
  return home + "/.cache/dllm";
}

Options options_from_env() {
  Options o;
  std::string endpoint = env("HF_ENDPOINT");
  if (!endpoint.empty()) o.endpoint = endpoint;
  while (o.endpoint.size() > 1 && o.endpoint.back() == '/') o.endpoint.pop_back();
  o.token = env("HF_TOKEN");
  o.offline = env_true("HF_HUB_OFFLINE");
  o.cache_dir = cache_dir_from_env();
  o.progress = isatty(STDERR_FILENO) == 1;
  if (std::string v = env("DLLM_STALL_TIMEOUT"); !v.empty()) {
    char* end = nullptr;
    long secs = std::strtol(v.c_str(), &end, 10);
    if (*end != '\0' || secs < 1 || secs > 86400)
      throw Error("DLLM_STALL_TIMEOUT must be a number of seconds from 1 to 86400, not '" + v + "'");
    o.stall_seconds = secs;
  }
  return o;
}

std::string repo_cache_dir(const Options& opts, const std::string& repo) {
  return opts.cache_dir + "/models/" + repo;
}

std::string find_cached(const Options& opts, const ModelId& id) {
  std::vector<RemoteFile> files;
  list_gguf(repo_cache_dir(opts, id.repo), "", files);
  if (files.empty()) return "";
  try {
    return repo_cache_dir(opts, id.repo) + "/" + choose_gguf(files, id).path;
  } catch (const AmbiguousError& e) {
    throw Error(std::string(e.what()) + " (in the cache " + repo_cache_dir(opts, id.repo) + ")");
  } catch (const Error&) {
    return "";  // no cached file matches: the hub may have one
  }
}

bool file_exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

void make_dirs(const std::string& dir) {
  std::string cur;
  size_t pos = 0;
  while (pos != std::string::npos) {
    pos = dir.find('/', pos + 1);
    cur = dir.substr(0, pos);
    if (cur.empty()) continue;
    if (::mkdir(cur.c_str(), 0755) != 0 && errno != EEXIST)
      throw Error("cannot create the folder " + cur + ": " + std::strerror(errno));
  }
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) throw Error("not a folder: " + dir);
}

bool safe_relative_path(const std::string& path) {
  if (path.empty() || path[0] == '/' || path.find('\\') != std::string::npos) return false;
  // A NUL would cut the name where the file system sees it (FILE, FILE.part, FILE.lock, FILE.sha256 of two
  // names would collide); control bytes and invalid UTF-8 have no business in a file name either.
  for (char c : path)
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) return false;
  if (!is_valid_utf8(path)) return false;
  size_t a = 0;
  for (;;) {
    size_t b = path.find('/', a);
    std::string seg = path.substr(a, b == std::string::npos ? std::string::npos : b - a);
    if (seg.empty() || seg == "." || seg == "..") return false;
    if (b == std::string::npos) return true;
    a = b + 1;
  }
}

FileLock::FileLock(const std::string& path, const std::function<void(long)>& on_wait) : path_(path) {
  bool waited = false;
  for (;;) {
    int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) throw Error("cannot create the lock file " + path + ": " + std::strerror(errno));
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      if (errno != EWOULDBLOCK) {
        int err = errno;
        ::close(fd);
        throw Error("cannot lock " + path + ": " + std::strerror(err));
      }
      if (!waited) {
        char buf[32] = {0};
        long pid = 0;
        if (::pread(fd, buf, sizeof buf - 1, 0) > 0) pid = std::strtol(buf, nullptr, 10);
        on_wait(pid);
        waited = true;
      }
      while (::flock(fd, LOCK_EX) != 0) {
        if (errno == EINTR && interrupted()) {
          ::close(fd);
          throw_if_interrupted(" while waiting for " + path);
        }
        if (errno != EINTR) {
          int err = errno;
          ::close(fd);
          throw Error("cannot lock " + path + ": " + std::strerror(err));
        }
      }
    }
    // The previous holder removes the file before it unlocks: if the name now points elsewhere (or nowhere),
    // this lock is on a dead file, so start again.
    struct stat held, named;
    if (::fstat(fd, &held) == 0 && ::stat(path.c_str(), &named) == 0 && held.st_dev == named.st_dev &&
        held.st_ino == named.st_ino) {
      fd_ = fd;
      std::string pid = std::to_string(static_cast<long>(::getpid())) + "\n";
      if (::ftruncate(fd, 0) == 0 && ::pwrite(fd, pid.data(), pid.size(), 0) < 0) {
        // The pid is only for the waiter's message: nothing to do if it cannot be written.
      }
      return;
    }
    ::close(fd);
  }
}

FileLock::~FileLock() {
  if (fd_ >= 0) {
    ::unlink(path_.c_str());
    ::close(fd_);
  }
}

}  // namespace dllm::hub
