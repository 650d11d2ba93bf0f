// Repacking, descriptors and the kernel cache: the unpacked quants equal the reference decoders' on
// ggml's fixture blocks; layouts and errors; parallel repacking equals serial; kernel names; the cache
// generates once per descriptor even under concurrent lookups and remembers failures; the ymm families'
// code has no EVEX instruction (it must run on CPUs without AVX-512); DLLM_ISA caps the default family.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>
#include <random>
#include <string>
#include <thread>
#include <unistd.h>

#include "jit/cpu_features.h"
#include "jit/gemm.h"
#include "jit/quant_act_simd.h"
#include "jit/weight_types.h"
#include "jit/x64/gemm_gen.h"
#include "common/error.h"
#include "model/gguf.h"
#include "model/quant.h"
#include "common/thread_pool.h"
#include "support.h"
#include "test_jit_util.h"

using namespace dllm;
using namespace dllm::jit;

TEST(JitRepack, UnpackedQuantsEqualReferenceDecoders) {
  const auto file = gguf::File::open(dllm::test::data_path("quants/quants.gguf"));
  int checked = 0;
  for (const gguf::TensorInfo& t : file->tensors()) {
    if (t.type() != GgmlType::Q4_K && t.type() != GgmlType::Q5_K && t.type() != GgmlType::Q6_K) continue;
    const size_t bs = t.type_info.type_size;
    for (uint64_t b = 0; b < t.nbytes / bs; ++b) {
      const uint8_t* blk = t.data + b * bs;
      uint8_t q[256];
      if (t.type() == GgmlType::Q4_K) {
        unpack_q4_k(blk, q);
        quant::BlockQ4_K ref;
        std::memcpy(&ref, blk, bs);
        for (int k = 0; k < 256; ++k) ASSERT_EQ(q[k], quant::q4_k_quant(ref, k)) << t.name << " block " << b;
      } else if (t.type() == GgmlType::Q5_K) {
        unpack_q5_k(blk, q);
        quant::BlockQ5_K ref;
        std::memcpy(&ref, blk, bs);
        // q5_k_quant times the scale, minus the min, is ggml's dequantized value (test_quant checks the decoder).
        std::vector<float> deq(256);
        quant::dequantize_row(GgmlType::Q5_K, blk, deq.data(), 256);
        for (int k = 0; k < 256; ++k) {
          ASSERT_EQ(q[k], quant::q5_k_quant(ref, k)) << t.name << " block " << b;
          uint8_t sc = 0, m = 0;
          quant::scale_min_k4(k / 32, ref.scales, &sc, &m);
          const float d = quant::fp16_to_f32(ref.d) * sc, mn = quant::fp16_to_f32(ref.dmin) * m;
          ASSERT_EQ(d * q[k] - mn, deq[k]) << t.name << " block " << b << " element " << k;
        }
      } else {
        unpack_q6_k(blk, q);
        quant::BlockQ6_K ref;
        std::memcpy(&ref, blk, bs);
        for (int k = 0; k < 256; ++k) ASSERT_EQ(q[k], quant::q6_k_quant(ref, k) + 32) << t.name << " block " << b;
      }
      ++checked;
    }
  }
  EXPECT_GE(checked, 10);
}

// Q5_0: unpack_q5_0's signed quants times d are ggml's dequantized values (test_quant checks the decoder
// against ggml's), and q5_0_quant - 16, on every block of quants.gguf's Q5_0 tensors.
TEST(JitRepack, UnpackedQ5_0EqualsReferenceDecoder) {
  const auto file = gguf::File::open(dllm::test::data_path("quants/quants.gguf"));
  int checked = 0;
  for (const gguf::TensorInfo& t : file->tensors()) {
    if (t.type() != GgmlType::Q5_0) continue;
    for (uint64_t b = 0; b < t.nbytes / 22; ++b) {
      const uint8_t* blk = t.data + b * 22;
      int8_t q[32];
      unpack_q5_0(blk, q);
      quant::BlockQ5_0 ref;
      std::memcpy(&ref, blk, 22);
      float deq[32];
      quant::dequantize_row(GgmlType::Q5_0, blk, deq, 32);
      for (int j = 0; j < 32; ++j) {
        ASSERT_EQ(q[j], quant::q5_0_quant(ref, j) - 16) << t.name << " block " << b;
        ASSERT_EQ(quant::fp16_to_f32(ref.d) * q[j], deq[j]) << t.name << " block " << b << " element " << j;
      }
      ++checked;
    }
  }
  EXPECT_GE(checked, 10);
}

