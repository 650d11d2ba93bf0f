// Reference quant decoders and quantizers against ggml's own output (tests/data/quants, see its README):
// every tensor of quants.gguf decodes bit for bit to quants-expected-f32.gguf; the Q8_0 / Q8_K tensors
// re-quantize from quants-source-f32.gguf to the same bytes; Q8_K of dot.gguf's act.f32 equals act.q8_k;
// fp16/bf16 conversions on their edge cases and against the compiler's IEEE _Float16.
// DLLM_QUANTS_DIR=<dir> runs the fixture tests on another set of the same files (e.g. a holdout set).
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "common/error.h"
#include "model/gguf.h"
#include "model/quant.h"
#include "support.h"

namespace q = dllm::quant;
using dllm::GgmlType;
using dllm::gguf::File;
using dllm::gguf::TensorInfo;

namespace {

std::string quants_dir() {
  const char* env = std::getenv("DLLM_QUANTS_DIR");
  return env && *env ? std::string(env) : dllm::test::data_path("quants");
}
std::unique_ptr<File> open_fixture(const std::string& name) { return File::open(quants_dir() + "/" + name); }

uint32_t bits(float f) { return std::bit_cast<uint32_t>(f); }

std::string hex(uint32_t v) {
  std::ostringstream s;
  s << "0x" << std::hex << v;
  return s.str();
}

// Decodes a whole tensor row by row (each row through its own dequantize_row call).
std::vector<float> decode(const TensorInfo& t) {
  std::vector<float> out(static_cast<size_t>(t.n_elements()));
  for (int64_t r = 0; r < t.n_rows(); ++r) {
    q::dequantize_row(t.type(), t.data + r * t.row_bytes(), out.data() + r * t.ne[0], t.ne[0]);
  }
  return out;
}

std::vector<float> f32_values(const TensorInfo& t) {
  EXPECT_EQ(t.type(), GgmlType::F32) << t.name;
  std::vector<float> v(static_cast<size_t>(t.n_elements()));
  std::memcpy(v.data(), t.data, v.size() * sizeof(float));
  return v;
}

// "" when identical bit for bit, else where and how the first element differs.
std::string first_bit_difference(const std::vector<float>& got, const std::vector<float>& want, int64_t ne0) {
  if (got.size() != want.size()) return "size " + std::to_string(got.size()) + " vs " + std::to_string(want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    if (bits(got[i]) != bits(want[i])) {
      std::ostringstream s;
      s << "first difference at element " << i << " (row " << i / ne0 << ", col " << i % ne0 << "): got "
        << got[i] << " (" << hex(bits(got[i])) << "), expected " << want[i] << " (" << hex(bits(want[i])) << ")";
      return s.str();
    }
  }
  return "";
}

const std::vector<GgmlType> kDecodable = {
    GgmlType::F32,  GgmlType::F16,  GgmlType::BF16, GgmlType::Q4_0, GgmlType::Q4_1,   GgmlType::Q5_0,
    GgmlType::Q5_1, GgmlType::Q8_0, GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q4_K,   GgmlType::Q5_K,
    GgmlType::Q6_K, GgmlType::Q8_K, GgmlType::IQ4_NL, GgmlType::IQ4_XS};

}  // namespace

// ---------------------------------------------------------------------------------------------
// Decoders against ggml
// ---------------------------------------------------------------------------------------------

TEST(QuantDecode, EveryFixtureTensorIsBitExact) {
  const auto src = open_fixture("quants.gguf");
  const auto expected = open_fixture("quants-expected-f32.gguf");
  ASSERT_FALSE(src->tensors().empty());
  EXPECT_EQ(src->tensors().size(), expected->tensors().size());
  std::set<GgmlType> seen;
  for (const TensorInfo& t : src->tensors()) {
    SCOPED_TRACE(std::string(t.name) + " (" + t.type_info.name + ")");
    const TensorInfo* e = expected->find_tensor(t.name);
    ASSERT_NE(e, nullptr) << "no expected values for " << t.name;
    ASSERT_EQ(e->type(), GgmlType::F32);
    for (int d = 0; d < 4; ++d) ASSERT_EQ(t.ne[d], e->ne[d]) << "dim " << d;
    ASSERT_TRUE(q::can_dequantize(t.type()));
    EXPECT_EQ(first_bit_difference(decode(t), f32_values(*e), t.ne[0]), "");
    seen.insert(t.type());
  }
  // The shared fixture covers all 16 types; a smaller set (DLLM_QUANTS_DIR) may hold fewer.
  if (!std::getenv("DLLM_QUANTS_DIR")) {
    EXPECT_EQ(seen.size(), kDecodable.size());
  }
}

