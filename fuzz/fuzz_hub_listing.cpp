// libFuzzer target for the hub's file listing parser (src/hub/hub_api.cpp): arbitrary bytes as the JSON a hub
// (or anything claiming to be one) answers. A dllm::Error is the expected outcome for bad input; a crash, a
// sanitizer report, an out-of-memory, a hang, or a listed file that breaks the invariants below is a bug:
// every path is safe to join under the cache (no NUL or other control byte, valid UTF-8, no "..", not absolute),
// every sha256 is empty or 64 lower-case hex digits, and messages built from the entries carry no control byte.
#include <cstddef>
#include <cstdint>
#include <string>

#include "hub/hub.h"
#include "hub/internal.h"
#include "common/error.h"

namespace {

void check_message(const std::string& m) {
  for (unsigned char c : m)
    if (c < 0x20 || c == 0x7f) __builtin_trap();  // a terminal escape made it into a message
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  std::vector<dllm::hub::RemoteFile> files;
  try {
    files = dllm::hub::parse_file_list(text, "fuzz/repo");
  } catch (const dllm::Error& e) {
    check_message(e.what());
    return 0;
  }
  for (const auto& f : files) {
    if (!dllm::hub::safe_relative_path(f.path)) __builtin_trap();
    if (f.path.find('\0') != std::string::npos) __builtin_trap();
    if (!f.sha256.empty()) {
      if (f.sha256.size() != 64) __builtin_trap();
      for (char c : f.sha256)
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) __builtin_trap();
    }
    (void)dllm::hub::quant_label(f.path);
  }
  for (const char* quant : {"", "Q4_K_M", "Q8_0", "model.gguf"}) {
    try {
      (void)dllm::hub::choose_gguf(files, dllm::hub::ModelId{"fuzz/repo", quant});
    } catch (const dllm::Error& e) {
      check_message(e.what());
    }
  }
  return 0;
}
