// Weight repacking for the GPU GEMM (weight_pack.h). The fragment addressing here is the mirror image of
// the loads in kernels/gemm.cuh: lane 4g+t of an 8-column tile holds column g's values k = 4t..4t+3
// (first word) and 16+4t..16+4t+3 (second word) of a 32-value block.
#include "jit/cuda/weight_pack.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "common/error.h"
#include "jit/cuda/kernels/params.cuh"
#include "model/quant.h"

namespace dllm::jit::cuda {

namespace {

// The k-blocks of a Q8_0 / Q5_0 row on the device: rounded up to an even count (records hold two).
int64_t kbw_of(const PackedLayout& L) { return (L.k / 32 + 1) / 2 * 2; }

// Q8_0: records [kb/2][lane] of 16 bytes, words (kb%2)*2 + (kk>=16); lane 4 col + (kk%16)/4.
size_t byte_offset(int64_t kb, int col, int kk) {
  const int lane = col * 4 + (kk % 16) / 4;
  const int word = static_cast<int>(kb % 2) * 2 + kk / 16;
  return (static_cast<size_t>(kb / 2) * 32 + static_cast<size_t>(lane)) * 16 + static_cast<size_t>(word) * 4 +
         static_cast<size_t>(kk % 4);
}
// Q5_0 nibbles: records [kb/2][lane] of 8 bytes, word kb%2, byte kk%4, high nibble for kk >= 16.
size_t nibble_offset(int64_t kb, int col, int kk) {
  const int lane = col * 4 + (kk % 16) / 4;
  return (static_cast<size_t>(kb / 2) * 32 + static_cast<size_t>(lane)) * 8 + static_cast<size_t>(kb % 2) * 4 +
         static_cast<size_t>(kk % 4);
}
// Q5_0 fifth bits (after kbw * 128 bytes of nibbles): records [kb/2][lane] of 2 bytes, byte kb%2, bit kk%4 (+4 for
// kk >= 16).
size_t bit_offset(int64_t kbw, int64_t kb, int col, int kk) {
  const int lane = col * 4 + (kk % 16) / 4;
  return static_cast<size_t>(kbw) * 128 + (static_cast<size_t>(kb / 2) * 32 + static_cast<size_t>(lane)) * 2 +
         static_cast<size_t>(kb % 2);
}
// The f16 d of (kb, col), after the quants.
size_t d_offset(const PackedLayout& L, int64_t kb, int col) {
  return static_cast<size_t>(kbw_of(L)) * (L.format == WeightFormat::Q5_0 ? 160 : 256) +
         (static_cast<size_t>(kb) * 8 + static_cast<size_t>(col)) * 2;
}

template <class Block>
Block block_at(const uint8_t* row, int64_t i) {
  Block b;
  std::memcpy(&b, row + static_cast<size_t>(i) * sizeof(Block), sizeof(Block));
  return b;
}

void pack_column(const gguf::TensorInfo& t, const PackedLayout& L, const uint8_t* row, int col, uint8_t* tq) {
  const int64_t kbw = kbw_of(L);
  for (int64_t kb = 0; kb < L.k / 32; ++kb) {
    uint16_t d = 0;
    switch (L.format) {
      case WeightFormat::Q8_0: {
        const auto b = block_at<quant::BlockQ8_0>(row, kb);
        d = b.d;
        for (int kk = 0; kk < 32; ++kk) tq[byte_offset(kb, col, kk)] = static_cast<uint8_t>(b.qs[kk]);
        break;
      }
      case WeightFormat::Q5_0: {
        const auto b = block_at<quant::BlockQ5_0>(row, kb);
        d = b.d;
        for (int kk = 0; kk < 32; ++kk) {
          const int q = quant::q5_0_quant(b, kk);  // 0..31, the value q - 16
          tq[nibble_offset(kb, col, kk)] |= static_cast<uint8_t>((q & 0xF) << (kk >= 16 ? 4 : 0));
          tq[bit_offset(kbw, kb, col, kk)] |= static_cast<uint8_t>((q >> 4) << (kk % 4 + (kk >= 16 ? 4 : 0)));
        }
        break;
      }
      default: throw Error("tensor " + std::string(t.name) + ": no GPU packing for " + ggml_type_name(L.format));
    }
    std::memcpy(tq + d_offset(L, kb, col), &d, 2);
  }
}

}  // namespace

bool PackedLayout::tiled() const { return require_weight_traits(format, "GPU weight format").gpu_tiled; }

size_t PackedLayout::quant_bytes_per_tile() const {
  if (tiled()) return 8 * static_cast<size_t>(k / 256 * tc_block_bytes(static_cast<int>(format)));
  return static_cast<size_t>(kbw_of(*this)) * (format == WeightFormat::Q5_0 ? 176 : 272);  // 8 x 22 or 8 x 34
}

size_t PackedLayout::scales_per_tile() const {
  return tiled() && format == WeightFormat::Q6_K ? static_cast<size_t>(k / 256) * 8 : 0;  // Q6_K's d plane
}

PackedLayout packed_layout(const gguf::TensorInfo& t) {
  PackedLayout L;
  if (t.n_dims != 2) throw Error("tensor " + std::string(t.name) + " is not a matrix");
  if (!weight_format_of(t.type(), &L.format)) {
    throw Error("tensor " + std::string(t.name) + " is " + ggml_type_name(t.type_id) +
                ": the GPU backend has matrix kernels for " + gpu_type_list() + " (run with --device cpu)");
  }
  L.n = t.ne[1];
  L.k = t.ne[0];
  if (L.n % 8 != 0) {
    throw Error("tensor " + std::string(t.name) + " has " + std::to_string(L.n) +
                " rows: the GPU matrix kernels need a multiple of 8 (run with --device cpu)");
  }
  L.ntiles = padded_ntiles(L.n);
  return L;
}

void pack_tiles(const gguf::TensorInfo& t, const PackedLayout& L, int64_t tile0, int64_t tile1, uint8_t* quants,
                float* scales) {
  const size_t qpt = L.quant_bytes_per_tile(), spt = L.scales_per_tile();
  const size_t tiles = static_cast<size_t>(tile1 - tile0);
  const uint64_t row_bytes = t.row_bytes();
  if (L.format == WeightFormat::Q4_K || L.format == WeightFormat::Q5_K) {  // the file's rows; padding columns zero
    const int64_t j0 = tile0 * 8, j1 = std::min(tile1 * 8, L.n);
    const size_t have = j1 > j0 ? static_cast<size_t>(j1 - j0) * row_bytes : 0;
    if (have) std::memcpy(quants, t.data + static_cast<uint64_t>(j0) * row_bytes, have);
    std::memset(quants + have, 0, qpt * tiles - have);
    return;
  }
  std::memset(quants, 0, qpt * tiles);
  if (spt) std::memset(scales, 0, spt * tiles * sizeof(float));
  if (L.format == WeightFormat::Q6_K) {  // per column and super-block: scales | ql | qh; d into the plane [tile][sb][8]
    const int64_t sbs = L.k / 256;
    for (int64_t j = tile0 * 8; j < std::min(tile1 * 8, L.n); ++j) {
      const uint8_t* row = t.data + static_cast<uint64_t>(j) * row_bytes;
      const size_t i = static_cast<size_t>(j / 8 - tile0);
      for (int64_t sb = 0; sb < sbs; ++sb) {
        const auto b = block_at<quant::BlockQ6_K>(row, sb);
        uint8_t* rec = quants + static_cast<size_t>(j - tile0 * 8) * (qpt / 8) + static_cast<size_t>(sb) * 208;
        std::memcpy(rec, b.scales, 16);
        std::memcpy(rec + 16, b.ql, 128);
        std::memcpy(rec + 144, b.qh, 64);
        scales[i * spt + static_cast<size_t>(sb) * 8 + static_cast<size_t>(j % 8)] = quant::fp16_to_f32(b.d);
      }
    }
    return;
  }
  for (int64_t tile = tile0; tile < tile1; ++tile) {
    const size_t i = static_cast<size_t>(tile - tile0);
    for (int col = 0; col < 8; ++col) {
      const int64_t j = tile * 8 + col;
      if (j >= L.n) break;
      pack_column(t, L, t.data + static_cast<uint64_t>(j) * row_bytes, col, quants + i * qpt);
    }
  }
}

void packed_row(const PackedLayout& L, const uint8_t* quants, const float* scales, int64_t j, float* out) {
  if (L.tiled()) {  // back to the GGUF's blocks, then the reference decoder
    const size_t col_bytes = L.quant_bytes_per_tile() / 8;
    const uint8_t* rec = quants + static_cast<size_t>(j) * col_bytes;
    std::vector<uint8_t> row(rec, rec + col_bytes);
    if (L.format == WeightFormat::Q6_K) {
      row.assign(static_cast<size_t>(L.k / 256) * sizeof(quant::BlockQ6_K), 0);
      for (int64_t sb = 0; sb < L.k / 256; ++sb) {
        quant::BlockQ6_K b;
        std::memcpy(b.scales, rec + sb * 208, 16);
        std::memcpy(b.ql, rec + sb * 208 + 16, 128);
        std::memcpy(b.qh, rec + sb * 208 + 144, 64);
        b.d = quant::f32_to_fp16(scales[static_cast<size_t>(j / 8) * L.scales_per_tile() + sb * 8 + j % 8]);
        std::memcpy(row.data() + sb * sizeof b, &b, sizeof b);
      }
    }
    quant::dequantize_row(L.format, row.data(), out, L.k);
    return;
  }
  const int col = static_cast<int>(j % 8);
  const uint8_t* tq = quants + static_cast<size_t>(j / 8) * L.quant_bytes_per_tile();
  for (int64_t c = 0; c < L.k; ++c) {
    const int64_t kb = c / 32;
    const int kk = static_cast<int>(c % 32);
    uint16_t dh = 0;
    std::memcpy(&dh, tq + d_offset(L, kb, col), 2);
    const float d = quant::fp16_to_f32(dh);
    if (L.format == WeightFormat::Q8_0) {
      out[c] = d * static_cast<float>(static_cast<int8_t>(tq[byte_offset(kb, col, kk)]));
      continue;
    }
    const int nib = (tq[nibble_offset(kb, col, kk)] >> (kk >= 16 ? 4 : 0)) & 0xF;
    const int bit = (tq[bit_offset(kbw_of(L), kb, col, kk)] >> (kk % 4 + (kk >= 16 ? 4 : 0))) & 1;
    out[c] = d * static_cast<float>((nib | bit << 4) - 16);
  }
}

}  // namespace dllm::jit::cuda
