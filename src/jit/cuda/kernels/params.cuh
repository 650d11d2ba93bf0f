// Kernel parameter blocks of dllm's GPU kernels. Every kernel takes one of these structs by value, so the
// host fills the same struct that the device reads. This file is valid C++ for both g++ (host code
// includes it) and NVRTC (it is embedded at the top of every generated unit): plain types only.
#ifndef DLLM_CUDA_PARAMS_CUH
#define DLLM_CUDA_PARAMS_CUH

// int8 activation fragments (see quant.cuh): rows_pad / 16 row tiles x KBP k-blocks x 32 lanes x 16 bytes,
// with per (row, k-block) scales da and the integer sums of each 16 quants, bs. KBP: the k-blocks of 32 of a row of
// k values, padded to a multiple of 4 (the padding blocks are zeros).
constexpr int act_kblocks(int k) { return (k / 32 + 3) / 4 * 4; }
struct QuantRowsParams {
  const float* x;      // input rows [.., ld]: the activations (MODE plain / rmsnorm) or the gate (swiglu)
  const float* x2;     // swiglu: the up projection [.., ld]; otherwise unused
  const float* w;      // rmsnorm: the norm weight [K]; otherwise unused
  const int* row_map;  // output row r reads input row row_map[r]; null: row r
  unsigned char* q;    // out: int8 fragments
  float* da;           // out: [rows_pad][KBP] block scales
  short* bs;           // out: [rows_pad][2 KBP] the sums of each 16 quants (the tiled GEMMs' min terms)
  int rows;            // valid output rows (rows_pad = gridDim.x; padding rows are written as zeros)
  int ld;              // row stride of x and x2, in floats
  float eps;           // rmsnorm epsilon
};

// y[r][j] (+)= sum_k act[r][k] * W[j][k] for r < rows, j < N.
struct GemmParams {
  const unsigned char* a;  // activation fragments (QuantRowsParams::q)
  const float* da;         // activation block scales
  const short* bs;         // activation sums of each 16 quants, as integers (the tiled GEMMs)
  const unsigned char* w;  // weight fragments (weight_pack.h)
  const float* ws;         // Q6_K: the d plane (weight_pack.h); otherwise unused
  float* y;                // out: [rows][ldy] f32
  int rows;                // valid rows
  int ldy;                 // row stride of y, in floats
  int accumulate;          // 1: y += result (residual connection); 0: y = result
  float* part;             // the small-row kernel's chunk sums [item][kTcSmallRows][64] (gemm_tc_small_tile)
  unsigned* count;         // its arrival counter per column block: zero before the launch, zero after
};

