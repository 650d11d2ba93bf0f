// Weight repacking into the kernels' interleaved panels (layout described in repack.h), panels in parallel.
#include "jit/repack.h"

#include <immintrin.h>

#include <chrono>
#include <cstring>
#include <string>
#include <type_traits>

#include "common/error.h"
#include "model/quant.h"
#include "common/thread_pool.h"

namespace dllm::jit {

namespace {

using quant::BlockQ6_K;
using quant::BlockQ8_0;

void put_u16(uint8_t* dst, uint16_t v) { std::memcpy(dst, &v, 2); }

// Byte b of the dword of row p in a vector at `vec`.
uint8_t& vbyte(uint8_t* vec, int p, int b) { return vec[4 * p + b]; }

// One Q4_K or Q5_K block column of a panel: rows[p] is row p's block (null for padding rows). Both keep
// Q4_K's nibble vectors and meta record; Q5_K adds its high-bit vectors after the nibbles.
template <class Block>
void pack_scale_min(const void* const* rows, int P, uint8_t* quant, uint8_t* meta) {
  constexpr bool q5 = std::is_same_v<Block, quant::BlockQ5_K>;
  constexpr int quant_bytes = q5 ? 160 : 128;
  std::memset(quant, 0, quant_bytes * P);
  std::memset(meta, 0, 20 * P);
  uint8_t q[256];
  for (int p = 0; p < P; ++p) {
    if (!rows[p]) continue;
    const auto& b = *static_cast<const Block*>(rows[p]);
    if constexpr (q5) unpack_q5_k(&b, q);
    else unpack_q4_k(&b, q);
    for (int t = 0; t < 4; ++t)
      for (int j = 0; j < 8; ++j)
        for (int e = 0; e < 4; ++e) {
          const uint8_t lo = q[64 * t + 4 * j + e], hi = q[64 * t + 32 + 4 * j + e];
          vbyte(quant + (8 * t + j) * 4 * P, p, e) = static_cast<uint8_t>((lo & 15) | (hi & 15) << 4);
          if constexpr (q5)
            vbyte(quant + (32 + j) * 4 * P, p, e) |= static_cast<uint8_t>((lo >> 4) << (2 * t) | (hi >> 4) << (2 * t + 1));
        }
    put_u16(meta + meta::q4k_d(P) + 2 * p, b.d);
    put_u16(meta + meta::q4k_dmin(P) + 2 * p, b.dmin);
    for (int s = 0; s < 8; ++s) {
      uint8_t sc = 0, m = 0;
      quant::scale_min_k4(s, b.scales, &sc, &m);
      meta[meta::q4k_scales(P) + s * P + p] = sc;
      meta[meta::q4k_mins(P) + (s / 2) * 2 * P + 2 * p + (s % 2)] = m;
    }
  }
}

// signed_q: bytes hold q - 32 (AMX, signed x signed) instead of q.
void pack_q6_k(const void* const* rows, int P, bool signed_q, uint8_t* quant, uint8_t* meta) {
  std::memset(quant, 0, 256 * P);
  std::memset(meta, 0, 18 * P);
  uint8_t q[256];
  for (int p = 0; p < P; ++p) {
    if (!rows[p]) continue;
    const auto& b = *static_cast<const BlockQ6_K*>(rows[p]);
    unpack_q6_k(&b, q);
    for (int g = 0; g < 64; ++g)
      for (int e = 0; e < 4; ++e) vbyte(quant + g * 4 * P, p, e) = static_cast<uint8_t>(q[4 * g + e] - (signed_q ? 32 : 0));
    put_u16(meta + meta::q6k_d(P) + 2 * p, b.d);
    for (int u = 0; u < 16; ++u) meta[meta::q6k_scales(P) + u * P + p] = static_cast<uint8_t>(b.scales[u]);
  }
}

void pack_q8_0(const void* const* rows, int P, bool bias128, uint8_t* quant, uint8_t* meta) {
  // Padding rows: weight 0 (stored as 0x80 when biased) and d = 0.
  std::memset(quant, bias128 ? 0x80 : 0, 32 * P);
  std::memset(meta, 0, 2 * P);
  int8_t q[32];
  for (int p = 0; p < P; ++p) {
    if (!rows[p]) continue;
    const auto& b = *static_cast<const BlockQ8_0*>(rows[p]);
    std::memcpy(q, b.qs, 32);
    for (int g = 0; g < 8; ++g)
      for (int e = 0; e < 4; ++e)
        vbyte(quant + g * 4 * P, p, e) = static_cast<uint8_t>(q[4 * g + e]) ^ (bias128 ? 0x80 : 0);
    put_u16(meta + meta::q8_0_d(P) + 2 * p, b.d);
  }
}

// Q5_0: ggml's nibble bytes as they are (element j in the low nibble of qs[j], j + 16 in the high one), in
// four vectors, then one vector of fifth bits in Q5_K's arrangement (bit 2g of byte e: element 4g + e, bit
// 2g + 1: element 16 + 4g + e). Padding rows: q = 0 and d = 0.
void pack_q5_0(const void* const* rows, int P, uint8_t* quant, uint8_t* meta) {
  std::memset(quant, 0, 20 * P);
  std::memset(meta, 0, 2 * P);
  for (int p = 0; p < P; ++p) {
    if (!rows[p]) continue;
    const auto& b = *static_cast<const quant::BlockQ5_0*>(rows[p]);
    uint32_t qh;  // bit j: the fifth bit of element j
    std::memcpy(&qh, b.qh, 4);
    for (int e = 0; e < 4; ++e) {
      uint8_t h = 0;
      for (int g = 0; g < 4; ++g) {
        vbyte(quant + g * 4 * P, p, e) = b.qs[4 * g + e];
        h = static_cast<uint8_t>(h | ((qh >> (4 * g + e)) & 1) << (2 * g) | ((qh >> (16 + 4 * g + e)) & 1) << (2 * g + 1));
      }
      vbyte(quant + 4 * 4 * P, p, e) = h;
    }
    put_u16(meta + meta::q8_0_d(P) + 2 * p, b.d);
  }
}

}  // namespace

void unpack_q4_k(const void* block, uint8_t q[256]) {
  const auto& b = *static_cast<const quant::BlockQ4_K*>(block);
  for (int c = 0; c < 4; ++c)
    for (int l = 0; l < 32; ++l) {
      q[64 * c + l] = b.qs[32 * c + l] & 15;
      q[64 * c + 32 + l] = b.qs[32 * c + l] >> 4;
    }
}

void unpack_q5_k(const void* block, uint8_t q[256]) {
  const auto& b = *static_cast<const quant::BlockQ5_K*>(block);
  for (int c = 0; c < 4; ++c)  // quant::q5_k_quant, a chunk at a time
    for (int l = 0; l < 32; ++l) {
      q[64 * c + l] = static_cast<uint8_t>((b.qs[32 * c + l] & 15) | ((b.qh[l] >> (2 * c)) & 1) << 4);
      q[64 * c + 32 + l] = static_cast<uint8_t>((b.qs[32 * c + l] >> 4) | ((b.qh[l] >> (2 * c + 1)) & 1) << 4);
    }
}

void unpack_q5_0(const void* block, int8_t q[32]) {
  const auto& b = *static_cast<const quant::BlockQ5_0*>(block);
  uint32_t qh;  // bit j: the fifth bit of element j
  std::memcpy(&qh, b.qh, 4);
  for (int j = 0; j < 16; ++j) {
    q[j] = static_cast<int8_t>(((b.qs[j] & 15) | ((qh >> j) & 1) << 4) - 16);
    q[j + 16] = static_cast<int8_t>(((b.qs[j] >> 4) | ((qh >> (j + 16)) & 1) << 4) - 16);
  }
}

void unpack_q6_k(const void* block, uint8_t q[256]) {
  const auto& b = *static_cast<const BlockQ6_K*>(block);
  for (int h = 0; h < 2; ++h) {
    const uint8_t* ql = b.ql + 64 * h;
    const uint8_t* qh = b.qh + 32 * h;
    uint8_t* out = q + 128 * h;
    for (int l = 0; l < 32; ++l) {
      out[l] = static_cast<uint8_t>((ql[l] & 15) | ((qh[l] >> 0) & 3) << 4);
      out[l + 32] = static_cast<uint8_t>((ql[l + 32] & 15) | ((qh[l] >> 2) & 3) << 4);
      out[l + 64] = static_cast<uint8_t>((ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4);
      out[l + 96] = static_cast<uint8_t>((ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4);
    }
  }
}

PackedLayout packed_layout(Isa isa, GgmlType wtype, int64_t n, int64_t k) {
  const WeightTypeTraits* w = weight_traits(wtype);
  if (!w) throw Error("no JIT kernel for " + ggml_type_name(wtype) + " weights (supported: " + jit_type_list() + ")");
  PackedLayout l;
  l.isa = isa;
  l.wtype = wtype;
  l.p = panel_rows(isa, wtype, k);
  l.n = n;
  l.k = k;
  l.block = w->block;
  if (k <= 0 || k % l.block != 0 || n <= 0)
    throw Error("cannot repack " + ggml_type_name(wtype) + " matrix of " + std::to_string(n) + " rows x " +
                std::to_string(k) + ": row length must be a positive multiple of " + std::to_string(l.block));
  l.nblocks = k / l.block;
  l.quant_bytes = static_cast<int64_t>(w->quant_bytes) * l.p;
  l.meta_bytes = static_cast<int64_t>(w->meta_bytes) * l.p;
  l.panel_bytes = (l.nblocks * (l.quant_bytes + l.meta_bytes) + 63) / 64 * 64;
  l.n_panels = (n + l.p - 1) / l.p;
  return l;
}

size_t QuantMatrix::src_row_bytes() const {
  const auto info = ggml_type_info(static_cast<uint32_t>(type));
  return static_cast<size_t>(k / info->block_size * info->type_size);
}

QuantMatrix prepare_matrix(GgmlType type, int64_t k, int64_t n, const void* data, Isa isa, ThreadPool& pool,
                           const std::string& what) {
  const auto t0 = std::chrono::steady_clock::now();
  isa = matrix_family(isa, type);
  QuantMatrix m;
  m.type = type;
  m.isa = isa;
  m.n = n;
  m.k = k;
  m.src = static_cast<const uint8_t*>(data);
  try {
    m.layout = packed_layout(isa == Isa::Portable ? Isa::Avx2 : isa, type, n, k);
  } catch (const Error& e) {
    throw Error(what + ": " + e.what());
  }
  if (isa == Isa::Portable) return m;  // the reference path reads the ggml rows directly

  const PackedLayout& L = m.layout;
  m.packed.resize(static_cast<size_t>(L.total_bytes()));
  const size_t row_bytes = m.src_row_bytes();
  const bool bias128 = isa == Isa::AvxVnni || isa == Isa::Avx512Vnni;
  const bool signed_q6 = isa == Isa::Amx;
  pool.parallel_for(L.n_panels, [&](int64_t panel, int) {
    uint8_t* base = m.packed.data() + panel * L.panel_bytes;
    std::memset(base + L.nblocks * (L.quant_bytes + L.meta_bytes), 0,
                L.panel_bytes - L.nblocks * (L.quant_bytes + L.meta_bytes));
    const void* rows[32] = {};
    for (int64_t blk = 0; blk < L.nblocks; ++blk) {
      for (int p = 0; p < L.p; ++p) {
        const int64_t row = panel * L.p + p;
        rows[p] = row < n ? m.src + row * row_bytes + blk * (row_bytes / L.nblocks) : nullptr;
      }
      uint8_t* quant = base + blk * L.quant_bytes;
      uint8_t* meta = base + L.meta_offset() + blk * L.meta_bytes;
      switch (type) {
        case GgmlType::Q4_K: pack_scale_min<quant::BlockQ4_K>(rows, L.p, quant, meta); break;
        case GgmlType::Q5_K: pack_scale_min<quant::BlockQ5_K>(rows, L.p, quant, meta); break;
        case GgmlType::Q6_K: pack_q6_k(rows, L.p, signed_q6, quant, meta); break;
        case GgmlType::Q8_0: pack_q8_0(rows, L.p, bias128, quant, meta); break;
        case GgmlType::Q5_0: pack_q5_0(rows, L.p, quant, meta); break;
        default: throw Error(what + ": no repack for " + ggml_type_name(type));  // packed_layout refused it
      }
    }
  });
  m.repack_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return m;
}

namespace {

// y[16u + j] = ds[u] * (q - 32) for the bytes q of a packed Q6_K block (signed_q: the bytes are q - 32). The
// same products in both versions (an int8 converts to float exactly).
void q6_k_values_scalar(const uint8_t* q, const float* ds, bool signed_q, float* y) {
  for (int j = 0; j < 256; ++j)
    y[j] = ds[j / 16] * static_cast<float>(signed_q ? static_cast<int>(static_cast<int8_t>(q[j])) : static_cast<int>(q[j]) - 32);
}

__attribute__((target("avx2"))) void q6_k_values_avx2(const uint8_t* q, const float* ds, bool signed_q, float* y) {
  const __m256i off = _mm256_set1_epi32(signed_q ? 0 : 32);
  for (int j = 0; j < 256; j += 8) {
    const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + j));
    const __m256i v = _mm256_sub_epi32(signed_q ? _mm256_cvtepi8_epi32(b) : _mm256_cvtepu8_epi32(b), off);
    _mm256_storeu_ps(y + j, _mm256_mul_ps(_mm256_set1_ps(ds[j / 16]), _mm256_cvtepi32_ps(v)));
  }
}

void q6_k_values(const uint8_t* q, const float* ds, bool signed_q, float* y) {
  static const bool avx2 = __builtin_cpu_supports("avx2");
  avx2 ? q6_k_values_avx2(q, ds, signed_q, y) : q6_k_values_scalar(q, ds, signed_q, y);
}

}  // namespace

bool can_unpack_rows(GgmlType type) { return type == GgmlType::Q6_K || type == GgmlType::Q8_0; }

void unpack_rows(const QuantMatrix& m, int64_t row0, int64_t n, float* out, int64_t stride) {
  const PackedLayout& L = m.layout;
  if (!can_unpack_rows(m.type) || m.packed.size() == 0)
    throw Error(std::string("unpack_row: no row decoder for packed ") + ggml_type_name(m.type) + " (" + isa_name(m.isa) + ")");
  if (n < 0 || row0 < 0 || row0 + n > m.n)
    throw Error("unpack_row: rows " + std::to_string(row0) + " to " + std::to_string(row0 + n) + " of " +
                std::to_string(m.n));
  const int P = L.p;
  const bool biased = m.isa == Isa::AvxVnni || m.isa == Isa::Avx512Vnni;  // Q8_0 bytes: q + 128 on the VNNI families
  thread_local std::vector<uint8_t> q;  // row i's quants of one block: q[i * 256 ...]
  thread_local std::vector<float> ds;   // row i's 16 Q6_K sub-block scales times d: ds[i * 16 ...]
  thread_local std::vector<float> dv;   // row i's d (fp16 [P] leads both meta records)
  q.resize(static_cast<size_t>(P) * 256);
  ds.resize(static_cast<size_t>(P) * 16);
  dv.resize(static_cast<size_t>(P));
  uint8_t* const qb = q.data();
  float* const dsb = ds.data();
  float* const d = dv.data();
  // Panel by panel, block by block: a panel's quant groups interleave its rows (group g of row p: 4 bytes at
  // g * 4P + 4p) and so do its scales (scale u of row p at u * P + p), so the rows of one panel are gathered
  // together, the bytes read in order.
  for (int64_t r = row0; r < row0 + n;) {
    const int p0 = static_cast<int>(r % P), np = static_cast<int>(std::min<int64_t>(P - p0, row0 + n - r));
    const uint8_t* panel = m.packed.data() + r / P * L.panel_bytes;
    for (int64_t blk = 0; blk < L.nblocks; ++blk) {
      const uint8_t* quant = panel + blk * L.quant_bytes;
      const uint8_t* meta = panel + L.meta_offset() + blk * L.meta_bytes;
      for (int g = 0; g < L.block / 4; ++g)
        for (int i = 0; i < np; ++i)
          std::memcpy(qb + i * 256 + 4 * g, quant + g * 4 * P + 4 * (p0 + i), 4);
      for (int i = 0; i < np; ++i) {
        uint16_t h;
        std::memcpy(&h, meta + 2 * (p0 + i), 2);
        d[i] = quant::fp16_to_f32(h);
      }
      if (m.type == GgmlType::Q6_K) {
        const int8_t* sc = reinterpret_cast<const int8_t*>(meta + meta::q6k_scales(P)) + p0;
        for (int u = 0; u < 16; ++u)
          for (int i = 0; i < np; ++i) dsb[i * 16 + u] = d[i] * static_cast<float>(sc[u * P + i]);
      }
      for (int i = 0; i < np; ++i) {
        const uint8_t* qi = qb + i * 256;
        float* y = out + (r - row0 + i) * stride + blk * L.block;
        if (m.type == GgmlType::Q8_0) {  // dequant_q8_0: q * d
          for (int j = 0; j < 32; ++j) {
            const int v = biased ? static_cast<int>(qi[j]) - 128 : static_cast<int>(static_cast<int8_t>(qi[j]));
            y[j] = static_cast<float>(v) * d[i];
          }
        } else {  // Q6_K: (d * scale) * (q - 32); AMX bytes hold q - 32, the others q
          q6_k_values(qi, dsb + i * 16, m.isa == Isa::Amx, y);
        }
      }
    }
    r += np;
  }
}

void unpack_row(const QuantMatrix& m, int64_t row, float* out) { unpack_rows(m, row, 1, out, 0); }

}  // namespace dllm::jit
