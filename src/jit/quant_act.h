// Activation quantisation for the integer GEMM kernels: f32 rows -> int8 blocks, once per row, so that
// every matrix reading the same input (Q, K and V; gate and up) reuses one quantisation.
//
// Q8_K (per 256, for Q4_K / Q6_K weights) and Q8_0 (per 32, for Q8_0 weights) are ggml's activation
// formats; the values equal quant::quantize_row_q8_K / quantize_row_q8_0 bit for bit (the tests check).
// The kernels read a struct-of-arrays form of them plus a few precomputed block sums:
//   qs   [rows][k]        int8 quants, row-major (the kernels broadcast 4 of them at a time)
//   d    [rows][k/B]      block scales as float (Q8_0: the fp16 scale widened, as ggml uses it)
//   s32  [rows][k/32]     Q8_K only: sums of 32 quants (Q4_K mins)
//   corr [rows][k/16]     Q8_K: -32 * bsum of each 16 (Q6_K's offset); Q8_0 [rows][k/32]: -128 * sum of
//                         each 32 (undoes the +128 bias of the VNNI kernels' unsigned weights)
//   blocks                the ggml blocks themselves (BlockQ8_K / BlockQ8_0 rows), for the portable path
//   tiles                 (AMX family, built on first use by gemm) the quants as AMX A tiles: per group of
//                         16 rows, per 64 values of k, 16 rows x 64 bytes (rows past the end and k past the
//                         end zero), so that any 16/32/64-wide slice is one tile load with row stride 64
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "jit/gemm_desc.h"

namespace dllm {
class ThreadPool;
}

namespace dllm::jit {

// A 64-byte aligned, uninitialised array of trivially copyable T.
template <class T>
class AlignedArray {
 public:
  AlignedArray() = default;
  explicit AlignedArray(size_t n) { resize(n); }
  void resize(size_t n);
  T* data() { return ptr_.get(); }
  const T* data() const { return ptr_.get(); }
  size_t size() const { return n_; }
  T& operator[](size_t i) { return ptr_.get()[i]; }
  const T& operator[](size_t i) const { return ptr_.get()[i]; }

 private:
  struct Free {
    void operator()(T* p) const;
  };
  std::unique_ptr<T, Free> ptr_;
  size_t n_ = 0;
};

struct QuantizedActs {
  ActFormat fmt = ActFormat::Q8_K;
  int64_t rows = 0, k = 0;
  AlignedArray<int8_t> qs;
  std::vector<float> d;
  std::vector<int16_t> s32;
  std::vector<int32_t> corr;
  std::vector<uint8_t> blocks;

  // AMX tile form (see above); tiles_ready is reset whenever the arrays are reshaped. gemm() fills it,
  // so one QuantizedActs must not be handed to two concurrent gemm() calls of the AMX family.
  mutable AlignedArray<int8_t> tiles;
  mutable bool tiles_ready = false;

  int64_t blocks_per_row() const { return k / act_block(fmt); }
  int64_t tile_chunks() const { return (k + 63) / 64; }  // 64-value chunks per row group
  int64_t tile_groups() const { return (rows + 15) / 16; }
  int64_t corr_per_row() const { return fmt == ActFormat::Q8_K ? k / 16 : k / 32; }
  size_t block_bytes() const;  // 292 (BlockQ8_K) or 34 (BlockQ8_0)
  const void* row_blocks(int64_t r) const { return blocks.data() + r * blocks_per_row() * block_bytes(); }
};

// Quantises `rows` rows of k floats (row stride k) into `out` (reusing its storage), rows in parallel.
// k must be a multiple of the format's block (256 or 32); throws dllm::Error otherwise.
void quantize_acts(ActFormat fmt, const float* x, int64_t rows, int64_t k, QuantizedActs& out, ThreadPool& pool);

// out = rows src_rows[0 .. n) of src, in that order (a row may appear several times): the quantisation of the
// gathered f32 rows bit for bit, since each row's quantisation depends on that row alone. Throws dllm::Error
// for a row index outside src.
void gather_acts(const QuantizedActs& src, const int64_t* src_rows, int64_t n, QuantizedActs& out, ThreadPool& pool);

// Fills a.tiles (AMX A-tile form of a.qs) if not done since the last (re)quantisation.
void build_amx_tiles(const QuantizedActs& a, ThreadPool& pool);

// Builds the same from rows already in ggml's blocks (BlockQ8_K or BlockQ8_0, rows x k/B blocks).
void acts_from_blocks(ActFormat fmt, const void* blocks, int64_t rows, int64_t k, QuantizedActs& out);

}  // namespace dllm::jit