TEST(QuantDecode, ManifestMatchesTheFile) {
  const auto src = open_fixture("quants.gguf");
  const auto manifest = nlohmann::json::parse(dllm::test::read_file(quants_dir() + "/quants-manifest.json"));
  ASSERT_EQ(manifest.size(), src->tensors().size());
  for (const auto& m : manifest) {
    const std::string name = m.at("name");
    const TensorInfo* t = src->find_tensor(name);
    ASSERT_NE(t, nullptr) << name;
    EXPECT_EQ(t->type_id, m.at("type_id").get<uint32_t>()) << name;
    EXPECT_EQ(std::string(t->type_info.name), m.at("type").get<std::string>()) << name;
    EXPECT_EQ(t->ne[0], m.at("ne")[0].get<int64_t>()) << name;
    EXPECT_EQ(t->ne[1], m.at("ne")[1].get<int64_t>()) << name;
    EXPECT_EQ(t->nbytes, m.at("nbytes").get<uint64_t>()) << name;
  }
}

TEST(QuantDecode, DecodedValuesAreCloseToTheSource) {
  // Not bit-exactness (above) but a sanity check that the decoded tensor approximates what was
  // quantized: within the manifest's max_abs_err (itself measured with ggml's decoder).
  const auto src = open_fixture("quants.gguf");
  const auto source = open_fixture("quants-source-f32.gguf");
  const auto manifest = nlohmann::json::parse(dllm::test::read_file(quants_dir() + "/quants-manifest.json"));
  for (const auto& m : manifest) {
    const std::string name = m.at("name");
    const std::vector<float> got = decode(*src->find_tensor(name));
    const std::vector<float> x = f32_values(*source->find_tensor(name));
    double max_err = 0;
    for (size_t i = 0; i < got.size(); ++i) max_err = std::max(max_err, double(std::fabs(got[i] - x[i])));
    EXPECT_LE(max_err, m.at("max_abs_err").get<double>()) << name;
  }
}

TEST(QuantDecode, UnalignedSourceGivesTheSameValues) {
  const auto src = open_fixture("quants.gguf");
  for (const TensorInfo& t : src->tensors()) {
    std::vector<uint8_t> buf(t.row_bytes() + 3);
    std::memcpy(buf.data() + 3, t.data, t.row_bytes());
    std::vector<float> a(t.ne[0]), b(t.ne[0]);
    q::dequantize_row(t.type(), t.data, a.data(), t.ne[0]);
    q::dequantize_row(t.type(), buf.data() + 3, b.data(), t.ne[0]);
    EXPECT_EQ(first_bit_difference(a, b, t.ne[0]), "") << t.name;
  }
}

TEST(QuantDecode, SupportedTypesAndErrors) {
  for (GgmlType t : kDecodable) EXPECT_TRUE(q::can_dequantize(t)) << dllm::ggml_type_name(t);
  for (GgmlType t : {GgmlType::Q8_1, GgmlType::IQ2_XXS, GgmlType::IQ3_S, GgmlType::IQ1_M, GgmlType::TQ1_0,
                     GgmlType::MXFP4, GgmlType::I8, GgmlType::F64}) {
    EXPECT_FALSE(q::can_dequantize(t)) << dllm::ggml_type_name(t);
  }
  uint8_t block[292] = {};
  float out[256];
  try {
    q::dequantize_row(GgmlType::IQ2_XXS, block, out, 256);
    FAIL() << "no error";
  } catch (const dllm::Error& e) {
    EXPECT_STREQ(e.what(), "unsupported GGUF tensor type: IQ2_XXS");
  }
  EXPECT_THROW(q::dequantize_row(GgmlType::Q4_K, block, out, 128), dllm::Error);
  EXPECT_THROW(q::dequantize_row(GgmlType::Q4_0, block, out, 33), dllm::Error);
  EXPECT_NO_THROW(q::dequantize_row(GgmlType::Q4_0, block, out, 0));
}

