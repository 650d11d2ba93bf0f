// What bounds the VNNI GEMM kernels on this CPU: 64 independent vpdpbusd per loop iteration, alone and
// with the other instructions a kernel body adds (vector loads, broadcasts, masks, conversions, FMAs),
// each row printed as the share of the bare vpdpbusd loop's throughput. A row at 100% means the added
// instructions ran on otherwise idle resources; below, they compete with the dot products.
//
//   cc -O2 bench/micro/vnni_ports.c -o /tmp/vnni_ports && /tmp/vnni_ports
//
// x86-64 with AVX-512 VNNI only (GNU inline assembly). docs/benchmarks.md quotes the results.
#include <stdio.h>
#include <time.h>

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

#define ITERS 10000000L
static char buf[8192] __attribute__((aligned(64)));

// 8 dot products into zmm0..7: registers only (RR8), or with the embedded-broadcast activation load the
// kernels use (RM8, 8 different addresses).
#define RR(r) "vpdpbusd %%zmm30, %%zmm31, %%zmm" #r "\n\t"
#define RR8 RR(0) RR(1) RR(2) RR(3) RR(4) RR(5) RR(6) RR(7)
#define RM(r, o) "vpdpbusd " #o "(%1)%{1to16%}, %%zmm31, %%zmm" #r "\n\t"
#define RM8(o) RM(0, o) RM(1, o + 64) RM(2, o + 128) RM(3, o + 192) RM(4, o + 256) RM(5, o + 320) RM(6, o + 384) RM(7, o + 448)
#define DOTS_REG RR8 RR8 RR8 RR8 RR8 RR8 RR8 RR8
#define DOTS_MEM RM8(0) RM8(4) RM8(8) RM8(12) RM8(16) RM8(20) RM8(24) RM8(28)
// 8 extra instructions of one kind, into zmm16..23 (never read by the dots).
#define X8(op) op(16) op(17) op(18) op(19) op(20) op(21) op(22) op(23)
#define BC(r) "vpbroadcastd " #r "*4+2048(%1), %%zmm" #r "\n\t"
#define ML(r) "vmovdqu32 " #r "*64+4096(%1), %%zmm" #r "\n\t"
#define AN(r) "vpandd %%zmm30, %%zmm31, %%zmm" #r "\n\t"
#define CV(r) "vcvtdq2ps %%zmm30, %%zmm" #r "\n\t"
#define FM(r) "vfmadd231ps %%zmm30, %%zmm29, %%zmm" #r "\n\t"

#define TIME(body, out)                                                                          \
  do {                                                                                           \
    long n = ITERS;                                                                              \
    double t0 = now();                                                                           \
    __asm__ volatile("1:\n\t" body "dec %0\n\tjnz 1b\n\t" : "+r"(n) : "r"(buf) : "memory");     \
    out = now() - t0;                                                                            \
  } while (0)
#define ROW(name, body)                          \
  do {                                           \
    double t;                                    \
    TIME(body, t);                               \
    printf("  %-44s %5.1f%%\n", name, 100 * base / t); \
  } while (0)

int main(void) {
  for (int rep = 0; rep < 2; ++rep) {
    double base;
    TIME(DOTS_REG, base);
    printf("pass %d: 64 vpdpbusd zmm per iteration = %.2f per ns\n", rep + 1, 64.0 * ITERS / base * 1e-9);
    ROW("64 dots, broadcast activation operand", DOTS_MEM);
    ROW("64 register dots + 16 vpbroadcastd loads", DOTS_REG X8(BC) X8(BC));
    ROW("64 register dots + 16 64-byte loads", DOTS_REG X8(ML) X8(ML));
    ROW("64 broadcast dots + 8 vpbroadcastd loads", DOTS_MEM X8(BC));
    ROW("64 broadcast dots + 16 vpbroadcastd loads", DOTS_MEM X8(BC) X8(BC));
    ROW("64 broadcast dots + 8 64-byte loads", DOTS_MEM X8(ML));
    ROW("64 broadcast dots + 16 64-byte loads", DOTS_MEM X8(ML) X8(ML));
    ROW("64 register dots + 16 vpandd", DOTS_REG X8(AN) X8(AN));
    ROW("64 register dots + 16 vcvtdq2ps", DOTS_REG X8(CV) X8(CV));
    ROW("64 register dots + 16 vfmadd231ps", DOTS_REG X8(FM) X8(FM));
    ROW("64 broadcast dots + 16 vcvtdq2ps", DOTS_MEM X8(CV) X8(CV));
    ROW("64 broadcast dots + 8 vfmadd231ps", DOTS_MEM X8(FM));
  }
  return 0;
}
