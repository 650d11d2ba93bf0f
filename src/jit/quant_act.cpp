// Activation quantisation: per row the vectorised quantizers (quant_act_simd.h) where the CPU has
// AVX-512, else ggml's reference quantizers, then the kernels' struct-of-arrays form and block sums;
// rows in parallel.
#include "jit/quant_act.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>

#include "jit/cpu_features.h"
#include "jit/quant_act_simd.h"
#include "common/error.h"
#include "model/quant.h"
#include "common/thread_pool.h"

namespace dllm::jit {

template <class T>
void AlignedArray<T>::Free::operator()(T* p) const {
  std::free(p);
}

template <class T>
void AlignedArray<T>::resize(size_t n) {
  if (n <= n_ && ptr_) {
    n_ = n;
    return;
  }
  const size_t bytes = ((n * sizeof(T) + 63) / 64) * 64;
  void* p = std::aligned_alloc(64, bytes ? bytes : 64);
  if (!p) throw std::bad_alloc();
  ptr_.reset(static_cast<T*>(p));
  n_ = n;
}

template class AlignedArray<int8_t>;
template class AlignedArray<uint8_t>;
template class AlignedArray<float>;

size_t QuantizedActs::block_bytes() const {
  return fmt == ActFormat::Q8_K ? sizeof(quant::BlockQ8_K) : sizeof(quant::BlockQ8_0);
}

namespace {

// Sizes the arrays for rows x k of format fmt (k already checked).
void shape(ActFormat fmt, int64_t rows, int64_t k, QuantizedActs& out) {
  const int block = act_block(fmt);
  out.fmt = fmt;
  out.rows = rows;
  out.k = k;
  const size_t nrows = static_cast<size_t>(rows);
  out.qs.resize(nrows * k);
  out.d.resize(nrows * (k / block));
  out.s32.resize(fmt == ActFormat::Q8_K ? nrows * (k / 32) : 0);
  out.corr.resize(nrows * out.corr_per_row());
  out.blocks.resize(nrows * (k / block) * out.block_bytes());
  out.tiles_ready = false;
}

void check(ActFormat fmt, int64_t rows, int64_t k) {
  const int block = act_block(fmt);
  if (k <= 0 || k % block != 0)
    throw Error("activation quantisation: row length " + std::to_string(k) + " is not a multiple of " +
                std::to_string(block));
  if (rows < 0) throw Error("activation quantisation: negative row count");
}

// Fills row r's kernel arrays from its ggml blocks (already in out.blocks).
void derive_row(QuantizedActs& a, int64_t r) {
  const int64_t k = a.k, nb = a.blocks_per_row();
  int8_t* qs = a.qs.data() + r * k;
  float* d = a.d.data() + r * nb;
  int32_t* corr = a.corr.data() + r * a.corr_per_row();
  if (a.fmt == ActFormat::Q8_K) {
    const auto* blocks = static_cast<const quant::BlockQ8_K*>(a.row_blocks(r));
    int16_t* s32 = a.s32.data() + r * (k / 32);
    for (int64_t b = 0; b < nb; ++b) {
      const quant::BlockQ8_K& blk = blocks[b];
      std::memcpy(qs + b * 256, blk.qs, 256);
      d[b] = blk.d;
      for (int j = 0; j < 16; ++j) corr[b * 16 + j] = -32 * blk.bsums[j];
      for (int j = 0; j < 8; ++j) s32[b * 8 + j] = static_cast<int16_t>(blk.bsums[2 * j] + blk.bsums[2 * j + 1]);
    }
  } else {
    const auto* blocks = static_cast<const quant::BlockQ8_0*>(a.row_blocks(r));
    for (int64_t b = 0; b < nb; ++b) {
      const quant::BlockQ8_0& blk = blocks[b];
      std::memcpy(qs + b * 32, blk.qs, 32);
      d[b] = quant::fp16_to_f32(blk.d);
      int sum = 0;
      for (int j = 0; j < 32; ++j) sum += blk.qs[j];
      corr[b] = -128 * sum;
    }
  }
}

}  // namespace

void quantize_acts(ActFormat fmt, const float* x, int64_t rows, int64_t k, QuantizedActs& out, ThreadPool& pool) {
  check(fmt, rows, k);
  shape(fmt, rows, k, out);
  const bool avx512 = cpu_features().avx512bw, avx2 = cpu_features().avx2;
  pool.parallel_for(rows, [&](int64_t r, int) {
    void* blocks = out.blocks.data() + r * out.blocks_per_row() * out.block_bytes();
    if (fmt == ActFormat::Q8_K) {
      auto* y = static_cast<quant::BlockQ8_K*>(blocks);
      if (avx512) quantize_row_q8_K_avx512(x + r * k, y, k);
      else if (avx2) quantize_row_q8_K_avx2(x + r * k, y, k);
      else quant::quantize_row_q8_K(x + r * k, y, k);
    } else {
      auto* y = static_cast<quant::BlockQ8_0*>(blocks);
      if (avx512) quantize_row_q8_0_avx512(x + r * k, y, k);
      else if (avx2) quantize_row_q8_0_avx2(x + r * k, y, k);
      else quant::quantize_row_q8_0(x + r * k, y, k);
    }
    derive_row(out, r);
  });
}

void gather_acts(const QuantizedActs& src, const int64_t* src_rows, int64_t n, QuantizedActs& out, ThreadPool& pool) {
  if (&src == &out) throw Error("internal error: gather_acts in place");
  for (int64_t i = 0; i < n; ++i)
    if (src_rows[i] < 0 || src_rows[i] >= src.rows)
      throw Error("internal error: gathered activation row " + std::to_string(src_rows[i]) + " of " +
                  std::to_string(src.rows));
  shape(src.fmt, n, src.k, out);
  const int64_t k = src.k, nb = src.blocks_per_row(), s32 = src.fmt == ActFormat::Q8_K ? k / 32 : 0;
  const int64_t corr = src.corr_per_row(), bytes = nb * static_cast<int64_t>(src.block_bytes());
  auto copy_row = [](auto* dst, const auto* from, int64_t count, int64_t to_row, int64_t from_row) {
    std::memcpy(dst + to_row * count, from + from_row * count, static_cast<size_t>(count) * sizeof(*dst));
  };
  pool.parallel_for(n, [&](int64_t i, int) {
    const int64_t r = src_rows[i];
    copy_row(out.qs.data(), src.qs.data(), k, i, r);
    copy_row(out.d.data(), src.d.data(), nb, i, r);
    if (s32) copy_row(out.s32.data(), src.s32.data(), s32, i, r);
    copy_row(out.corr.data(), src.corr.data(), corr, i, r);
    copy_row(out.blocks.data(), src.blocks.data(), bytes, i, r);
  });
}

void build_amx_tiles(const QuantizedActs& a, ThreadPool& pool) {
  if (a.tiles_ready) return;
  const int64_t chunks = a.tile_chunks(), groups = a.tile_groups();
  a.tiles.resize(static_cast<size_t>(groups * chunks * 1024));
  pool.parallel_for(groups, [&](int64_t g, int) {
    int8_t* dst = a.tiles.data() + g * chunks * 1024;
    for (int64_t c = 0; c < chunks; ++c) {
      for (int64_t r = 0; r < 16; ++r) {
        int8_t* row = dst + c * 1024 + r * 64;
        const int64_t src_row = g * 16 + r, k0 = c * 64, n = std::min<int64_t>(64, a.k - k0);
        if (src_row < a.rows) {
          std::memcpy(row, a.qs.data() + src_row * a.k + k0, static_cast<size_t>(n));
          if (n < 64) std::memset(row + n, 0, static_cast<size_t>(64 - n));
        } else {
          std::memset(row, 0, 64);
        }
      }
    }
  });
  a.tiles_ready = true;
}

void acts_from_blocks(ActFormat fmt, const void* blocks, int64_t rows, int64_t k, QuantizedActs& out) {
  check(fmt, rows, k);
  shape(fmt, rows, k, out);
  std::memcpy(out.blocks.data(), blocks, out.blocks.size());
  for (int64_t r = 0; r < rows; ++r) derive_row(out, r);
}

}  // namespace dllm::jit