TEST(QuantDecode, HandBuiltBlocks) {
  // Small blocks whose values can be worked out by hand, one per layout family.
  float y[256];
  q::BlockQ4_0 b40{};
  b40.d = q::f32_to_fp16(0.5f);
  b40.qs[0] = 0x1f;  // element 0: 15-8 = 7, element 16: 1-8 = -7
  q::dequantize_row(GgmlType::Q4_0, &b40, y, 32);
  EXPECT_EQ(y[0], 3.5f);
  EXPECT_EQ(y[16], -3.5f);
  EXPECT_EQ(y[1], -4.0f);

  q::BlockQ5_0 b50{};
  b50.d = q::f32_to_fp16(1.0f);
  b50.qh[0] = 0x01;  // 5th bit of element 0
  b50.qh[2] = 0x02;  // 5th bit of element 17
  b50.qs[1] = 0x30;  // element 17 low bits 3
  q::dequantize_row(GgmlType::Q5_0, &b50, y, 32);
  EXPECT_EQ(y[0], 0.0f);    // 16 - 16
  EXPECT_EQ(y[17], 3.0f);   // 16+3 - 16
  EXPECT_EQ(y[2], -16.0f);  // 0 - 16

  q::BlockQ4_K b4k{};
  b4k.d = q::f32_to_fp16(1.0f);
  b4k.dmin = q::f32_to_fp16(0.5f);
  b4k.scales[0] = 2;                    // sub-block 0 scale 2
  b4k.scales[4] = 3;                    // sub-block 0 min 3
  b4k.scales[8 + 3] = 0x51;             // sub-block 7: scale low 1, min low 5
  b4k.scales[3] = 0x40;                 // sub-block 7 scale high bits 01 -> 17
  b4k.qs[0] = 0x94;                     // element 0: 4, element 32: 9
  b4k.qs[96 + 31] = 0xf0;               // element 255 (high nibble of chunk 3, l=31): 15
  q::dequantize_row(GgmlType::Q4_K, &b4k, y, 256);
  EXPECT_EQ(y[0], 2 * 4 - 1.5f);
  EXPECT_EQ(y[255], 17 * 15 - 0.5f * 5);

  q::BlockQ6_K b6k{};
  b6k.d = q::f32_to_fp16(0.25f);
  b6k.scales[4] = -2;                  // sub-block 4: elements 64..79
  b6k.ql[0] = 0x70;                    // element 64 low bits 7 (high nibble of ql[0])
  b6k.qh[0] = 0x30;                    // element 64 high bits 3 (bits 4-5 of qh[0])
  q::dequantize_row(GgmlType::Q6_K, &b6k, y, 256);
  EXPECT_EQ(y[64], 0.25f * -2 * ((7 | (3 << 4)) - 32));
  EXPECT_EQ(q::q6_k_quant(b6k, 64), 23);
  EXPECT_EQ(q::q6_k_quant(b6k, 0), -32);
}

// ---------------------------------------------------------------------------------------------
// Quantizers against ggml
// ---------------------------------------------------------------------------------------------