// quantize_acts (vectorised where the CPU allows) against the reference quantizers, byte for byte, on
// rows built to hit the edge cases: ties of the largest magnitude with both signs, products landing on
// .5 exactly, all-zero and tiny blocks, huge values, a NaN/inf block (handed to the reference code).
TEST(JitActs, QuantisationEqualsReferenceQuantizers) {
  std::mt19937 rng(21);
  std::normal_distribution<float> nd(0.f, 1.f);
  const int64_t k = 1024, rows = 40;
  std::vector<float> x(rows * k);
  for (int64_t r = 0; r < rows; ++r) {
    float* row = x.data() + r * k;
    for (int64_t i = 0; i < k; ++i) row[i] = nd(rng);
    switch (r % 8) {
      case 1:  // ties of the largest magnitude, negative first
        row[5] = -9.f, row[77] = 9.f, row[300] = 9.f, row[301] = -9.f;
        break;
      case 2:  // multiples of 1/254 so that x * 127 / amax lands on .5
        for (int64_t i = 0; i < k; ++i) row[i] = static_cast<float>(static_cast<int>(rng() % 255) - 127) / 2.f;
        break;
      case 3:  // zero and tiny blocks
        for (int64_t i = 0; i < 256; ++i) row[i] = 0.f;
        for (int64_t i = 256; i < 512; ++i) row[i] *= 1e-30f;
        break;
      case 4:
        for (int64_t i = 0; i < k; ++i) row[i] *= 1e30f;
        break;
      case 5:
        row[3] = std::numeric_limits<float>::infinity();
        row[600] = std::nanf("");
        break;
      default:
        break;
    }
  }
  ThreadPool pool(2);
  for (ActFormat fmt : {ActFormat::Q8_K, ActFormat::Q8_0}) {
    QuantizedActs a;
    quantize_acts(fmt, x.data(), rows, k, a, pool);
    std::vector<uint8_t> ref(a.blocks.size());
    for (int64_t r = 0; r < rows; ++r) {
      uint8_t* dst = ref.data() + r * a.blocks_per_row() * a.block_bytes();
      if (fmt == ActFormat::Q8_K) quant::quantize_row_q8_K(x.data() + r * k, reinterpret_cast<quant::BlockQ8_K*>(dst), k);
      else quant::quantize_row_q8_0(x.data() + r * k, reinterpret_cast<quant::BlockQ8_0*>(dst), k);
    }
    for (int64_t r = 0; r < rows; ++r) {
      const size_t row_bytes = a.blocks_per_row() * a.block_bytes();
      EXPECT_EQ(std::memcmp(a.blocks.data() + r * row_bytes, ref.data() + r * row_bytes, row_bytes), 0)
          << (fmt == ActFormat::Q8_K ? "Q8_K" : "Q8_0") << " row " << r;
    }
    // Each vectorised twin the CPU runs, called directly (quantize_acts takes only the widest).
    using Q8K = void (*)(const float*, quant::BlockQ8_K*, int64_t);
    using Q80 = void (*)(const float*, quant::BlockQ8_0*, int64_t);
    struct Twin {
      const char* name;
      bool runs;
      Q8K q8_k;
      Q80 q8_0;
    };
    const Twin twins[] = {{"avx2", cpu_features().avx2, quantize_row_q8_K_avx2, quantize_row_q8_0_avx2},
                          {"avx512", cpu_features().avx512bw, quantize_row_q8_K_avx512, quantize_row_q8_0_avx512}};
    int ran = 0;
    for (const Twin& t : twins) {
      if (!t.runs) continue;
      ++ran;
      std::vector<uint8_t> got(ref.size());
      for (int64_t r = 0; r < rows; ++r) {
        uint8_t* dst = got.data() + r * a.blocks_per_row() * a.block_bytes();
        if (fmt == ActFormat::Q8_K) t.q8_k(x.data() + r * k, reinterpret_cast<quant::BlockQ8_K*>(dst), k);
        else t.q8_0(x.data() + r * k, reinterpret_cast<quant::BlockQ8_0*>(dst), k);
      }
      EXPECT_EQ(got, ref) << t.name << " " << (fmt == ActFormat::Q8_K ? "Q8_K" : "Q8_0");
    }
    std::printf("%s: %d vectorised quantizers checked\n", fmt == ActFormat::Q8_K ? "Q8_K" : "Q8_0", ran);
  }
}

TEST(JitRepack, LayoutSizes) {
  const PackedLayout a = packed_layout(Isa::Avx512Vnni, GgmlType::Q4_K, 33, 512);
  EXPECT_EQ(a.p, 16);
  EXPECT_EQ(a.n_panels, 3);
  EXPECT_EQ(a.nblocks, 2);
  EXPECT_EQ(a.quant_bytes, 128 * 16);  // 4 bits per weight
  EXPECT_EQ(a.panel_bytes % 64, 0);
  EXPECT_EQ(a.panel_bytes, 2 * (128 + 20) * 16);
  const PackedLayout b = packed_layout(Isa::Avx2, GgmlType::Q8_0, 8, 96);
  EXPECT_EQ(b.p, 8);
  EXPECT_EQ(b.n_panels, 1);
  EXPECT_EQ(b.nblocks, 3);
  EXPECT_EQ(b.panel_bytes, (3 * 34 * 8 + 63) / 64 * 64);
  const PackedLayout c = packed_layout(Isa::AvxVnni, GgmlType::Q6_K, 9, 256);
  EXPECT_EQ(c.quant_bytes, 256 * 8);
  EXPECT_EQ(c.n_panels, 2);
  // Q6_K on avx512-vnni: panels of two vectors (32 rows); AMX keeps one-vector panels (its tile rows).
  const PackedLayout e = packed_layout(Isa::Avx512Vnni, GgmlType::Q6_K, 33, 512);
  EXPECT_EQ(e.p, 32);
  EXPECT_EQ(e.n_panels, 2);
  EXPECT_EQ(e.quant_bytes, 256 * 32);
  EXPECT_EQ(e.meta_bytes, 18 * 32);
  EXPECT_EQ(packed_layout(Isa::Amx, GgmlType::Q6_K, 33, 512).p, 16);
  EXPECT_EQ(packed_layout(Isa::Avx512Vnni, GgmlType::Q6_K, 33, kTwoVectorMaxK).p, 32);
  EXPECT_EQ(packed_layout(Isa::Avx512Vnni, GgmlType::Q6_K, 33, kTwoVectorMaxK + 256).p, 16);
  // Q5_K: Q4_K's nibbles plus one high-bit vector per group, Q4_K's meta record.
  const PackedLayout f = packed_layout(Isa::Avx2, GgmlType::Q5_K, 17, 768);
  EXPECT_EQ((std::vector<int64_t>{f.p, f.n_panels, f.quant_bytes, f.meta_bytes}),
            (std::vector<int64_t>{8, 3, 160 * 8, 20 * 8}));
  EXPECT_EQ(packed_layout(Isa::Avx512Vnni, GgmlType::Q5_K, 33, 512).p, 16);
  // Q5_0: four nibble vectors and a high-bit vector, one fp16 d: the GGUF's 22 bytes per block and row.
  const PackedLayout g = packed_layout(Isa::Avx512Vnni, GgmlType::Q5_0, 17, 704);
  EXPECT_EQ((std::vector<int64_t>{g.p, g.n_panels, g.nblocks, g.quant_bytes, g.meta_bytes}),
            (std::vector<int64_t>{16, 2, 22, 20 * 16, 2 * 16}));
  EXPECT_EQ(packed_layout(Isa::Avx512Vnni, GgmlType::Q5_0, 16, 704).total_bytes(), 16 * 704 / 32 * 22);
}

