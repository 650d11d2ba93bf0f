// libFuzzer target for the GGUF reader: parses arbitrary bytes from memory (an exactly sized buffer, so
// ASan sees any read past the end), then walks everything the reader exposes the way dllm uses it:
// every metadata value, the typed getters, every tensor's bytes, and the first row decoded to f32.
// A dllm::Error is the expected outcome for bad input; anything else (crash, sanitizer report,
// other exception, hang) is a bug.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/error.h"
#include "model/gguf.h"
#if DLLM_FUZZ_HAVE_QUANT
#include "model/quant.h"
#endif

namespace {

volatile uint64_t g_sink;

uint64_t walk(const dllm::gguf::Value& v) {
  uint64_t h = static_cast<uint64_t>(v.type) + v.u + static_cast<uint64_t>(v.i) + v.s.size();
  if (!v.s.empty()) h += static_cast<uint8_t>(v.s.front()) + static_cast<uint8_t>(v.s.back());
  for (size_t k = 0; k < v.size(); ++k) h += walk(v.at(k));
  return h;
}

template <typename F>
void try_get(F&& f) {
  try {
    f();
  } catch (const dllm::Error&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // Copy into an exact-size heap block: libFuzzer's buffer is exact too, but this keeps the
  // target independent of that detail.
  std::vector<uint8_t> bytes(data, data + size);
  std::unique_ptr<dllm::gguf::File> f;
  try {
    f = dllm::gguf::File::from_memory(bytes.data(), bytes.size(), "fuzz.gguf");
  } catch (const dllm::Error&) {
    return 0;
  }
  uint64_t h = f->version() + f->alignment() + f->data_offset();
  for (const auto& kv : f->metadata()) {
    h += kv.key.size() + walk(kv.value);
    try_get([&] { h += f->get_uint(kv.key); });
    try_get([&] { h += static_cast<uint64_t>(f->get_int(kv.key)); });
    try_get([&] { h += static_cast<uint64_t>(f->get_float(kv.key) != 0); });
    try_get([&] { h += f->get_bool(kv.key); });
    try_get([&] { h += f->get_string(kv.key).size(); });
    try_get([&] { h += f->get_string_array(kv.key).size(); });
    try_get([&] { h += f->get_int_array(kv.key).size(); });
    if (f->find(kv.key) != &kv.value) __builtin_trap();  // keys are unique
  }
  for (const auto& t : f->tensors()) {
    if (f->find_tensor(t.name) != &t) __builtin_trap();  // names are unique
    h += static_cast<uint64_t>(t.n_elements()) + t.nbytes;
    if (t.nbytes > 0) h += t.data[0] + t.data[t.nbytes - 1];  // the extent lies inside the buffer
#if DLLM_FUZZ_HAVE_QUANT
    if (dllm::quant::can_dequantize(t.type()) && t.ne[0] > 0 && t.n_rows() > 0 && t.ne[0] <= (1 << 16)) {
      std::vector<float> row(static_cast<size_t>(t.ne[0]));
      dllm::quant::dequantize_row(t.type(), t.data, row.data(), t.ne[0]);
      h += static_cast<uint64_t>(row[0] != 0);
    }
#endif
  }
  g_sink = h;
  return 0;
}