TEST(QuantQuantize, Q8_0AndQ8_KReproduceTheFixtureBytes) {
  // quants.gguf's Q8_0 tensors were made by ggml's quantize_row_q8_0_ref, its Q8_K tensors by
  // quantize_row_q8_K_ref, both from quants-source-f32.gguf (which includes all-zero and tiny rows).
  const auto src = open_fixture("quants.gguf");
  const auto source = open_fixture("quants-source-f32.gguf");
  int checked = 0;
  for (const TensorInfo& t : src->tensors()) {
    if (t.type() != GgmlType::Q8_0 && t.type() != GgmlType::Q8_K) continue;
    const std::vector<float> x = f32_values(*source->find_tensor(t.name));
    std::vector<uint8_t> got(t.nbytes);
    if (t.type() == GgmlType::Q8_0) {
      std::vector<q::BlockQ8_0> blocks(x.size() / 32);
      q::quantize_row_q8_0(x.data(), blocks.data(), static_cast<int64_t>(x.size()));
      std::memcpy(got.data(), blocks.data(), got.size());
    } else {
      std::vector<q::BlockQ8_K> blocks(x.size() / 256);
      q::quantize_row_q8_K(x.data(), blocks.data(), static_cast<int64_t>(x.size()));
      std::memcpy(got.data(), blocks.data(), got.size());
    }
    ASSERT_EQ(got.size(), t.nbytes);
    const size_t block = t.type_info.type_size;
    for (size_t i = 0; i < got.size(); ++i) {
      if (got[i] != t.data[i]) {
        ADD_FAILURE() << t.name << ": first differing byte " << i << " (block " << i / block << ", byte "
                      << i % block << "): got " << int(got[i]) << ", ggml " << int(t.data[i]);
        break;
      }
    }
    ++checked;
  }
  EXPECT_GT(checked, 0);
}

TEST(QuantQuantize, Q8_KOfDotActivationsIsBitExact) {
  const auto dot = open_fixture("dot.gguf");
  const TensorInfo* f = dot->find_tensor("act.f32");
  const TensorInfo* want = dot->find_tensor("act.q8_k");
  ASSERT_TRUE(f && want);
  ASSERT_EQ(want->type(), GgmlType::Q8_K);
  const std::vector<float> x = f32_values(*f);
  for (int64_t r = 0; r < f->n_rows(); ++r) {
    std::vector<q::BlockQ8_K> blocks(f->ne[0] / 256);
    q::quantize_row_q8_K(x.data() + r * f->ne[0], blocks.data(), f->ne[0]);
    const uint8_t* w = want->data + r * want->row_bytes();
    for (size_t b = 0; b < blocks.size(); ++b) {
      q::BlockQ8_K g;
      std::memcpy(&g, w + b * sizeof g, sizeof g);
      SCOPED_TRACE("row " + std::to_string(r) + " block " + std::to_string(b));
      EXPECT_EQ(bits(blocks[b].d), bits(g.d)) << blocks[b].d << " vs " << g.d;
      EXPECT_EQ(std::memcmp(blocks[b].qs, g.qs, sizeof g.qs), 0);
      EXPECT_EQ(std::memcmp(blocks[b].bsums, g.bsums, sizeof g.bsums), 0);
    }
  }
}

TEST(QuantQuantize, Q8_KEdgeCases) {
  std::vector<float> x(768, 0.0f);
  // Block 1: positive max 2 (d = 1/(-127/2) < 0; that element -> -127), a later -2 loses the tie.
  x[256 + 7] = 2.0f;
  x[256 + 9] = -2.0f;
  // Block 2: max 127, so iscale = -1 exactly and x*iscale ties round half to even.
  x[512 + 0] = 127.0f;
  x[512 + 1] = 2.5f;   // -2.5 -> -2
  x[512 + 2] = -0.5f;  // 0.5 -> 0
  x[512 + 3] = 1.5f;   // -1.5 -> -2
  q::BlockQ8_K y[3];
  std::memset(y, 0x55, sizeof y);
  q::quantize_row_q8_K(x.data(), y, 768);
  EXPECT_EQ(y[0].d, 0.0f);  // all-zero block
  for (int j = 0; j < 256; ++j) ASSERT_EQ(y[0].qs[j], 0);
  for (int j = 0; j < 16; ++j) ASSERT_EQ(y[0].bsums[j], 0);
  EXPECT_EQ(y[1].d, 1 / (-127.f / 2.0f));
  EXPECT_LT(y[1].d, 0.0f);
  EXPECT_EQ(y[1].qs[7], -127);
  EXPECT_EQ(y[1].qs[9], 127);
  EXPECT_EQ(y[1].bsums[0], 0);
  EXPECT_EQ(y[2].d, -1.0f);
  EXPECT_EQ(y[2].qs[0], -127);
  EXPECT_EQ(y[2].qs[1], -2);
  EXPECT_EQ(y[2].qs[2], 0);
  EXPECT_EQ(y[2].qs[3], -2);
  EXPECT_EQ(y[2].bsums[0], -131);
  EXPECT_EQ(y[2].bsums[1], 0);
  EXPECT_THROW(q::quantize_row_q8_K(x.data(), y, 100), dllm::Error);
}