// Calls f(row, p, blk, quants, meta) for every row of every panel (padding rows too) and every block of the
// row: p is the row's lane in its panel, quants and meta the block's two regions of that panel.
template <class F>
void for_each_panel_block(const QuantMatrix& m, F f) {
  const PackedLayout& L = m.layout;
  for (int64_t row = 0; row < L.n_panels * L.p; ++row) {
    const uint8_t* panel = m.packed.data() + (row / L.p) * L.panel_bytes;
    for (int64_t blk = 0; blk < L.nblocks; ++blk)
      f(row, static_cast<int>(row % L.p), blk, panel + blk * L.quant_bytes,
        panel + L.meta_offset() + blk * L.meta_bytes);
  }
}

// Under amx, the avx512-vnni kernels run the types without an AMX body (Q5_0); the tiles run Q4_K, Q5_K, Q6_K and
// Q8_0. Other families run their own kernels for every type. prepare_matrix packs each matrix for the family
// matrix_family names.
TEST(JitRepack, AmxRunsTheTypesWithAnAmxBody) {
  for (GgmlType t : {GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::Q8_0})
    EXPECT_EQ(matrix_family(Isa::Amx, t), Isa::Amx);
  EXPECT_EQ(matrix_family(Isa::Amx, GgmlType::Q5_0), Isa::Avx512Vnni);
  for (Isa isa : {Isa::Portable, Isa::Avx2, Isa::AvxVnni, Isa::Avx512Vnni})
    for (GgmlType t : {GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::Q8_0, GgmlType::Q5_0})
      EXPECT_EQ(matrix_family(isa, t), isa);
  std::mt19937 rng(31);
  ThreadPool pool(2);
  for (GgmlType t : {GgmlType::Q6_K, GgmlType::Q5_K, GgmlType::Q5_0}) {
    const std::vector<uint8_t> w = dllm::jit::test::random_weights(t, 16, 512, rng);
    EXPECT_EQ(prepare_matrix(t, 512, 16, w.data(), Isa::Amx, pool).isa, matrix_family(Isa::Amx, t));
  }
}

// The Q5_0 panels decoded back by the layout repack.h describes (nibble vectors, then the fifth bits at bits
// 2g and 2g + 1 of the high-bit vector) give every weight's 5-bit quant (ggml's q, in 0..31: the same bytes
// on every family) and d, on every family's panel width, padding rows zero. The amx family prepares its
// Q5_0 matrices for avx512-vnni (no AMX body).
TEST(JitRepack, Q5_0PanelsDecodeToTheQuants) {
  std::mt19937 rng(50);
  const int64_t n = 21, k = 96;
  const std::vector<uint8_t> w = dllm::jit::test::random_weights(GgmlType::Q5_0, n, k, rng);
  ThreadPool pool(2);
  EXPECT_EQ(prepare_matrix(GgmlType::Q5_0, k, n, w.data(), Isa::Amx, pool).isa, Isa::Avx512Vnni);
  for (Isa isa : {Isa::Avx2, Isa::AvxVnni, Isa::Avx512Vnni}) {
    const QuantMatrix m = prepare_matrix(GgmlType::Q5_0, k, n, w.data(), isa, pool);
    const PackedLayout& L = m.layout;
    for_each_panel_block(m, [&](int64_t row, int p, int64_t blk, const uint8_t* qv, const uint8_t* meta) {
      quant::BlockQ5_0 ref{};
      if (row < n) std::memcpy(&ref, w.data() + row * (k / 32) * 22 + blk * 22, 22);
      for (int e = 0; e < 32; ++e) {
        const int g = e % 16 / 4, b = e % 4, high = e / 16;  // group g of the low (high) nibbles
        const int nib = qv[g * 4 * L.p + 4 * p + b] >> (4 * high) & 15;
        const int fifth = qv[4 * 4 * L.p + 4 * p + b] >> (2 * g + high) & 1;
        ASSERT_EQ(nib | fifth << 4, row < n ? quant::q5_0_quant(ref, e) : 0) << isa_name(isa) << " row " << row << " e " << e;
      }
      uint16_t d = 0;
      std::memcpy(&d, meta + meta::q8_0_d(L.p) + 2 * p, 2);
      ASSERT_EQ(d, ref.d);
    });
  }
}

