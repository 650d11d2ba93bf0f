// Weight repacking for the GPU GEMM (weight_pack.h): the records kernels/gemm_tc.cuh reads, one column after another.
#include "jit/cuda/weight_pack.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "common/error.h"
#include "jit/cuda/kernels/params.cuh"
#include "model/quant.h"

namespace dllm::jit::cuda {

namespace {

template <class Block>
Block block_at(const uint8_t* row, int64_t i) {
  Block b;
  std::memcpy(&b, row + static_cast<size_t>(i) * sizeof(Block), sizeof(Block));
  return b;
}

// Q8_0 / Q5_0 block kb of a column: its record (params.cuh tc_block_bytes: eight blocks a record) and its place there.
template <class Byte>
Byte* record_of(const PackedLayout& L, Byte* column, int64_t kb) {
  return column + static_cast<size_t>(kb / 8) * static_cast<size_t>(tc_block_bytes(static_cast<int>(L.format)));
}
// Q5_0's fifth bits: the byte of block i (of its record) that lane t of an mma B fragment reads, and the bit of value kk
// there: bits 0-3 = values 4t..4t+3, bits 4-7 = values 16 + 4t..; word t of each 16-byte half holds four blocks' bytes.
size_t fifth_bit_byte(int i, int kk) { return 16 + 16 * static_cast<size_t>(i >> 2) + 4 * static_cast<size_t>((kk % 16) / 4) + (i & 3); }
int fifth_bit(int kk) { return kk % 4 + (kk >= 16 ? 4 : 0); }

// One column of a Q8_0 / Q5_0 matrix: per block, its f16 d at 2i, then Q8_0's quants at 16 + 32i; Q5_0's fifth bits
// (fifth_bit_byte) and its nibbles at 48 + 16i, as the file stores them (value kk and kk + 16 share byte kk).
void pack_column(const gguf::TensorInfo& t, const PackedLayout& L, const uint8_t* row, uint8_t* column) {
  for (int64_t kb = 0; kb < L.k / 32; ++kb) {
    uint8_t* rec = record_of(L, column, kb);
    const int i = static_cast<int>(kb % 8);
    switch (L.format) {
      case WeightFormat::Q8_0: {
        const auto b = block_at<quant::BlockQ8_0>(row, kb);
        std::memcpy(rec + 2 * i, &b.d, 2);
        std::memcpy(rec + 16 + 32 * i, b.qs, 32);
        break;
      }
      case WeightFormat::Q5_0: {
        const auto b = block_at<quant::BlockQ5_0>(row, kb);
        std::memcpy(rec + 2 * i, &b.d, 2);
        std::memcpy(rec + 48 + 16 * i, b.qs, 16);
        for (int kk = 0; kk < 32; ++kk) {
          const int q = quant::q5_0_quant(b, kk);  // 0..31, the value q - 16
          rec[fifth_bit_byte(i, kk)] |= static_cast<uint8_t>((q >> 4) << fifth_bit(kk));
        }
        break;
      }
      default: throw Error("tensor " + std::string(t.name) + ": no GPU packing for " + ggml_type_name(L.format));
    }
  }
}

}  // namespace

size_t PackedLayout::quant_bytes_per_tile() const {
  return 8 * static_cast<size_t>(tc_column_bytes(static_cast<int>(format), static_cast<int>(k)));
}

size_t PackedLayout::scales_per_tile() const {
  return format == WeightFormat::Q6_K ? static_cast<size_t>(k / 256) * 8 : 0;  // Q6_K's d plane
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
  if (L.k > (1 << 24)) throw Error("tensor " + std::string(t.name) + " has rows of " + std::to_string(L.k) +
                                   " values: too long for the GPU matrix kernels (run with --device cpu)");
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
  for (int64_t j = tile0 * 8; j < std::min(tile1 * 8, L.n); ++j)
    pack_column(t, L, t.data + static_cast<uint64_t>(j) * row_bytes, quants + static_cast<size_t>(j - tile0 * 8) * (qpt / 8));
}

void packed_row(const PackedLayout& L, const uint8_t* quants, const float* scales, int64_t j, float* out) {
  const size_t col_bytes = L.quant_bytes_per_tile() / 8;
  const uint8_t* rec = quants + static_cast<size_t>(j) * col_bytes;
  if (L.format == WeightFormat::Q8_0 || L.format == WeightFormat::Q5_0) {  // the records' integers and d
    for (int64_t c = 0; c < L.k; ++c) {
      const int64_t kb = c / 32;
      const int i = static_cast<int>(kb % 8), kk = static_cast<int>(c % 32);
      const uint8_t* r = record_of(L, rec, kb);
      uint16_t dh = 0;
      std::memcpy(&dh, r + 2 * i, 2);
      const float d = quant::fp16_to_f32(dh);
      if (L.format == WeightFormat::Q8_0) {
        out[c] = d * static_cast<float>(static_cast<int8_t>(r[16 + 32 * i + kk]));
        continue;
      }
      const int nib = (r[48 + 16 * i + kk % 16] >> (kk >= 16 ? 4 : 0)) & 0xF;
      const int bit = (r[fifth_bit_byte(i, kk)] >> fifth_bit(kk)) & 1;
      out[c] = d * static_cast<float>((nib | bit << 4) - 16);
    }
    return;
  }
  // The K-quants: back to the GGUF's blocks, then the reference decoder.
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
}

}  // namespace dllm::jit::cuda
