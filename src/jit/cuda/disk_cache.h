// The on-disk cache of compiled GPU kernel units, so that a second load of the same model on the same
// machine compiles nothing. An entry is keyed by the unit's source hash, the target (sm_90 / compute_90),
// the NVRTC version and the driver version; it is written to a temporary file in the cache directory and
// renamed into place, so concurrent processes never see half a file. The directory is
// $DLLM_CACHE/cuda-kernels, else $XDG_CACHE_HOME/dllm/cuda-kernels, else ~/.cache/dllm/cuda-kernels.
#pragma once
#include <optional>
#include <string>

#include "jit/cuda/nvrtc.h"

namespace dllm::jit::cuda {

std::string kernel_cache_dir();

// What compile_cached() did, for --verbose and tests.
struct CompileOutcome {
  std::string binary;        // CUBIN (sm_XX target) or PTX (compute_XX) to hand to cuModuleLoadData
  bool from_cache = false;
  double compile_seconds = 0;
  std::string cache_note;    // why the cache could not be used or written ("" when it was fine)
};

class KernelDiskCache {
 public:
  explicit KernelDiskCache(std::string dir = kernel_cache_dir()) : dir_(std::move(dir)) {}
  const std::string& dir() const { return dir_; }

  // The file name of an entry: <unit>-<target>-nvrtc<v>-drv<v>-<hash>.bin
  static std::string entry_name(const std::string& unit, const std::string& source, const std::string& target,
                                int nvrtc_version, int driver_version);
  // The entry's binary when present and its header matches exactly; nullopt otherwise.
  std::optional<std::string> load(const std::string& entry, const std::string& header) const;
  // Writes header + binary through a temporary file and rename(); returns "" or the reason it failed.
  std::string store(const std::string& entry, const std::string& header, const std::string& binary) const;

  // Looks the unit up, else compiles it with NVRTC for `target` and stores the result.
  CompileOutcome compile_cached(const Nvrtc& nv, const std::string& source, const std::string& unit,
                                const std::string& target, int driver_version) const;

 private:
  std::string dir_;
};

}  // namespace dllm::jit::cuda