// unpack_row decodes a row from the panels alone, bit for bit the reference decoder of the ggml row, on every
// family's layout (Q6_K: 32-row panels on avx512-vnni at this k, signed bytes on amx; Q8_0: biased bytes on
// the VNNI families), including the last, partial panel; other types and rows out of range are errors.
TEST(JitRepack, RowsDecodeFromThePanelsBitForBit) {
  std::mt19937 rng(61);
  ThreadPool pool(2);
  const int64_t n = 45, k = 512;
  for (GgmlType t : {GgmlType::Q6_K, GgmlType::Q8_0}) {
    ASSERT_TRUE(can_unpack_rows(t));
    const std::vector<uint8_t> w = dllm::jit::test::random_weights(t, n, k, rng);
    const size_t row_bytes = w.size() / n;
    for (Isa isa : {Isa::Avx2, Isa::AvxVnni, Isa::Avx512Vnni, Isa::Amx}) {
      const QuantMatrix m = prepare_matrix(t, k, n, w.data(), isa, pool);
      std::vector<float> got(k), want(k);
      for (int64_t r = 0; r < n; ++r) {
        unpack_row(m, r, got.data());
        quant::dequantize_row(t, w.data() + r * row_bytes, want.data(), k);
        ASSERT_EQ(std::memcmp(got.data(), want.data(), k * sizeof(float)), 0)
            << ggml_type_name(t) << " " << isa_name(isa) << " row " << r;
      }
      EXPECT_THROW(unpack_row(m, n, got.data()), Error);
      EXPECT_THROW(unpack_row(m, -1, got.data()), Error);
      // unpack_rows: ranges that start and end inside panels and cross them, at a stride wider than a row, are
      // unpack_row's rows; the gaps between them stay untouched.
      const std::vector<std::pair<int64_t, int64_t>> ranges = {{0, 45}, {3, 30}, {17, 20}, {44, 1}, {5, 0}};
      for (const auto& [r0, count] : ranges) {
        const int64_t stride = k + 7;
        std::vector<float> many(static_cast<size_t>(std::max<int64_t>(count, 1) * stride), -7.0f);
        unpack_rows(m, r0, count, many.data(), stride);
        for (int64_t i = 0; i < count; ++i) {
          unpack_row(m, r0 + i, got.data());
          ASSERT_EQ(std::memcmp(got.data(), many.data() + i * stride, k * sizeof(float)), 0)
              << ggml_type_name(t) << " " << isa_name(isa) << " rows from " << r0 << ", row " << r0 + i;
          for (int64_t c = k; c < stride && i + 1 < count; ++c)
            ASSERT_EQ(many[static_cast<size_t>(i * stride + c)], -7.0f) << "the gap after row " << r0 + i;
        }
      }
      std::vector<float> two(2 * static_cast<size_t>(k));
      EXPECT_THROW(unpack_rows(m, n - 1, 2, two.data(), k), Error);
      EXPECT_THROW(unpack_rows(m, -1, 2, two.data(), k), Error);
    }
    const QuantMatrix portable = prepare_matrix(t, k, n, w.data(), Isa::Portable, pool);
    std::vector<float> out(k);
    EXPECT_THROW(unpack_row(portable, 0, out.data()), Error);  // nothing packed
  }
  EXPECT_FALSE(can_unpack_rows(GgmlType::Q4_K));
  const std::vector<uint8_t> q4 = dllm::jit::test::random_weights(GgmlType::Q4_K, 16, 256, rng);
  std::vector<float> out(256);
  EXPECT_THROW(unpack_row(prepare_matrix(GgmlType::Q4_K, 256, 16, q4.data(), Isa::Avx512Vnni, pool), 0, out.data()),
               Error);
}

// The Q5_K panels decoded back by the layout repack.h describes give every weight's 5-bit quant, scale
// and min, on every family's panel width (padding rows all zero).
TEST(JitRepack, Q5KPanelsDecodeToTheQuants) {
  std::mt19937 rng(55);
  const int64_t n = 21, k = 512;
  const std::vector<uint8_t> w = dllm::jit::test::random_weights(GgmlType::Q5_K, n, k, rng);
  ThreadPool pool(2);
  for (Isa isa : {Isa::Avx2, Isa::AvxVnni, Isa::Avx512Vnni}) {
    const QuantMatrix m = prepare_matrix(GgmlType::Q5_K, k, n, w.data(), isa, pool);
    const PackedLayout& L = m.layout;
    for_each_panel_block(m, [&](int64_t row, int p, int64_t blk, const uint8_t* qv, const uint8_t* meta) {
      quant::BlockQ5_K ref{};
      if (row < n) std::memcpy(&ref, w.data() + row * (k / 256) * 176 + blk * 176, 176);
      for (int e = 0; e < 256; ++e) {
        const int t = e / 64, half = (e % 64) / 32, j = (e % 32) / 4, b = e % 4;
        const uint8_t nib = qv[(8 * t + j) * 4 * L.p + 4 * p + b];
        const uint8_t h = qv[(32 + j) * 4 * L.p + 4 * p + b];
        const int q = (half ? nib >> 4 : nib & 15) | ((h >> (2 * t + half)) & 1) << 4;
        ASSERT_EQ(q, row < n ? quant::q5_k_quant(ref, e) : 0) << isa_name(isa) << " row " << row << " e " << e;
      }
      uint16_t d = 0, dmin = 0;
      std::memcpy(&d, meta + meta::q4k_d(L.p) + 2 * p, 2);
      std::memcpy(&dmin, meta + meta::q4k_dmin(L.p) + 2 * p, 2);
      ASSERT_EQ(d, ref.d);
      ASSERT_EQ(dmin, ref.dmin);
      for (int s = 0; s < 8; ++s) {
        uint8_t sc = 0, mn = 0;
        quant::scale_min_k4(s, ref.scales, &sc, &mn);
        ASSERT_EQ(meta[meta::q4k_scales(L.p) + s * L.p + p], row < n ? sc : 0);
        ASSERT_EQ(meta[meta::q4k_mins(L.p) + (s / 2) * 2 * L.p + 2 * p + s % 2], row < n ? mn : 0);
      }
    });
  }
}

