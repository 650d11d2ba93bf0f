// PeakGen and ReadGen: the int8 peak loop and the streaming read loop.
#include "jit/x64/bench_gen.h"

#include "common/error.h"

namespace dllm::jit {

using namespace Xbyak;

PeakGen::PeakGen(Isa isa)
    : JitGenerator(std::string("int8_peak__") + isa_short_name(isa), 16 * 1024), isa_(isa),
      chains_(isa_has_avx512(isa) ? 24 : 12) {
  if (isa == Isa::Portable) throw Error("the int8 peak needs a JIT kernel family");
}

int64_t PeakGen::macs_per_iteration() const { return static_cast<int64_t>(chains_) * (isa_has_avx512(isa_) ? 64 : 32); }

void PeakGen::generate() {
  Label loop;
  if (isa_has_avx512(isa_)) {
    for (int i = 0; i < 32; ++i) vpxord(Zmm(i), Zmm(i), Zmm(i));
    align(32);
    L(loop);
    for (int i = 0; i < chains_; ++i) vpdpbusd(Zmm(i), Zmm(30), Zmm(31), EvexEncoding);
  } else {
    for (int i = 0; i < 16; ++i) vpxor(Ymm(i), Ymm(i), Ymm(i));
    align(32);
    L(loop);
    if (isa_ == Isa::AvxVnni) {
      for (int i = 0; i < chains_; ++i) vpdpbusd(Ymm(i), Ymm(14), Ymm(15), VexEncoding);
    } else {
      // 12 chains need 12 accumulators + 2 sources + 2 temps: alternate two temporaries.
      for (int i = 0; i < chains_; ++i) {
        const Ymm t = Ymm(12 + (i % 2));
        vpmaddubsw(t, Ymm(14), Ymm(15));
        vpmaddwd(t, t, Ymm(15));
        vpaddd(Ymm(i % 12), Ymm(i % 12), t);
      }
    }
  }
  dec(rdi);
  jnz(loop, T_NEAR);
  vzeroupper();
  ret();
}

ReadGen::ReadGen(Isa isa) : JitGenerator(std::string("stream_read__") + isa_short_name(isa), 4096), isa_(isa) {
  if (isa == Isa::Portable) throw Error("the read bandwidth loop needs a JIT kernel family");
}

void ReadGen::generate() {
  Label loop;
  if (isa_has_avx512(isa_)) {
    for (int i = 0; i < 4; ++i) vpxord(Zmm(i), Zmm(i), Zmm(i));
    align(32);
    L(loop);
    for (int i = 0; i < 4; ++i) vpaddd(Zmm(i), Zmm(i), ptr[rdi + 64 * i]);
  } else {
    for (int i = 0; i < 8; ++i) vpxor(Ymm(i), Ymm(i), Ymm(i));
    align(32);
    L(loop);
    for (int i = 0; i < 8; ++i) vpaddd(Ymm(i), Ymm(i), ptr[rdi + 32 * i]);
  }
  add(rdi, 256);
  sub(rsi, 256);
  jnz(loop, T_NEAR);
  vzeroupper();
  ret();
}

}  // namespace dllm::jit