// The tiled GEMMs (gemm_tc.cuh) of every GPU weight type: the K-quants Q4_K (wt 12), Q5_K (13), Q6_K (14) and the
// per-32 types Q8_0 (8) and Q5_0 (6). A block of kTcThreads streams one step of 256 values of k (a K-quant super-block;
// eight Q8_0 / Q5_0 blocks, the last step of a row whose k is not a multiple of 256 fewer) per pipeline stage through
// dynamic shared memory. Two tilings of the same arithmetic: the wide one computes 64 x 128 outputs (a warp per
// 32 x 32), the split one 32 x 64 with four warps per 32 x 32, each multiplying two of a step's eight sub-blocks; their
// sums add up in a fixed order (exactly in int32 for the K-quants), so both give every output the same bits, and the
// host takes the split tiling when the wide grid would leave SMs idle. The host sizes the launch with
// gemm_tc_smem_bytes(); the kernel takes its stage count from the same rule.
constexpr int kTcThreads = 256;
constexpr int tc_rows(bool split) { return split ? 32 : 64; }
constexpr int tc_cols(bool split) { return split ? 64 : 128; }
// The per-32 types: a scale per 32 values, Q8_0 activations (a scale per 32 values too).
constexpr bool tc_per32(int wt) { return wt == 8 || wt == 6; }
// Device bytes of one column's step: Q4_K and Q5_K the GGUF block (d, dmin, scales, [high bits,] nibbles); Q6_K the
// GGUF block's scales, low nibbles and high bits (d in a plane of its own, an f32 per column and super-block); Q8_0 the
// eight blocks' f16 d (16 bytes), then their quants (32 bytes each); Q5_0 the eight d, the fifth bits rearranged (32
// bytes: weight_pack.cpp), then the nibbles (16 bytes a block). Every record is a multiple of 16 bytes, and 8 of them
// are the GGUF's bytes for 256 values.
constexpr int tc_block_bytes(int wt) { return wt == 14 ? 208 : wt == 13 ? 176 : wt == 12 ? 144 : wt == 8 ? 272 : 176; }
// Steps of a row of k values, the blocks of 32 of its last step (8 when whole), and that step's record: a prefix of a
// whole record (the K-quants' k is a multiple of 256).
constexpr int tc_steps(int k) { return (k + 255) / 256; }
constexpr int tc_last_blocks(int k) { return k / 32 % 8 == 0 ? 8 : k / 32 % 8; }
constexpr int tc_last_bytes(int wt, int k) {
  return tc_last_blocks(k) == 8 ? tc_block_bytes(wt) : wt == 8 ? 16 + 32 * tc_last_blocks(k) : 48 + 16 * tc_last_blocks(k);
}
constexpr int tc_column_bytes(int wt, int k) { return (tc_steps(k) - 1) * tc_block_bytes(wt) + tc_last_bytes(wt, k); }
// True for step sb of a row of k values when it is a short last step (fewer than 8 blocks).
constexpr bool tc_short_step(int k, int sb) { return tc_last_blocks(k) < 8 && sb == tc_steps(k) - 1; }
// A stage: int8 activation fragments (256 bytes a row), the columns' weight records, the int16 activation sums per
// 16 values (the K-quants) or the f32 activation scales per 32 values (the per-32 types; 32 bytes a row either way),
// Q6_K's d (4 bytes a column).
constexpr int tc_stage_bytes(int wt, bool split) {
  return tc_rows(split) * 256 + tc_cols(split) * tc_block_bytes(wt) + tc_rows(split) * 32 + (wt == 14 ? tc_cols(split) * 4 : 0);
}
// The per-stage table a thread per column decodes: Q4_K / Q5_K int32 scales [8][cols], mins [cols][8], (d, dmin) [cols];
// Q6_K int32 scales [16][cols] (its d stays in the stage); Q8_0 / Q5_0 f32 d [8][cols].
constexpr int tc_decoded_bytes(int wt, bool split) {
  return tc_cols(split) * (wt == 14 ? 16 * 4 : tc_per32(wt) ? 8 * 4 : 8 * 4 + 8 + 8);
}
// The split tiling's exchange: the sums (int32 or f32) of three warps of each four, [3][2][32 lanes][32].
constexpr int tc_partial_bytes(bool split) { return split ? 3 * 2 * 32 * 32 * 4 : 0; }
// arch = 10 * major + minor (0: the CPU emulator, sized as sm_90). Shared memory a block may take: 99 KiB on Ampere's
// and Ada's consumer parts, 163 KiB on sm_80, 227 KiB on sm_90. The stage counts: three (two on the 99 KiB parts), fewer
// where a type's stages would not fit (never below two; the host then avoids the tiling, gemm_tc_fits).
constexpr bool tc_small_smem(int arch) { return arch == 86 || arch == 87 || arch == 89; }
constexpr int tc_smem_limit(int arch) { return tc_small_smem(arch) ? 99 * 1024 : arch == 80 ? 163 * 1024 : 227 * 1024; }
constexpr int tc_fit_stages(int wt, int arch, bool split, int want, int extra) {
  int s = want;
  while (s > 2 && s * tc_stage_bytes(wt, split) + tc_decoded_bytes(wt, split) + tc_partial_bytes(split) + extra > tc_smem_limit(arch)) --s;
  return s;
}
constexpr int gemm_tc_stages(int wt, int arch, bool split) { return tc_fit_stages(wt, arch, split, tc_small_smem(arch) ? 2 : 3, 0); }
constexpr int gemm_tc_smem_bytes(int wt, int arch, bool split) {
  return gemm_tc_stages(wt, arch, split) * tc_stage_bytes(wt, split) + tc_decoded_bytes(wt, split) + tc_partial_bytes(split);
}
// False where the tiling's stages do not fit (Q8_0's wide tiling on the 99 KiB parts): the host takes the split one.
constexpr bool gemm_tc_fits(int wt, int arch, bool split) { return gemm_tc_smem_bytes(wt, arch, split) <= tc_smem_limit(arch); }

// Rows between two f32 activations (kernel dllm_copy_rows, one block per listed row): gather, dst row i = src row
// rows[i]; scatter, dst row rows[i] = src row i.
struct RowCopyParams {
  float* dst;
  const float* src;
  const int* rows;  // the listed rows
  int n;            // how many
  int cols;         // floats per row (both activations)
  int scatter;      // 0: gather, 1: scatter
};