// The weight table agrees with ggml's type table, and its lists and errors name its types.
TEST(WeightTypes, TableMatchesGgmlAndNamesItsTypes) {
  int count = 0;
  const WeightTypeTraits* rows = weight_table(&count);
  ASSERT_EQ(count, 5);
  for (int i = 0; i < count; ++i) {
    const WeightTypeTraits& r = rows[i];
    const auto info = ggml_type_info(static_cast<uint32_t>(r.type));
    ASSERT_TRUE(info.has_value()) << r.name;
    EXPECT_EQ(std::string(r.name), info->name);
    EXPECT_EQ(r.block, static_cast<int>(info->block_size)) << r.name;
    EXPECT_EQ(r.block_bytes, static_cast<int>(info->type_size)) << r.name;
    EXPECT_EQ(weight_traits(r.type), &r);
    EXPECT_EQ(weight_traits_by_name(r.name), &r);
    EXPECT_EQ(act_block(r.act), r.act == ActFormat::Q8_0 ? 32 : 256);
    EXPECT_EQ(r.block % act_block(r.act), 0) << r.name;
  }
  EXPECT_EQ(jit_type_list(), "Q4_K, Q5_K, Q6_K, Q8_0 and Q5_0");
  EXPECT_EQ(gpu_type_list(), "Q4_K, Q5_K, Q6_K, Q8_0 and Q5_0");
  for (GgmlType t : {GgmlType::F32, GgmlType::F16, GgmlType::Q4_0, GgmlType::Q3_K, GgmlType::IQ4_XS}) {
    EXPECT_EQ(weight_traits(t), nullptr) << ggml_type_name(t);
    EXPECT_FALSE(jit_supports_type(t));
    try {
      require_weight_traits(t, "tensor blk.0.attn_output.weight");
      FAIL() << ggml_type_name(t);
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()), "tensor blk.0.attn_output.weight is " + ggml_type_name(t) +
                                           ": the JIT kernels take Q4_K, Q5_K, Q6_K, Q8_0 and Q5_0");
    }
  }
  EXPECT_EQ(weight_traits_by_name("Q5_K_M"), nullptr);
}

// Every family's generator takes every weight type of the table at every row tile it plans, also the
// families this CPU cannot run (the generators are used directly: generate_kernel refuses a family the
// CPU lacks; the code is assembled, never called).
TEST(JitKernelCache, EveryTypeGeneratesOnEveryFamily) {
  int count = 0;
  const WeightTypeTraits* rows = weight_table(&count);
  for (Isa isa : {Isa::Avx2, Isa::AvxVnni, Isa::Avx512Vnni}) {
    for (int i = 0; i < count; ++i) {
      for (int64_t k : {int64_t{512}, kTwoVectorMaxK + 256}) {
        GemmDesc d;
        d.isa = isa;
        d.wtype = rows[i].type;
        d.n = 40;
        d.k = k;
        for (d.m = 1; d.m <= max_row_tile(isa, d.wtype, k); ++d.m) {
          std::unique_ptr<JitGenerator> gen;
          if (isa == Isa::Avx512Vnni) gen = std::make_unique<GemmGenerator<Xbyak::Zmm>>(d);
          else gen = std::make_unique<GemmGenerator<Xbyak::Ymm>>(d);
          ASSERT_NO_THROW(gen->create()) << d.name();
          EXPECT_GT(gen->code_size(), 100u) << d.name();
          EXPECT_EQ(gen->kernel_name(), d.name());
        }
      }
    }
  }
}

// The avx2 family's first row tile (the one that streams the weights from memory) is the prefetching variant,
// the tiles after it are not; other families keep their kernels (4+ rows prefetch anyway). The generated code
// has prefetcht0 exactly when it should (objdump), and prefetching changes no value (GemmFamily runs these plans
// against the reference dots).
TEST(JitKernelCache, OnlyTheAvx2FirstRowTilePrefetchesBelowFourRows) {
  for (GgmlType t : {GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::Q8_0, GgmlType::Q5_0}) {
    const std::vector<RowTile> tiles = plan_row_tiles(Isa::Avx2, t, 1024, 2048, 8);
    ASSERT_GE(tiles.size(), 2u);
    EXPECT_EQ(tiles[0].desc.prefetch, tiles[0].desc.m < 4) << tiles[0].desc.name();
    for (size_t i = 1; i < tiles.size(); ++i) EXPECT_FALSE(tiles[i].desc.prefetch) << tiles[i].desc.name();
    for (Isa isa : {Isa::AvxVnni, Isa::Avx512Vnni, Isa::Amx})
      for (const RowTile& tile : plan_row_tiles(isa, t, 1024, 2048, 8)) EXPECT_FALSE(tile.desc.prefetch) << tile.desc.name();
  }
  if (std::system("objdump --version >/dev/null 2>&1") != 0) GTEST_SKIP() << "objdump (binutils) is not installed";
  const std::string bin = ::testing::TempDir() + "dllm_kernel_pf_" + std::to_string(getpid()) + ".bin";
  auto prefetches = [&](const GemmDesc& d) {
    GemmGenerator<Xbyak::Ymm> gen(d);
    gen.create();
    std::ofstream(bin, std::ios::binary).write(reinterpret_cast<const char*>(gen.code()), gen.code_size());
    const dllm::test::RunResult r = dllm::test::run_program("objdump", {"-D", "-b", "binary", "-mi386:x86-64", bin});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return r.out.find("prefetcht0") != std::string::npos;
  };
  GemmDesc d;
  d.isa = Isa::Avx2, d.wtype = GgmlType::Q4_K, d.n = 40, d.k = 512;
  for (d.m = 1; d.m <= 3; ++d.m) {
    d.prefetch = false;
    EXPECT_FALSE(prefetches(d)) << d.name();
    d.prefetch = true;
    EXPECT_TRUE(prefetches(d)) << d.name();
  }
  d.wtype = GgmlType::Q8_0, d.m = 5, d.prefetch = false;
  EXPECT_TRUE(prefetches(d)) << d.name();  // 4+ rows: always
  std::remove(bin.c_str());
}

