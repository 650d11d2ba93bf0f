// Weight repacking at load: ggml Q4_K / Q5_K / Q6_K / Q8_0 / Q5_0 rows (the weight table's types) into the interleaved layout the JIT kernels
// read, so that one vpdpbusd multiplies P weight rows (16 in a zmm, 8 in a ymm) by 4 int8 activations.
// Nothing but the kernels (and the tests) reads this layout.
//
// The weight rows are cut into panels of P rows (the last one padded with zero rows): P = panel_rows()
// (gemm_desc.h), the rows of one vector register, except Q6_K on avx512-vnni with k <= 8192, where P = 32
// (two zmm per group). A panel is
//   [quant stream: nblocks x quant_bytes][meta stream: nblocks x meta_bytes], padded to 64 bytes,
// and panels follow each other. "Vector" below is P dwords: dword p holds 4 bytes of weight row p, for
// 4 consecutive k ("a group"). Per block (256 values for the K-quants, 32 for Q8_0 and Q5_0):
//
// Q4_K  quant (128P): for sub-block pair t < 4, group j < 8: vector V[t][j], byte b of dword p =
//                       q[p][64t+4j+b] | q[p][64t+32+4j+b] << 4   (ggml's own nibble order; q in 0..15)
//                     so the low nibbles are sub-block 2t and the high nibbles sub-block 2t+1.
//       meta   (20P): d fp16 [P] | dmin fp16 [P] | scales u8 [8][P] | mins u8 [4][P][2] (pairs for vpdpwssd)
// Q5_K  quant (160P): Q4_K's 32 nibble vectors of the low 4 bits (128P), then for group j < 8 a vector H[j]
//                     (32P): bit 2t of byte b of dword p = bit 4 of q[p][64t+4j+b], bit 2t+1 = bit 4 of
//                     q[p][64t+32+4j+b] (ggml's own qh bytes, q in 0..31): 2.3% more than the GGUF
//       meta   (20P): as Q4_K
// Q6_K  quant (256P): for sub-block u < 16, group g < 4: vector V[u][g], byte b of dword p = q[p][16u+4g+b],
//                     q in 0..63 (ggml's q + 32) as a whole byte: the kernels at many rows are bound by
//                     arithmetic, not memory, and unpacking 6 bits would cost more than the 22% more bytes
//       meta   (18P): d fp16 [P] | scales i8 [16][P]
// Q8_0  quant (32P):  for group g < 8: vector, byte b of dword p = w[p][4g+b], XOR 0x80 for the VNNI
//                       families (unsigned w + 128; the kernel subtracts 128 * sum(x)), as is for AVX2
//                       and AMX (signed x signed tiles)
//       meta    (2P): d fp16 [P]
// Q5_0  quant (20P):  for group g < 4: vector N[g], byte b of dword p = ggml's qs[4g+b] of row p (the low
//                       nibble element 4g+b, the high one element 16+4g+b; ggml's q in 0..31, the value
//                       d * (q - 16)), then a vector H: bit 2g of byte b of dword p = bit 4 of q[p][4g+b],
//                       bit 2g+1 = bit 4 of q[p][16+4g+b] (Q5_K's arrangement): the GGUF's 22P bytes, the
//                       same on every family (unsigned q for vpdpbusd / vpmaddubsw; the kernel's dot chains
//                       start at -16 * sum(x), the Q8_0 activations' correction divided by 8)
//       meta    (2P): d fp16 [P]
// The AMX family uses the avx512-vnni layout (a vector is also a row of an AMX B tile: 16 weight rows x 4
// k), except that its Q6_K bytes are ggml's signed q (q - 32 in -32..31) and its Q8_0 bytes unbiased
// (Q5_0 has no AMX body: its matrices run the avx512-vnni kernels, matrix_family; Q4_K's and Q5_K's remainders of
// up to 8 rows run avx512-vnni kernels on the same panels).
#pragma once
#include <cstdint>
#include <string>

#include "jit/gemm_desc.h"
#include "jit/quant_act.h"

