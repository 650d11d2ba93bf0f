// What the int8 tensor-core GEMMs (gemm_tc.cuh) share: the weight type ids and the epilogue's store.
#ifndef DLLM_CUDA_GEMM_CUH
#define DLLM_CUDA_GEMM_CUH

// ggml's type ids (the host's WeightFormat is the GgmlType of the weight table).
enum { WT_Q5_0 = 6, WT_Q8_0 = 8, WT_Q4_K = 12, WT_Q5_K = 13, WT_Q6_K = 14 };

// Stores one thread's part of an mma output tile: v[0], v[1] at (row, col), (row, col + 1), v[2], v[3] eight rows
// below; rows at or past p.rows and columns at or past N are skipped. Adds onto y when p.accumulate.
template <int N>
DEV void gemm_store_tile(const GemmParams& p, int row, int col, const float (&v)[4]) {
  if (col >= N) return;
  UNROLL
  for (int h = 0; h < 2; ++h) {
    if (row + 8 * h >= p.rows) continue;
    float* y = p.y + static_cast<long long>(row + 8 * h) * p.ldy + col;
    y[0] = p.accumulate ? y[0] + v[2 * h] : v[2 * h];
    y[1] = p.accumulate ? y[1] + v[2 * h + 1] : v[2 * h + 1];
  }
}

template <class T, int A, int B>
DEV void zero_tiles(T (&x)[A][B][4]) {
  UNROLL
  for (int a = 0; a < A; ++a)
    UNROLL
    for (int b = 0; b < B; ++b)
      UNROLL
      for (int i = 0; i < 4; ++i) x[a][b][i] = T(0);
}

#endif