// A constant a kernel keeps in a register (the nibble masks) is loaded into it once: a register loaded from two
// constants holds only the last. Checked on the disassembly of every type's kernels on every family, so a CPU
// without the family catches it too (avx512-vnni Q5_K once loaded its single 0x0F mask register, then 0xF0
// over it). Needs objdump (binutils).
TEST(JitKernelCache, NoVectorRegisterIsLoadedFromTwoConstants) {
  if (std::system("objdump --version >/dev/null 2>&1") != 0) GTEST_SKIP() << "objdump (binutils) is not installed";
  int count = 0;
  const WeightTypeTraits* rows = weight_table(&count);
  const std::string bin = ::testing::TempDir() + "dllm_kernel_" + std::to_string(getpid()) + ".bin";
  int checked = 0;
  for (Isa isa : {Isa::Avx2, Isa::AvxVnni, Isa::Avx512Vnni}) {
    for (int i = 0; i < count; ++i) {
      GemmDesc d;
      d.isa = isa, d.wtype = rows[i].type, d.n = 40, d.k = 512;
      for (d.m = 1; d.m <= max_row_tile(isa, d.wtype, d.k); ++d.m) {
        std::unique_ptr<JitGenerator> gen;
        if (isa == Isa::Avx512Vnni) gen = std::make_unique<GemmGenerator<Xbyak::Zmm>>(d);
        else gen = std::make_unique<GemmGenerator<Xbyak::Ymm>>(d);
        ASSERT_NO_THROW(gen->create()) << d.name();
        std::ofstream(bin, std::ios::binary).write(reinterpret_cast<const char*>(gen->code()), gen->code_size());
        const dllm::test::RunResult r = dllm::test::run_program("objdump", {"-D", "-b", "binary", "-mi386:x86-64", "-Mintel", bin});
        ASSERT_EQ(r.exit_code, 0) << r.err;
        // whole-register loads from rip-relative constants: "vmovdqu32 zmm31,ZMMWORD PTR [rip+0x...]"
        std::map<std::string, int> loads;
        std::istringstream lines(r.out);
        for (std::string line; std::getline(lines, line);) {
          const size_t op = line.find("vmovdq");
          if (op == std::string::npos || line.find("[rip") == std::string::npos) continue;
          const size_t reg = line.find_first_of("yz", op + 6);
          const size_t comma = line.find(',', op);
          if (reg == std::string::npos || comma == std::string::npos || reg > comma) continue;
          ++loads[line.substr(reg, comma - reg)];
        }
        for (const auto& [reg, n] : loads) EXPECT_EQ(n, 1) << d.name() << ": " << reg << " loaded from " << n << " constants";
        ++checked;
      }
    }
  }
  std::remove(bin.c_str());
  EXPECT_GT(checked, 20);
}

TEST(JitRepack, ErrorsNameTheMatrix) {
  ThreadPool pool(1);
  std::vector<uint8_t> data(4096);
  try {
    prepare_matrix(GgmlType::Q4_0, 256, 2, data.data(), Isa::Avx2, pool, "blk.3.attn_q.weight");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("blk.3.attn_q.weight"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("Q4_0"), std::string::npos) << e.what();
  }
  try {
    prepare_matrix(GgmlType::Q6_K, 100, 2, data.data(), Isa::Avx2, pool, "output.weight");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("output.weight"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("multiple of 256"), std::string::npos) << e.what();
  }
}

TEST(JitRepack, ParallelEqualsSerialAndTimeIsReported) {
  std::mt19937 rng(11);
  for (GgmlType t : {GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::Q8_0, GgmlType::Q5_0}) {
    const int64_t n = 77, k = 512;
    const std::vector<uint8_t> w = dllm::jit::test::random_weights(t, n, k, rng);
    ThreadPool one(1), two(2);
    const QuantMatrix a = prepare_matrix(t, k, n, w.data(), Isa::Avx512Vnni, one);
    const QuantMatrix b = prepare_matrix(t, k, n, w.data(), Isa::Avx512Vnni, two);
    ASSERT_EQ(a.packed.size(), b.packed.size());
    EXPECT_EQ(std::memcmp(a.packed.data(), b.packed.data(), a.packed.size()), 0) << ggml_type_name(t);
    EXPECT_GT(b.repack_seconds, 0.0);
  }
}

