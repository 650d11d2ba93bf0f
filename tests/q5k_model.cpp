// write_q4k_as_q5k (q5k_model.h): GGUF header surgery. The tensor infos keep their length (only the type
// id and the data offset change), so the header is copied with those fields patched and the data
// section rebuilt, each tensor aligned as the file's general.alignment says.
#include "q5k_model.h"

#include <cmath>
#include <cstring>
#include <fstream>
#include <random>
#include <stdexcept>
#include <vector>

#include "model/quant.h"
#include "support.h"

namespace dllm::test {

namespace {

struct Cursor {
  const std::string& b;
  size_t pos = 0;
  template <class T>
  T get() {
    if (pos + sizeof(T) > b.size()) throw std::runtime_error("write_q4k_as_q5k: truncated GGUF");
    T v;
    std::memcpy(&v, b.data() + pos, sizeof(T));
    pos += sizeof(T);
    return v;
  }
  std::string str() {
    const uint64_t n = get<uint64_t>();
    if (pos + n > b.size()) throw std::runtime_error("write_q4k_as_q5k: truncated string");
    std::string s = b.substr(pos, n);
    pos += n;
    return s;
  }
  void skip_value(uint32_t type) {
    static const int kSize[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    if (type == 8) {
      str();
    } else if (type == 9) {
      const uint32_t et = get<uint32_t>();
      const uint64_t n = get<uint64_t>();
      for (uint64_t i = 0; i < n; ++i) skip_value(et);
    } else if (type < 13) {
      pos += kSize[type];
    } else {
      throw std::runtime_error("write_q4k_as_q5k: bad value type");
    }
  }
};

constexpr uint32_t kQ4K = 12, kQ5K = 13;

quant::BlockQ5_K convert(const quant::BlockQ4_K& a, Q5kMode mode, std::mt19937& rng) {
  quant::BlockQ5_K b{};
  b.d = a.d;
  b.dmin = a.dmin;
  std::memcpy(b.scales, a.scales, sizeof b.scales);
  std::memcpy(b.qs, a.qs, sizeof b.qs);
  if (mode == Q5kMode::SameValues) return b;
  const float d = quant::fp16_to_f32(a.d);
  b.d = quant::f32_to_fp16(d / 2);
  if (quant::fp16_to_f32(b.d) * 2 != d) throw std::runtime_error("write_q4k_as_q5k: d/2 not exact in fp16");
  std::memset(b.qs, 0, sizeof b.qs);
  for (int k = 0; k < 256; ++k) {
    const int q5 = 2 * quant::q4_k_quant(a, k) + static_cast<int>(rng() & 1);
    const int c = k / 64, r = k % 64;
    b.qs[32 * c + r % 32] |= static_cast<uint8_t>((q5 & 15) << (r < 32 ? 0 : 4));
    b.qh[r % 32] |= static_cast<uint8_t>((q5 >> 4) << (2 * c + (r < 32 ? 0 : 1)));
  }
  return b;
}

}  // namespace

int write_q4k_as_q5k(const std::string& src, const std::string& dst, Q5kMode mode, uint32_t seed) {
  const std::string in = read_file(src);
  Cursor c{in};
  if (c.get<uint32_t>() != 0x46554747u || c.get<uint32_t>() != 3) throw std::runtime_error("write_q4k_as_q5k: not GGUF v3");
  const uint64_t n_tensors = c.get<uint64_t>(), n_kv = c.get<uint64_t>();
  uint64_t alignment = 32;
  for (uint64_t i = 0; i < n_kv; ++i) {
    const std::string key = c.str();
    const uint32_t type = c.get<uint32_t>();
    if (key == "general.alignment" && type == 4) alignment = c.get<uint32_t>();
    else c.skip_value(type);
  }
  struct Info {
    size_t type_pos;
    uint32_t type;
    uint64_t offset, elements;
  };
  std::vector<Info> infos;
  for (uint64_t i = 0; i < n_tensors; ++i) {
    c.str();
    const uint32_t n_dims = c.get<uint32_t>();
    uint64_t elements = 1;
    for (uint32_t d = 0; d < n_dims; ++d) elements *= c.get<uint64_t>();
    Info info{c.pos, 0, 0, elements};
    info.type = c.get<uint32_t>();
    info.offset = c.get<uint64_t>();
    infos.push_back(info);
  }
  const size_t data_start = (c.pos + alignment - 1) / alignment * alignment;
  std::string out = in.substr(0, data_start);
  std::string data;
  std::mt19937 rng(seed);
  int converted = 0;
  for (const Info& t : infos) {
    const auto src_info = ggml_type_info(t.type);
    if (!src_info) throw std::runtime_error("write_q4k_as_q5k: unknown tensor type");
    const uint64_t bytes = t.elements / src_info->block_size * src_info->type_size;
    const char* p = in.data() + data_start + t.offset;
    data.resize((data.size() + alignment - 1) / alignment * alignment, '\0');
    const uint64_t new_offset = data.size();
    uint32_t new_type = t.type;
    if (t.type == kQ4K) {
      new_type = kQ5K;
      for (uint64_t b = 0; b < bytes / sizeof(quant::BlockQ4_K); ++b) {
        quant::BlockQ4_K a;
        std::memcpy(&a, p + b * sizeof a, sizeof a);
        const quant::BlockQ5_K q5 = convert(a, mode, rng);
        data.append(reinterpret_cast<const char*>(&q5), sizeof q5);
      }
      ++converted;
    } else {
      data.append(p, bytes);
    }
    std::memcpy(out.data() + t.type_pos, &new_type, 4);
    std::memcpy(out.data() + t.type_pos + 4, &new_offset, 8);
  }
  out += data;
  std::ofstream f(dst, std::ios::binary);
  f.write(out.data(), static_cast<std::streamsize>(out.size()));
  if (!f) throw std::runtime_error("write_q4k_as_q5k: cannot write " + dst);
  return converted;
}

}  // namespace dllm::test
