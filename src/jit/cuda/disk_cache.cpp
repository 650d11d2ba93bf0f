// On-disk kernel cache (disk_cache.h): entries are "DLLM-KERNEL-CACHE 1\n<header>\n" followed by the binary;
// the header repeats the full key (unit, target, versions, source length and two hashes) and is compared
// byte for byte on load, so a stale or foreign file is a miss, never a wrong kernel.
#include "jit/cuda/disk_cache.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "jit/cuda/kernel_set.h"

namespace dllm::jit::cuda {

namespace {

constexpr const char* kMagic = "DLLM-KERNEL-CACHE 1\n";

// mkdir -p; returns "" or the reason.
std::string make_dirs(const std::string& path) {
  std::string cur;
  std::stringstream ss(path);
  std::string part;
  if (!path.empty() && path[0] == '/') cur = "/";
  while (std::getline(ss, part, '/')) {
    if (part.empty()) continue;
    cur += part + "/";
    if (::mkdir(cur.c_str(), 0755) != 0 && errno != EEXIST) {
      return "cannot create " + cur + ": " + std::strerror(errno);
    }
  }
  return {};
}

std::string header_for(const std::string& unit, const std::string& source, const std::string& target, int nvrtc,
                       int driver) {
  // A second, differently seeded hash makes an accidental collision of both practically impossible.
  return "unit=" + unit + " target=" + target + " nvrtc=" + std::to_string(nvrtc) +
         " driver=" + std::to_string(driver) + " source_bytes=" + std::to_string(source.size()) +
         " fnv=" + hash_hex(source) + " fnv2=" + hash_hex("dllm" + source + "dllm");
}

}  // namespace

std::string kernel_cache_dir() {
  if (const char* c = std::getenv("DLLM_CACHE"); c && *c) return std::string(c) + "/cuda-kernels";
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return std::string(x) + "/dllm/cuda-kernels";
  if (const char* h = std::getenv("HOME"); h && *h) return std::string(h) + "/.cache/dllm/cuda-kernels";
  return "/tmp/dllm-cache/cuda-kernels";
}

std::string KernelDiskCache::entry_name(const std::string& unit, const std::string& source, const std::string& target,
                                        int nvrtc_version, int driver_version) {
  return unit + "-" + target + "-nvrtc" + std::to_string(nvrtc_version) + "-drv" + std::to_string(driver_version) +
         "-" + hash_hex(source) + ".bin";
}

std::optional<std::string> KernelDiskCache::load(const std::string& entry, const std::string& header) const {
  std::ifstream f(dir_ + "/" + entry, std::ios::binary);
  if (!f) return std::nullopt;
  std::ostringstream ss;
  ss << f.rdbuf();
  const std::string all = ss.str();
  const std::string prefix = std::string(kMagic) + header + "\n";
  if (all.size() <= prefix.size() || all.compare(0, prefix.size(), prefix) != 0) return std::nullopt;
  return all.substr(prefix.size());
}

std::string KernelDiskCache::store(const std::string& entry, const std::string& header,
                                   const std::string& binary) const {
  if (std::string err = make_dirs(dir_); !err.empty()) return err;
  std::string tmp = dir_ + "/." + entry + ".XXXXXX";
  const int fd = ::mkstemp(tmp.data());
  if (fd < 0) return "cannot create a file in " + dir_ + ": " + std::strerror(errno);
  const std::string data = std::string(kMagic) + header + "\n" + binary;
  size_t off = 0;
  while (off < data.size()) {
    const ssize_t w = ::write(fd, data.data() + off, data.size() - off);
    if (w <= 0) {
      const std::string err = std::strerror(errno);
      ::close(fd);
      ::unlink(tmp.c_str());
      return "cannot write " + tmp + ": " + err;
    }
    off += static_cast<size_t>(w);
  }
  ::fchmod(fd, 0644);
  ::close(fd);
  if (::rename(tmp.c_str(), (dir_ + "/" + entry).c_str()) != 0) {
    const std::string err = std::strerror(errno);
    ::unlink(tmp.c_str());
    return "cannot rename " + tmp + ": " + err;
  }
  return {};
}

CompileOutcome KernelDiskCache::compile_cached(const Nvrtc& nv, const std::string& source, const std::string& unit,
                                               const std::string& target, int driver_version) const {
  CompileOutcome out;
  const std::string entry = entry_name(unit, source, target, nv.version(), driver_version);
  const std::string header = header_for(unit, source, target, nv.version(), driver_version);
  if (auto hit = load(entry, header)) {
    out.binary = std::move(*hit);
    out.from_cache = true;
    return out;
  }
  CompiledUnit cu = nv.compile(source, unit, target);
  out.compile_seconds = cu.seconds;
  out.binary = target.rfind("sm_", 0) == 0 ? std::move(cu.cubin) : std::move(cu.ptx);
  if (target.rfind("compute_", 0) == 0) out.binary.push_back('\0');  // cuModuleLoadData wants NUL-terminated PTX
  out.cache_note = store(entry, header, out.binary);
  return out;
}

}  // namespace dllm::jit::cuda