TEST(JitDesc, NamesAndTiles) {
  GemmDesc d;
  d.isa = Isa::Avx512Vnni;
  d.wtype = GgmlType::Q4_K;
  d.n = 12288;
  d.k = 4096;
  d.m = 8;
  EXPECT_EQ(d.name(), "q4k_q8k_gemm_8x16__avx512vnni_k4096_n12288");
  d.isa = Isa::AvxVnni;
  d.wtype = GgmlType::Q8_0;
  d.m = 5;
  EXPECT_EQ(d.name(), "q8_0_q8_0_gemm_5x8__avxvnni_k4096_n12288");
  d.isa = Isa::Avx2;
  d.wtype = GgmlType::Q6_K;
  d.m = 3;
  EXPECT_EQ(d.name(), "q6k_q8k_gemm_3x8__avx2_k4096_n12288");
  d.prefetch = true;  // the first row tile's prefetching variant is a kernel of its own
  EXPECT_EQ(d.name(), "q6k_q8k_gemm_3x8__avx2_k4096_n12288_pf");
  d.prefetch = false;
  // Register budgets (reg_plan.h): 32 zmm allow 8 rows (Q6_K: 4 rows of two-vector panels, accumulators on
  // the stack); 16 ymm allow 3 (Q8_0: 5, accumulators on the stack), and 5 on AVX2 for Q4_K and Q6_K, whose
  // AVX2 bodies keep one dot chain per row (accumulators on the stack).
  for (GgmlType t : {GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::Q8_0}) {
    const int ymm = t == GgmlType::Q8_0 ? 5 : 3;
    EXPECT_EQ(max_row_tile(Isa::Avx512Vnni, t, 4096), t == GgmlType::Q6_K ? 4 : 8) << ggml_type_name(t);
    EXPECT_EQ(max_row_tile(Isa::Avx512Vnni, t, 12288), 8) << ggml_type_name(t);  // one-vector panels
    EXPECT_EQ(max_row_tile(Isa::AvxVnni, t, 4096), ymm) << ggml_type_name(t);
    EXPECT_EQ(max_row_tile(Isa::Avx2, t, 4096), 5) << ggml_type_name(t);
    EXPECT_EQ(max_row_tile(Isa::Amx, t, 4096), 16) << ggml_type_name(t);  // the rows of an AMX tile
  }
  d.isa = Isa::Avx512Vnni;
  d.m = 4;
  EXPECT_EQ(d.name(), "q6k_q8k_gemm_4x32__avx512vnni_k4096_n12288");
  GemmDesc q5 = d;
  q5.wtype = GgmlType::Q5_K;
  q5.m = 8;
  EXPECT_EQ(q5.name(), "q5k_q8k_gemm_8x16__avx512vnni_k4096_n12288");
  EXPECT_EQ(max_row_tile(Isa::Avx512Vnni, GgmlType::Q5_K, 4096), 8);
  EXPECT_EQ(max_row_tile(Isa::Avx2, GgmlType::Q5_K, 4096), 3);
  EXPECT_EQ(max_row_tile(Isa::AvxVnni, GgmlType::Q5_K, 4096), 3);
  d.isa = Isa::Amx;
  d.m = 16;
  EXPECT_EQ(d.name(), "q6k_q8k_gemm_16x16__amx_k4096_n12288");
  GemmDesc e = d;
  EXPECT_TRUE(e == d);
  e.k = 4352;
  EXPECT_FALSE(e == d);
  EXPECT_NE(GemmDescHash()(e), GemmDescHash()(d));
}

TEST(JitDesc, RowTilePlans) {
  auto plan = [](Isa isa, GgmlType t, int64_t rows) {
    std::string s;
    for (const RowTile& tile : plan_row_tiles(isa, t, 64, 512, rows))
      s += std::to_string(tile.r0) + ":" + std::to_string(tile.desc.m) + isa_short_name(tile.desc.isa) + " ";
    return s;
  };
  EXPECT_EQ(plan(Isa::Avx512Vnni, GgmlType::Q4_K, 20), "0:8avx512vnni 8:8avx512vnni 16:4avx512vnni ");
  EXPECT_EQ(plan(Isa::Avx2, GgmlType::Q8_0, 7), "0:5avx2 5:2avx2 ");
  EXPECT_EQ(plan(Isa::Amx, GgmlType::Q8_0, 23), "0:16amx 16:7amx ");
  // AMX Q4_K: remainders of up to 8 rows go to one avx512-vnni kernel (the same weight layout); larger ones to a
  // partial AMX tile, faster than two vnni tiles (bench/results/gemm-amx-20261207).
  EXPECT_EQ(plan(Isa::Amx, GgmlType::Q4_K, 29), "0:16amx 16:13amx ");
  EXPECT_EQ(plan(Isa::Amx, GgmlType::Q4_K, 24), "0:16amx 16:8avx512vnni ");
  EXPECT_EQ(plan(Isa::Amx, GgmlType::Q4_K, 3), "0:3avx512vnni ");
  EXPECT_EQ(plan(Isa::Amx, GgmlType::Q4_K, 9), "0:9amx ");
  EXPECT_EQ(plan(Isa::Portable, GgmlType::Q4_K, 3), "");
  EXPECT_EQ(plan(Isa::Amx, GgmlType::Q5_K, 29), "0:16amx 16:13amx ");  // Q5_K: Q4_K's rule (the same panels)
  EXPECT_EQ(plan(Isa::Amx, GgmlType::Q5_K, 21), "0:16amx 16:5avx512vnni ");
  // Q5_0 has no AMX body: its matrices are prepared for avx512-vnni (prepare_matrix) and never planned on AMX.
  ThreadPool pool(1);
  std::vector<uint8_t> q5(16 * 16 * 22);
  EXPECT_EQ(prepare_matrix(GgmlType::Q5_0, 512, 16, q5.data(), Isa::Amx, pool).isa, Isa::Avx512Vnni);
  std::vector<uint8_t> q5k(2 * 176 * 16);
  EXPECT_EQ(prepare_matrix(GgmlType::Q5_K, 512, 16, q5k.data(), Isa::Amx, pool).isa, Isa::Amx);
}

