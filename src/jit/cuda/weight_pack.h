// The device layouts of Q4_K / Q5_K / Q6_K / Q8_0 / Q5_0 weight matrices, read by the tiled GEMM (kernels/gemm_tc.cuh),
// at the GGUF's size: each column's records one after another (params.cuh tc_column_bytes). Q4_K and Q5_K are its rows
// byte for byte; Q6_K each block's scales, low nibbles and high bits as one 208-byte record per column and
// super-block, its d in an f32 plane (the "scales", [tile][super-block][8 columns]); Q8_0 and Q5_0 eight blocks a
// record, their f16 d first (Q5_0's fifth bits rearranged for the mma fragments). Every layout keeps the file's
// integers and scales, so the packed weights decode to the reference values bit for bit. Columns are processed in
// ranges of 8-column tiles so a large matrix can be packed and uploaded piece by piece.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "jit/cuda/kernel_set.h"
#include "jit/weight_types.h"
#include "model/gguf.h"

namespace dllm::jit::cuda {

// Sizes of one packed matrix of n rows (output columns) and k values per row.
struct PackedLayout {
  WeightFormat format = WeightFormat::Q8_0;
  int64_t n = 0, k = 0;
  int64_t ntiles = 0;  // 8-column tiles, padded to a whole GEMM block
  size_t quant_bytes_per_tile() const;  // every byte of 8 columns but Q6_K's d
  size_t scales_per_tile() const;       // f32 values of the scale plane per tile (Q6_K's d; 0 for the others)
  size_t quant_bytes() const { return quant_bytes_per_tile() * static_cast<size_t>(ntiles); }
  size_t scale_count() const { return scales_per_tile() * static_cast<size_t>(ntiles); }
  size_t device_bytes() const { return quant_bytes() + scale_count() * sizeof(float); }
};

// Throws dllm::Error naming the tensor when its type has no GPU kernel or its shape does not fit.
PackedLayout packed_layout(const gguf::TensorInfo& t);

// Packs column tiles [tile0, tile1) of t into the given buffers, which hold exactly that range
// (quants: (tile1-tile0) * quant_bytes_per_tile(); scales: (tile1-tile0) * scales_per_tile(), may be null when
// that is 0). Padding columns and k-blocks are written as zeros.
void pack_tiles(const gguf::TensorInfo& t, const PackedLayout& layout, int64_t tile0, int64_t tile1, uint8_t* quants,
                float* scales);

// The k values the packed weight represents in column j, decoded back from the packed buffers of the whole
// matrix into out: used by tests to check a packing against the reference decoder.
void packed_row(const PackedLayout& layout, const uint8_t* quants, const float* scales, int64_t j, float* out);

}  // namespace dllm::jit::cuda