// Column blocks of one tiled GEMM of N columns (8-column tiles padded to 16, params of a tiling).
constexpr int tc_col_blocks(int n, bool split) { return (n / 8 + 15) / 16 * 16 * 8 / tc_cols(split); }
// Split-K: every tiled GEMM of N x K forms its float sums in tc_chunks(N, K) chunks of consecutive super-blocks (each
// chunk's sum in order from zero, then the chunks' sums in order from zero), whatever the kernel and the row count, so
// a row's output bits never depend on how many rows share the launch. The count depends on N and K only: the largest
// divisor of the super-blocks that keeps the small-row kernel's items (column blocks x chunks) near kTcSmallItems, work
// enough for every SM of a large GPU at one row.
constexpr int kTcSmallRows = 32;    // rows the small-row kernel takes (one row tile of the split tiling)
constexpr int kTcSmallItems = 512;
constexpr int tc_chunks(int n, int k) {
  const int sb = tc_steps(k), blocks = tc_col_blocks(n, true), want = (kTcSmallItems + blocks - 1) / blocks;
  int c = 1;
  for (int d = 1; d <= sb && d <= want; ++d)
    if (sb % d == 0) c = d;
  return c;
}
// The small-row kernel's work items, its partial sums (floats) and counters for one GEMM (none with one chunk), and its
// shared memory (gemm_tc_small_smem_bytes): its stages, table and exchange area, then the block's arrival flag.
constexpr int tc_small_items(int n, int k) { return tc_col_blocks(n, true) * tc_chunks(n, k); }
constexpr long long tc_small_part_floats(int n, int k) {
  return tc_chunks(n, k) > 1 ? static_cast<long long>(tc_small_items(n, k)) * kTcSmallRows * tc_cols(true) : 0;
}
constexpr int tc_small_counters(int n, int k) { return tc_chunks(n, k) > 1 ? tc_col_blocks(n, true) : 0; }
// The small-row kernel streams weights: one block per SM with a deeper pipeline of the split tiling's stages (six; three
// on the 99 KiB parts; fewer where a type's stages would not fit), so that enough bytes are in flight per SM to approach
// the memory's bandwidth.
constexpr int gemm_tc_small_stages(int wt, int arch) { return tc_fit_stages(wt, arch, true, tc_small_smem(arch) ? 3 : 6, 16); }
constexpr int gemm_tc_small_smem_bytes(int wt, int arch) {
  return gemm_tc_small_stages(wt, arch) * tc_stage_bytes(wt, true) + tc_decoded_bytes(wt, true) + tc_partial_bytes(true) + 16;
}
// Two or three tiled GEMMs of one activation in one launch (gemm_tc_group_body); m[2] unused for two.
// With SwiGLU (a feed-forward's gate and up, gemm_tc_group_body's SWIGLU): q quantises silu(gate) * up for the down
// projection (Q8_K; q.x = the gate's y, q.x2 = the up's y), span the arrival counters per (row tile, 256 columns), zero
// before the launch and after.
struct GemmGroupParams {
  GemmParams m[3];
  QuantRowsParams q;
  unsigned* span;
};

// Bias, RoPE and conversion to split f16 of one projection's output, rearranged per head for attention.
struct PackParams {
  const float* x;      // [rows][ld] f32 projection output (heads concatenated)
  const float* bias;   // [NH * D] or null
  const double* cos_t; // RoPE: [positions][NROT / 2], in double like the CPU path
  const double* sin_t;
  const int* pos;      // RoPE: position of each row
  unsigned short* out; // f16 hi plane then lo plane, each [NH][rows_pad][D] ([NH][D][rows_pad] transposed)
  int rows;            // valid rows (padding rows up to rows_pad are written as zeros)
  int rows_pad;
  int ld;              // row stride of x, in floats
};

// The queries', keys' and values' packs of one attention in one launch (pack_qkv_body): blocks [0, blocks_q) run q,
// the next blocks_k run k, the rest v.
struct PackQkvParams {
  PackParams q, k, v;
  int blocks_q, blocks_k;
};

// Flash attention over split-f16 operands packed by PackParams kernels (hi plane, then lo plane).
struct AttnParams {
  const unsigned short* q;   // 2 x [H][q_pad][D]
  const unsigned short* k;   // 2 x [HKV][kv_pad][D]
  const unsigned short* vt;  // 2 x [HKV][D][kv_pad]
  float* out;                // [n_q][H * D] f32
  const int* ranges;         // [n_q][2]: query row i attends to keys [ranges[2i], ranges[2i + 1]); null: all
  int n_q;
  int n_kv;
  int q_pad;                 // multiple of 64
  int kv_pad;                // multiple of 64
  float scale_log2;          // softmax scale * log2(e)
  // The quantising variant (attention_body's QUANT): out's rows also quantised plain to Q8_K for the output projection,
  // row r into row q_row0 + r of q's buffers; span: arrival counters per (64-row tile, 256 columns), zero before and after.
  QuantRowsParams quant;
  unsigned* span;
  int q_row0;
};
// The quantising attention needs each block's output columns (a head, or a 128-wide slice of one) inside one Q8_K block.
constexpr bool attn_quant_ok(int n_head, int head_dim) {
  return 256 % (head_dim < 128 ? head_dim : 128) == 0 && n_head * head_dim % 256 == 0;
}

#endif