TEST(QuantQuantize, Q8_0RoundsHalfAwayFromZero) {
  std::vector<float> x(32, 0.0f);
  x[0] = 127.0f;   // d = 1, id = 1
  x[1] = 2.5f;     // -> 3 (roundf), not 2
  x[2] = -2.5f;    // -> -3
  x[3] = 0.49f;
  q::BlockQ8_0 y{};
  q::quantize_row_q8_0(x.data(), &y, 32);
  EXPECT_EQ(q::fp16_to_f32(y.d), 1.0f);
  EXPECT_EQ(y.qs[0], 127);
  EXPECT_EQ(y.qs[1], 3);
  EXPECT_EQ(y.qs[2], -3);
  EXPECT_EQ(y.qs[3], 0);
  std::vector<float> zeros(64, 0.0f);
  q::BlockQ8_0 z[2];
  q::quantize_row_q8_0(zeros.data(), z, 64);
  EXPECT_EQ(z[1].d, 0);
  EXPECT_EQ(z[1].qs[5], 0);
  EXPECT_THROW(q::quantize_row_q8_0(x.data(), &y, 31), dllm::Error);
}

// ---------------------------------------------------------------------------------------------
// fp16 / bf16
// ---------------------------------------------------------------------------------------------

TEST(QuantFloat, Fp16EdgeValues) {
  EXPECT_EQ(bits(q::fp16_to_f32(0x0000)), 0x00000000u);
  EXPECT_EQ(bits(q::fp16_to_f32(0x8000)), 0x80000000u);              // -0
  EXPECT_EQ(q::fp16_to_f32(0x0001), std::ldexp(1.0f, -24));          // smallest subnormal
  EXPECT_EQ(q::fp16_to_f32(0x03ff), std::ldexp(1023.0f, -24));       // largest subnormal
  EXPECT_EQ(q::fp16_to_f32(0x8200), -std::ldexp(1.0f, -15));
  EXPECT_EQ(q::fp16_to_f32(0x0400), std::ldexp(1.0f, -14));          // smallest normal
  EXPECT_EQ(q::fp16_to_f32(0x3c00), 1.0f);
  EXPECT_EQ(q::fp16_to_f32(0x7bff), 65504.0f);
  EXPECT_EQ(q::fp16_to_f32(0x7c00), std::numeric_limits<float>::infinity());
  EXPECT_EQ(q::fp16_to_f32(0xfc00), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(q::fp16_to_f32(0x7e00)));
  EXPECT_TRUE(std::isnan(q::fp16_to_f32(0xfd01)));
  EXPECT_EQ(bits(q::fp16_to_f32(0x7e01)), 0x7fc02000u);  // payload kept

  EXPECT_EQ(q::f32_to_fp16(65504.0f), 0x7bff);
  EXPECT_EQ(q::f32_to_fp16(65519.996f), 0x7bff);
  EXPECT_EQ(q::f32_to_fp16(65520.0f), 0x7c00);  // the tie goes to even: inf
  EXPECT_EQ(q::f32_to_fp16(1e10f), 0x7c00);
  EXPECT_EQ(q::f32_to_fp16(-1e10f), 0xfc00);
  EXPECT_EQ(q::f32_to_fp16(std::numeric_limits<float>::infinity()), 0x7c00);
  EXPECT_EQ(q::f32_to_fp16(-0.0f), 0x8000);
  EXPECT_EQ(q::f32_to_fp16(std::ldexp(1.0f, -25)), 0x0000);              // tie between 0 and 1: 0
  EXPECT_EQ(q::f32_to_fp16(std::nextafter(std::ldexp(1.0f, -25), 1.0f)), 0x0001);
  EXPECT_EQ(q::f32_to_fp16(std::ldexp(3.0f, -25)), 0x0002);              // tie between 1 and 2: 2
  EXPECT_EQ(q::f32_to_fp16(std::ldexp(2047.0f, -25)), 0x0400);           // rounds up into the normals
  EXPECT_EQ(q::f32_to_fp16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);       // tie: even
  EXPECT_EQ(q::f32_to_fp16(1.0f + std::ldexp(3.0f, -11)), 0x3c02);       // tie: even
  EXPECT_EQ(q::f32_to_fp16(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_EQ(q::f32_to_fp16(-std::numeric_limits<float>::denorm_min()), 0x8000);
  const uint16_t nan = q::f32_to_fp16(std::numeric_limits<float>::quiet_NaN());
  EXPECT_EQ(nan & 0x7c00, 0x7c00);
  EXPECT_NE(nan & 0x03ff, 0);
  EXPECT_EQ(q::f32_to_fp16(-std::numeric_limits<float>::quiet_NaN()) & 0x8000, 0x8000);
  EXPECT_EQ(q::f32_to_fp16(std::bit_cast<float>(0x7f800001u)) & 0x7e00, 0x7e00);  // signalling -> quiet NaN
}

TEST(QuantFloat, Fp16RoundTripsEveryHalf) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = q::fp16_to_f32(static_cast<uint16_t>(h));
    if ((h & 0x7c00) == 0x7c00 && (h & 0x03ff)) {
      ASSERT_TRUE(std::isnan(f)) << hex(h);
      continue;
    }
    ASSERT_EQ(q::f32_to_fp16(f), h) << hex(h);
  }
}