namespace dllm {
class ThreadPool;
}

namespace dllm::jit {

struct PackedLayout {
  Isa isa = Isa::Avx512Vnni;
  GgmlType wtype = GgmlType::Q4_K;
  int p = 16;                 // rows per panel
  int64_t n = 0, k = 0;
  int block = 256;            // values per block
  int64_t nblocks = 0;        // k / block
  int64_t quant_bytes = 0;    // per block, per panel
  int64_t meta_bytes = 0;     // per block, per panel
  int64_t panel_bytes = 0;    // nblocks * (quant_bytes + meta_bytes), rounded up to 64
  int64_t n_panels = 0;       // ceil(n / p)

  int64_t meta_offset() const { return nblocks * quant_bytes; }  // start of the meta stream in a panel
  int64_t total_bytes() const { return panel_bytes * n_panels; }
};

// Offsets inside one block's meta record, in bytes, for P rows per panel.
namespace meta {
inline int64_t q4k_d(int) { return 0; }
inline int64_t q4k_dmin(int p) { return 2 * p; }
inline int64_t q4k_scales(int p) { return 4 * p; }
inline int64_t q4k_mins(int p) { return 12 * p; }
inline int64_t q6k_d(int) { return 0; }
inline int64_t q6k_scales(int p) { return 2 * p; }  // [16][P]
inline int64_t q8_0_d(int) { return 0; }
}  // namespace meta

// Throws dllm::Error when the type has no JIT kernel or k is not a multiple of its block.
PackedLayout packed_layout(Isa isa, GgmlType wtype, int64_t n, int64_t k);

// A weight matrix prepared for gemm(): n rows (outputs) of k values, repacked for one kernel family.
// The portable family keeps a pointer to the original ggml rows (which must outlive the matrix).
struct QuantMatrix {
  GgmlType type = GgmlType::Q4_K;
  Isa isa = Isa::Portable;
  int64_t n = 0, k = 0;
  PackedLayout layout;
  AlignedArray<uint8_t> packed;  // empty for the portable family
  const uint8_t* src = nullptr;  // the ggml rows (row stride = k / block * bytes per block)
  double repack_seconds = 0;     // wall time of the repack

  size_t src_row_bytes() const;
};

// Prepares `n` rows of `k` values of ggml type `type` stored at `data` for family `isa`, panels in
// parallel. Throws dllm::Error naming `what` (e.g. the tensor name) for a type or shape it cannot take.
QuantMatrix prepare_matrix(GgmlType type, int64_t k, int64_t n, const void* data, Isa isa, ThreadPool& pool,
                           const std::string& what = "weight matrix");

// Whether unpack_row can decode a packed matrix of this type (Q6_K and Q8_0: the types of tied embedding
// tables, which self-conditioning reads row by row every step).
bool can_unpack_rows(GgmlType type);
// Row `row` of a packed matrix (not the portable family's) as floats, from the panels alone: bit for bit
// quant::dequantize_row of the ggml row, so the source pages can be released. Throws dllm::Error for a type
// can_unpack_rows refuses or a row out of range.
void unpack_row(const QuantMatrix& m, int64_t row, float* out);
// Rows row0 .. row0 + n - 1 the same way, row i at out + i * stride: a panel's rows gathered together, several
// times faster per row than one at a time.
void unpack_rows(const QuantMatrix& m, int64_t row0, int64_t n, float* out, int64_t stride);

// The unsigned quants of one ggml block in element order: Q4_K 0..15, Q5_K 0..31, Q6_K 0..63 (ggml's q + 32).
void unpack_q4_k(const void* block, uint8_t q[256]);
void unpack_q5_k(const void* block, uint8_t q[256]);
void unpack_q6_k(const void* block, uint8_t q[256]);
// The signed quants of one Q5_0 block in element order: ggml's q - 16, in -16..15 (the value is d * q).
void unpack_q5_0(const void* block, int8_t q[32]);

}  // namespace dllm::jit