TEST(JitKernelCache, GeneratesOncePerDescriptor) {
  const Isa isa = cpu_features().best();
  if (isa == Isa::Portable) GTEST_SKIP() << "no JIT family on this CPU";
  KernelCache cache;
  GemmDesc d;
  d.isa = isa;
  d.wtype = GgmlType::Q6_K;
  d.n = 40;
  d.k = 512;
  d.m = 2;
  std::vector<std::shared_ptr<const Kernel>> got(8);
  std::vector<std::thread> threads;
  for (int i = 0; i < 8; ++i) threads.emplace_back([&, i] { got[i] = cache.get(d); });
  for (auto& t : threads) t.join();
  for (int i = 1; i < 8; ++i) EXPECT_EQ(got[i].get(), got[0].get());
  EXPECT_EQ(cache.generations(), 1);
  EXPECT_EQ(got[0]->name(), d.name());
  EXPECT_GT(got[0]->code_size(), 100u);
  d.m = 1;
  EXPECT_NE(cache.get(d).get(), got[0].get());
  EXPECT_EQ(cache.generations(), 2);
  EXPECT_EQ(cache.kernels().size(), 2u);
}

TEST(JitKernelCache, FailureCarriesTheKernelNameAndIsRemembered) {
  const Isa isa = cpu_features().best();
  if (isa == Isa::Portable) GTEST_SKIP() << "no JIT family on this CPU";
  KernelCache cache;
  GemmDesc d;
  d.isa = isa;
  d.wtype = GgmlType::Q4_K;
  d.n = 16;
  d.k = 256;
  d.m = 40;  // far more rows than registers
  for (int attempt = 0; attempt < 2; ++attempt) {
    try {
      cache.get(d);
      FAIL() << "expected an error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("cannot generate kernel " + d.name()), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(cache.generations(), 1);
  EXPECT_TRUE(cache.kernels().empty());
}

// Kernels meant for CPUs without AVX-512 must not contain EVEX instructions: in 64-bit code every
// instruction whose first byte is 0x62 is EVEX-encoded (objdump prints EVEX ymm forms like VEX ones).
// Checked on objdump's disassembly; skipped where objdump is not installed.
TEST(JitKernelCache, YmmFamiliesUseNoEvex) {
  if (std::system("objdump --version > /dev/null 2>&1") != 0) GTEST_SKIP() << "objdump not installed";
  for (Isa isa : {Isa::Avx2, Isa::AvxVnni}) {
    if (!cpu_features().supports(isa)) continue;
    for (GgmlType t : {GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::Q8_0}) {
      GemmDesc d;
      d.isa = isa;
      d.wtype = t;
      d.n = 20;
      d.k = 512;
      d.m = max_row_tile(isa, t, d.k);
      const auto k = generate_kernel(d);
      const std::string bin = ::testing::TempDir() + "/" + d.name() + ".bin";
      std::ofstream(bin, std::ios::binary).write(reinterpret_cast<const char*>(k->code()), k->code_size());
      const std::string txt = bin + ".txt";
      ASSERT_EQ(std::system(("objdump -D -b binary -mi386:x86-64 " + bin + " > " + txt).c_str()), 0);
      const std::string dis = dllm::test::read_file(txt);
      EXPECT_NE(dis.find(isa == Isa::Avx2 ? "vpmaddubsw" : "vpdpbusd"), std::string::npos) << d.name();
      for (const char* bad : {"zmm", "{1to", "%k1", "ymm16", "ymm31"})
        EXPECT_EQ(dis.find(bad), std::string::npos) << d.name() << " contains " << bad;
      std::istringstream lines(dis);
      std::string line;
      int instructions = 0;
      while (std::getline(lines, line)) {
        // "   1f:\t62 f2 75 28 50 c2 \tvpdpbusd ..." : the bytes are the second tab-separated field.
        const size_t t1 = line.find('\t');
        if (t1 == std::string::npos || line.find(':') > t1) continue;
        ++instructions;
        EXPECT_NE(line.compare(t1 + 1, 3, "62 "), 0) << d.name() << ": EVEX instruction: " << line;
      }
      EXPECT_GT(instructions, 50) << d.name();
      if (isa == Isa::Avx2) {
        EXPECT_EQ(dis.find("vpdpbusd"), std::string::npos) << d.name();
      }
      std::remove(bin.c_str());
      std::remove(txt.c_str());
    }
  }
}

TEST(JitIsa, EnvironmentCapsTheDefaultFamily) {
  const char* old = std::getenv("DLLM_ISA");
  const std::string saved = old ? old : "";
  for (Isa isa : cpu_features().supported()) {
    setenv("DLLM_ISA", isa_name(isa), 1);
    EXPECT_EQ(default_isa(), isa);
  }
  setenv("DLLM_ISA", "", 1);
  EXPECT_EQ(default_isa(), cpu_features().best());
  setenv("DLLM_ISA", "mmx", 1);
  EXPECT_THROW(default_isa(), Error);
  if (old) {
    setenv("DLLM_ISA", saved.c_str(), 1);
  } else {
    unsetenv("DLLM_ISA");
  }
}