#if defined(__FLT16_MAX__)
TEST(QuantFloat, Fp16MatchesCompilerFloat16) {
  // The compiler's _Float16 conversions are IEEE round-to-nearest-even: an independent oracle.
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const _Float16 v = std::bit_cast<_Float16>(static_cast<uint16_t>(h));
    if (v != v) continue;  // NaNs: payload handling is not specified
    ASSERT_EQ(bits(q::fp16_to_f32(static_cast<uint16_t>(h))), bits(static_cast<float>(v))) << hex(h);
  }
  // Every float whose top 20 bits vary, with several low-bit patterns, covers every rounding case.
  for (uint32_t hi = 0; hi < (1u << 20); ++hi) {
    for (uint32_t lo : {0x000u, 0x001u, 0x7ffu, 0x800u, 0x801u, 0xfffu}) {
      const float f = std::bit_cast<float>((hi << 12) | lo);
      if (std::isnan(f)) continue;
      const auto want = std::bit_cast<uint16_t>(static_cast<_Float16>(f));
      ASSERT_EQ(q::f32_to_fp16(f), want) << f << " " << hex(bits(f));
    }
  }
}
#endif

TEST(QuantFloat, Bf16) {
  EXPECT_EQ(q::bf16_to_f32(0x3f80), 1.0f);
  EXPECT_EQ(q::bf16_to_f32(0xc000), -2.0f);
  EXPECT_EQ(q::bf16_to_f32(0x0001), std::ldexp(1.0f, -133));  // bf16 subnormal
  EXPECT_EQ(bits(q::bf16_to_f32(0x8000)), 0x80000000u);
  EXPECT_EQ(q::bf16_to_f32(0x7f80), std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(q::bf16_to_f32(0x7fc1)));
  EXPECT_EQ(q::f32_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);  // tie: even
  EXPECT_EQ(q::f32_to_bf16(1.0f + std::ldexp(3.0f, -8)), 0x3f82);  // tie: even
  EXPECT_EQ(q::f32_to_bf16(1.0f + std::ldexp(5.0f, -9)), 0x3f81);  // above the tie
  EXPECT_EQ(q::f32_to_bf16(std::numeric_limits<float>::max()), 0x7f80);  // overflows to inf
  EXPECT_EQ(q::f32_to_bf16(std::bit_cast<float>(0x7f800001u)), 0x7fc0);  // NaN stays NaN, quiet
  EXPECT_EQ(q::f32_to_bf16(std::bit_cast<float>(0xff800001u)), 0xffc0);
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = q::bf16_to_f32(static_cast<uint16_t>(h));
    ASSERT_EQ(bits(f), h << 16);
    if (!std::isnan(f)) {
      ASSERT_EQ(q::f32_to_bf16(f), h) << hex(h);
    }
  }
}
