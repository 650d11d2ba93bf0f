// The interpreter of x86_emu.h: decode once per address (Zydis; again when the bytes there changed), then execute
// from the cache.
#include "x86_emu.h"

#include <Zydis/Zydis.h>

#include <cmath>
#include <cstring>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/error.h"
#include "jit/kernel_cache.h"

namespace dllm::test {

namespace {

union Vec {
  uint8_t u8[64];
  int8_t i8[64];
  uint16_t u16[32];
  int16_t i16[32];
  uint32_t u32[16];
  int32_t i32[16];
  float f32[16];
  uint64_t u64[8];
};

struct Decoded {
  ZydisDecodedInstruction ins;
  ZydisDecodedOperand ops[ZYDIS_MAX_OPERAND_COUNT];
  int n = 0;   // visible operands without the EVEX write mask, in ops[0..n)
  int op[4];   // their indices in ops
  uint8_t bytes[ZYDIS_MAX_INSTRUCTION_LENGTH];  // the encoding, to notice code that changed at this address
};

float half_to_float(uint16_t h) {
  const int sign = h >> 15, exp = (h >> 10) & 31, man = h & 1023;
  float v;
  if (exp == 0) v = std::ldexp(static_cast<float>(man), -24);
  else if (exp == 31) v = man ? std::nanf("") : INFINITY;
  else v = std::ldexp(static_cast<float>(man | 1024), exp - 25);
  return sign ? -v : v;
}

// The bits of a `bits`-wide integer operand.
uint64_t width_mask(int bits) { return bits == 64 ? ~uint64_t{0} : (uint64_t{1} << bits) - 1; }

int16_t sat16(int32_t v) { return static_cast<int16_t>(v < -32768 ? -32768 : v > 32767 ? 32767 : v); }

}  // namespace

struct X86Emulator::State {
  ZydisDecoder dec;
  std::unordered_map<uint64_t, Decoded> cache;
  uint64_t gpr[16] = {};
  Vec v[32] = {};
  uint64_t k[8] = {};
  bool zf = false, sf = false, cf = false, of = false;
  std::vector<uint8_t> stack = std::vector<uint8_t>(1 << 20);
  // AMX: eight tiles of 16 rows x 64 bytes, and the configured shapes.
  uint8_t tile[8][16][64] = {};
  int tile_rows[8] = {}, tile_colsb[8] = {};
  int64_t executed = 0;

  [[noreturn]] void fail(const Decoded& d, uint64_t ip, const std::string& why) {
    char text[256];
    ZydisFormatter f;
    ZydisFormatterInit(&f, ZYDIS_FORMATTER_STYLE_INTEL);
    ZydisFormatterFormatInstruction(&f, &d.ins, d.ops, d.ins.operand_count_visible, text, sizeof text, ip, nullptr);
    throw Error("x86 emulator: " + why + ": " + text);
  }

  const Decoded& decode(uint64_t ip) {
    auto it = cache.find(ip);
    // The memory of a freed kernel may hold another kernel by the next call: the bytes must still match.
    if (it != cache.end() && std::memcmp(it->second.bytes, reinterpret_cast<const void*>(ip), it->second.ins.length) == 0)
      return it->second;
    Decoded d;
    if (!ZYAN_SUCCESS(ZydisDecoderDecodeFull(&dec, reinterpret_cast<const void*>(ip), ZYDIS_MAX_INSTRUCTION_LENGTH, &d.ins,
                                              d.ops)))
      throw Error("x86 emulator: cannot decode the instruction at " + std::to_string(ip));
    for (int i = 0; i < d.ins.operand_count_visible; ++i) {
      if (d.ops[i].encoding == ZYDIS_OPERAND_ENCODING_MASK) continue;
      if (d.n == 4) throw Error("x86 emulator: too many operands");
      d.op[d.n++] = i;
    }
    std::memcpy(d.bytes, reinterpret_cast<const void*>(ip), d.ins.length);
    return cache.insert_or_assign(ip, d).first->second;
  }

  // ---- scalar operands
  uint64_t reg_read(ZydisRegister r, uint64_t next_ip) const {
    if (r == ZYDIS_REGISTER_NONE) return 0;
    if (r == ZYDIS_REGISTER_RIP) return next_ip;
    const ZydisRegisterClass c = ZydisRegisterGetClass(r);
    const int id = ZydisRegisterGetId(r);
    switch (c) {
      case ZYDIS_REGCLASS_GPR64: return gpr[id];
      case ZYDIS_REGCLASS_GPR32: return gpr[id] & 0xffffffffu;
      case ZYDIS_REGCLASS_GPR16: return gpr[id] & 0xffffu;
      case ZYDIS_REGCLASS_MASK: return k[id];
      default: throw Error(std::string("x86 emulator: cannot read register ") + ZydisRegisterGetString(r));
    }
  }
  void reg_write(ZydisRegister r, uint64_t val) {
    const ZydisRegisterClass c = ZydisRegisterGetClass(r);
    const int id = ZydisRegisterGetId(r);
    switch (c) {
      case ZYDIS_REGCLASS_GPR64: gpr[id] = val; break;
      case ZYDIS_REGCLASS_GPR32: gpr[id] = val & 0xffffffffu; break;  // zero-extends
      case ZYDIS_REGCLASS_GPR16: gpr[id] = (gpr[id] & ~uint64_t{0xffff}) | (val & 0xffff); break;
      case ZYDIS_REGCLASS_MASK: k[id] = val; break;
      default: throw Error(std::string("x86 emulator: cannot write register ") + ZydisRegisterGetString(r));
    }
  }
  uint64_t address(const ZydisDecodedOperand& o, uint64_t next_ip) const {
    uint64_t a = reg_read(o.mem.base, next_ip) + static_cast<uint64_t>(o.mem.disp.value);
    if (o.mem.index != ZYDIS_REGISTER_NONE) a += reg_read(o.mem.index, next_ip) * o.mem.scale;
    return a;
  }
  uint64_t scalar_read(const ZydisDecodedOperand& o, uint64_t next_ip) const {
    switch (o.type) {
      case ZYDIS_OPERAND_TYPE_REGISTER: return reg_read(o.reg.value, next_ip);
      case ZYDIS_OPERAND_TYPE_IMMEDIATE: return o.imm.is_signed ? static_cast<uint64_t>(o.imm.value.s) : o.imm.value.u;
      case ZYDIS_OPERAND_TYPE_MEMORY: {
        uint64_t v = 0;
        std::memcpy(&v, reinterpret_cast<const void*>(address(o, next_ip)), o.size / 8);
        return v;
      }
      default: throw Error("x86 emulator: unsupported scalar operand");
    }
  }
  void scalar_write(const ZydisDecodedOperand& o, uint64_t val, uint64_t next_ip) {
    if (o.type == ZYDIS_OPERAND_TYPE_REGISTER) return reg_write(o.reg.value, val);
    if (o.type != ZYDIS_OPERAND_TYPE_MEMORY) throw Error("x86 emulator: unsupported destination");
    std::memcpy(reinterpret_cast<void*>(address(o, next_ip)), &val, o.size / 8);
  }
  void flags(uint64_t res, int bits) {
    zf = (res & width_mask(bits)) == 0;
    sf = (res >> (bits - 1)) & 1;
  }
  // Whether a conditional jump or move takes place on the flags; nullopt for any other mnemonic.
  std::optional<bool> cond(ZydisMnemonic m) const {
    switch (m) {
      case ZYDIS_MNEMONIC_JZ: case ZYDIS_MNEMONIC_CMOVZ: return zf;
      case ZYDIS_MNEMONIC_JNZ: case ZYDIS_MNEMONIC_CMOVNZ: return !zf;
      case ZYDIS_MNEMONIC_JNLE: case ZYDIS_MNEMONIC_CMOVNLE: return !zf && sf == of;
      case ZYDIS_MNEMONIC_JLE: case ZYDIS_MNEMONIC_CMOVLE: return zf || sf != of;
      case ZYDIS_MNEMONIC_JL: case ZYDIS_MNEMONIC_CMOVL: return sf != of;
      case ZYDIS_MNEMONIC_JNL: case ZYDIS_MNEMONIC_CMOVNL: return sf == of;
      case ZYDIS_MNEMONIC_JB: case ZYDIS_MNEMONIC_CMOVB: return cf;
      case ZYDIS_MNEMONIC_JNB: case ZYDIS_MNEMONIC_CMOVNB: return !cf;
      case ZYDIS_MNEMONIC_JBE: case ZYDIS_MNEMONIC_CMOVBE: return cf || zf;
      case ZYDIS_MNEMONIC_JNBE: case ZYDIS_MNEMONIC_CMOVNBE: return !cf && !zf;
      case ZYDIS_MNEMONIC_JS: case ZYDIS_MNEMONIC_CMOVS: return sf;
      case ZYDIS_MNEMONIC_JNS: case ZYDIS_MNEMONIC_CMOVNS: return !sf;
      default: return std::nullopt;
    }
  }
  static bool is_amx(ZydisMnemonic m) {
    switch (m) {
      case ZYDIS_MNEMONIC_LDTILECFG: case ZYDIS_MNEMONIC_TILERELEASE: case ZYDIS_MNEMONIC_TILEZERO:
      case ZYDIS_MNEMONIC_TILELOADD: case ZYDIS_MNEMONIC_TILELOADDT1: case ZYDIS_MNEMONIC_TILESTORED:
      case ZYDIS_MNEMONIC_TDPBSSD: case ZYDIS_MNEMONIC_TDPBSUD: case ZYDIS_MNEMONIC_TDPBUSD: case ZYDIS_MNEMONIC_TDPBUUD:
        return true;
      default: return false;
    }
  }
  void push(uint64_t v) {
    gpr[4] -= 8;
    std::memcpy(reinterpret_cast<void*>(gpr[4]), &v, 8);
  }
  uint64_t pop() {
    uint64_t v;
    std::memcpy(&v, reinterpret_cast<const void*>(gpr[4]), 8);
    gpr[4] += 8;
    return v;
  }

  // ---- vector operands
  static bool is_vec(const ZydisDecodedOperand& o) {
    if (o.type != ZYDIS_OPERAND_TYPE_REGISTER) return false;
    const ZydisRegisterClass c = ZydisRegisterGetClass(o.reg.value);
    return c == ZYDIS_REGCLASS_XMM || c == ZYDIS_REGCLASS_YMM || c == ZYDIS_REGCLASS_ZMM;
  }
  // The operand's bytes (a register, memory of the operand's size, or an embedded broadcast to vl bytes), zero above.
  Vec vread(const Decoded& d, const ZydisDecodedOperand& o, int vl, uint64_t next_ip) const {
    Vec r;
    if (o.type == ZYDIS_OPERAND_TYPE_REGISTER && o.size == 512 && is_vec(o)) return v[ZydisRegisterGetId(o.reg.value)];
    std::memset(r.u8, 0, sizeof r.u8);
    if (is_vec(o)) {
      std::memcpy(r.u8, v[ZydisRegisterGetId(o.reg.value)].u8, o.size / 8);
    } else if (o.type == ZYDIS_OPERAND_TYPE_MEMORY) {
      const auto* p = reinterpret_cast<const uint8_t*>(address(o, next_ip));
      if (d.ins.avx.broadcast.mode != ZYDIS_BROADCAST_MODE_INVALID) {
        const int e = o.element_size / 8;
        for (int i = 0; i < vl; i += e) std::memcpy(r.u8 + i, p, e);
      } else {
        std::memcpy(r.u8, p, o.size / 8);
      }
    } else if (o.type == ZYDIS_OPERAND_TYPE_REGISTER) {
      r.u64[0] = reg_read(o.reg.value, next_ip);
    } else if (o.type == ZYDIS_OPERAND_TYPE_IMMEDIATE) {
      r.u64[0] = o.imm.value.u;
    } else {
      throw Error("x86 emulator: unsupported vector operand");
    }
    return r;
  }
  int mask_reg(const Decoded& d) const {
    const ZydisRegister m = d.ins.avx.mask.reg;
    if (m == ZYDIS_REGISTER_NONE || d.ins.avx.mask.mode == ZYDIS_MASK_MODE_DISABLED) return 0;
    return ZydisRegisterGetId(m);
  }
  // Writes `res` (vl bytes) to the destination operand under the EVEX write mask of `elem`-byte elements:
  // registers are zeroed above vl (VEX and EVEX), memory is written only where the mask allows.
  void vwrite(const Decoded& d, const ZydisDecodedOperand& o, const Vec& res, int vl, int elem, uint64_t next_ip) {
    const int km = mask_reg(d);
    const bool zeroing = d.ins.avx.mask.mode == ZYDIS_MASK_MODE_ZEROING;
    if (is_vec(o) && km == 0) {
      Vec& dst = v[ZydisRegisterGetId(o.reg.value)];
      std::memcpy(dst.u8, res.u8, vl);
      std::memset(dst.u8 + vl, 0, 64 - vl);
    } else if (is_vec(o)) {
      Vec& dst = v[ZydisRegisterGetId(o.reg.value)];
      Vec out{};
      for (int i = 0; i < vl; i += elem) {
        const bool on = km == 0 || ((k[km] >> (i / elem)) & 1);
        if (on) std::memcpy(out.u8 + i, res.u8 + i, elem);
        else if (!zeroing) std::memcpy(out.u8 + i, dst.u8 + i, elem);
      }
      dst = out;
    } else if (o.type == ZYDIS_OPERAND_TYPE_MEMORY) {
      auto* p = reinterpret_cast<uint8_t*>(address(o, next_ip));
      for (int i = 0; i < vl; i += elem)
        if (km == 0 || ((k[km] >> (i / elem)) & 1)) std::memcpy(p + i, res.u8 + i, elem);
    } else {
      throw Error("x86 emulator: unsupported vector destination");
    }
  }

  void run(uint64_t ip, int64_t max_instructions);
  void step_vector(const Decoded& d, uint64_t ip, uint64_t next);
  void step_amx(const Decoded& d, uint64_t ip, uint64_t next);
};

void X86Emulator::State::step_vector(const Decoded& d, uint64_t ip, uint64_t next) {
  const ZydisDecodedOperand& o0 = d.ops[d.op[0]];
  const int vl = o0.size / 8;  // the destination's width
  auto src = [&](int i) { return vread(d, d.ops[d.op[i]], vl, next); };
  auto lanes = [&](int bytes) { return vl / bytes; };
  Vec r{};
  int elem = 4;
  switch (d.ins.mnemonic) {
    case ZYDIS_MNEMONIC_VMOVAPS: case ZYDIS_MNEMONIC_VMOVUPS: case ZYDIS_MNEMONIC_VMOVDQU:
    case ZYDIS_MNEMONIC_VMOVDQA: case ZYDIS_MNEMONIC_VMOVDQU32: case ZYDIS_MNEMONIC_VMOVDQA32:
      r = src(1);
      elem = o0.element_size ? o0.element_size / 8 : 4;
      break;
    case ZYDIS_MNEMONIC_VPBROADCASTD: case ZYDIS_MNEMONIC_VBROADCASTSS: {
      const Vec s = vread(d, d.ops[d.op[1]], 4, next);
      for (int i = 0; i < lanes(4); ++i) r.u32[i] = s.u32[0];
      break;
    }
    case ZYDIS_MNEMONIC_VPAND: case ZYDIS_MNEMONIC_VPANDD: case ZYDIS_MNEMONIC_VPOR: case ZYDIS_MNEMONIC_VPORD:
    case ZYDIS_MNEMONIC_VPXOR: case ZYDIS_MNEMONIC_VPXORD: {
      const Vec a = src(1), b = src(2);
      for (int i = 0; i < lanes(8); ++i) {
        const ZydisMnemonic m = d.ins.mnemonic;
        r.u64[i] = m == ZYDIS_MNEMONIC_VPAND || m == ZYDIS_MNEMONIC_VPANDD ? a.u64[i] & b.u64[i]
                   : m == ZYDIS_MNEMONIC_VPOR || m == ZYDIS_MNEMONIC_VPORD ? a.u64[i] | b.u64[i]
                                                                           : a.u64[i] ^ b.u64[i];
      }
      break;
    }
    case ZYDIS_MNEMONIC_VPADDD: {
      const Vec a = src(1), b = src(2);
      for (int i = 0; i < lanes(4); ++i) r.u32[i] = a.u32[i] + b.u32[i];
      break;
    }
    case ZYDIS_MNEMONIC_VPADDW: {
      const Vec a = src(1), b = src(2);
      for (int i = 0; i < lanes(2); ++i) r.u16[i] = static_cast<uint16_t>(a.u16[i] + b.u16[i]);
      elem = 2;
      break;
    }
    case ZYDIS_MNEMONIC_VPSRLW: case ZYDIS_MNEMONIC_VPSLLW: {
      const Vec a = src(1);
      const ZydisDecodedOperand& c = d.ops[d.op[2]];
      const uint64_t count = c.type == ZYDIS_OPERAND_TYPE_IMMEDIATE ? c.imm.value.u : vread(d, c, 16, next).u64[0];
      for (int i = 0; i < lanes(2); ++i)
        r.u16[i] = count > 15 ? 0
                   : d.ins.mnemonic == ZYDIS_MNEMONIC_VPSRLW ? static_cast<uint16_t>(a.u16[i] >> count)
                                                             : static_cast<uint16_t>(a.u16[i] << count);
      elem = 2;
      break;
    }
    case ZYDIS_MNEMONIC_VPSRAD: {  // arithmetic: counts above 31 fill with the sign
      const Vec a = src(1);
      const ZydisDecodedOperand& c = d.ops[d.op[2]];
      const uint64_t count = c.type == ZYDIS_OPERAND_TYPE_IMMEDIATE ? c.imm.value.u : vread(d, c, 16, next).u64[0];
      for (int i = 0; i < lanes(4); ++i) r.i32[i] = a.i32[i] >> (count > 31 ? 31 : count);
      break;
    }
    case ZYDIS_MNEMONIC_VPMADDUBSW: {  // unsigned bytes of the first source times signed bytes of the second
      const Vec a = src(1), b = src(2);
      for (int i = 0; i < lanes(2); ++i)
        r.i16[i] = sat16(a.u8[2 * i] * b.i8[2 * i] + a.u8[2 * i + 1] * b.i8[2 * i + 1]);
      elem = 2;
      break;
    }
    case ZYDIS_MNEMONIC_VPMADDWD: {
      const Vec a = src(1), b = src(2);
      for (int i = 0; i < lanes(4); ++i)
        r.u32[i] = static_cast<uint32_t>(a.i16[2 * i] * b.i16[2 * i]) + static_cast<uint32_t>(a.i16[2 * i + 1] * b.i16[2 * i + 1]);
      break;
    }
    case ZYDIS_MNEMONIC_VPDPBUSD: {  // dst += unsigned bytes of the first source . signed bytes of the second
      const Vec acc = src(0), a = src(1), b = src(2);
      for (int i = 0; i < lanes(4); ++i) {
        int32_t s = 0;
        for (int j = 0; j < 4; ++j) s += a.u8[4 * i + j] * b.i8[4 * i + j];
        r.u32[i] = acc.u32[i] + static_cast<uint32_t>(s);
      }
      break;
    }
    case ZYDIS_MNEMONIC_VPDPWSSD: {
      const Vec acc = src(0), a = src(1), b = src(2);
      for (int i = 0; i < lanes(4); ++i)
        r.u32[i] = acc.u32[i] + static_cast<uint32_t>(a.i16[2 * i] * b.i16[2 * i]) +
                   static_cast<uint32_t>(a.i16[2 * i + 1] * b.i16[2 * i + 1]);
      break;
    }
    case ZYDIS_MNEMONIC_VPSIGNB: {
      const Vec a = src(1), b = src(2);
      for (int i = 0; i < lanes(1); ++i)
        r.u8[i] = b.i8[i] < 0 ? static_cast<uint8_t>(-a.u8[i]) : b.i8[i] == 0 ? 0 : a.u8[i];
      elem = 1;
      break;
    }
    case ZYDIS_MNEMONIC_VPABSB: {
      const Vec a = src(1);
      for (int i = 0; i < lanes(1); ++i) r.u8[i] = a.i8[i] < 0 ? static_cast<uint8_t>(-a.u8[i]) : a.u8[i];
      elem = 1;
      break;
    }
    case ZYDIS_MNEMONIC_VPMOVZXBD: case ZYDIS_MNEMONIC_VPMOVSXBD: {
      const Vec a = src(1);
      const bool sx = d.ins.mnemonic == ZYDIS_MNEMONIC_VPMOVSXBD;
      for (int i = 0; i < lanes(4); ++i) r.i32[i] = sx ? a.i8[i] : a.u8[i];
      break;
    }
    case ZYDIS_MNEMONIC_VPMOVZXBW: {
      const Vec a = src(1);
      for (int i = 0; i < lanes(2); ++i) r.u16[i] = a.u8[i];
      elem = 2;
      break;
    }
    case ZYDIS_MNEMONIC_VCVTDQ2PS: {
      const Vec a = src(1);
      for (int i = 0; i < lanes(4); ++i) r.f32[i] = static_cast<float>(a.i32[i]);
      break;
    }
    case ZYDIS_MNEMONIC_VCVTPH2PS: {
      const Vec a = src(1);
      for (int i = 0; i < lanes(4); ++i) r.f32[i] = half_to_float(a.u16[i]);
      break;
    }
    case ZYDIS_MNEMONIC_VMULPS: {
      const Vec a = src(1), b = src(2);
      for (int i = 0; i < lanes(4); ++i) r.f32[i] = a.f32[i] * b.f32[i];
      break;
    }
    case ZYDIS_MNEMONIC_VFMADD231PS: case ZYDIS_MNEMONIC_VFMADD213PS: case ZYDIS_MNEMONIC_VFNMADD231PS: {
      const Vec x = src(0), a = src(1), b = src(2);
      for (int i = 0; i < lanes(4); ++i) {
        switch (d.ins.mnemonic) {
          case ZYDIS_MNEMONIC_VFMADD231PS: r.f32[i] = std::fma(a.f32[i], b.f32[i], x.f32[i]); break;
          case ZYDIS_MNEMONIC_VFMADD213PS: r.f32[i] = std::fma(a.f32[i], x.f32[i], b.f32[i]); break;
          default: r.f32[i] = std::fma(-a.f32[i], b.f32[i], x.f32[i]); break;
        }
      }
      break;
    }
    case ZYDIS_MNEMONIC_VMASKMOVPS: {  // the mask is the sign bit of each dword of the middle operand
      const Vec m = vread(d, d.ops[d.op[1]], vl, next);
      const ZydisDecodedOperand& s = d.ops[d.op[2]];
      if (o0.type == ZYDIS_OPERAND_TYPE_MEMORY) {  // store: only where the mask is set
        const Vec x = vread(d, s, vl, next);
        auto* p = reinterpret_cast<uint8_t*>(address(o0, next));
        for (int i = 0; i < lanes(4); ++i)
          if (m.i32[i] < 0) std::memcpy(p + 4 * i, &x.u32[i], 4);
        return;
      }
      const auto* p = reinterpret_cast<const uint8_t*>(address(s, next));  // load: zero where it is clear
      for (int i = 0; i < lanes(4); ++i)
        if (m.i32[i] < 0) std::memcpy(&r.u32[i], p + 4 * i, 4);
      break;
    }
    default:
      fail(d, ip, "instruction outside the modelled subset");
  }
  vwrite(d, o0, r, vl, elem, next);
}

void X86Emulator::State::step_amx(const Decoded& d, uint64_t ip, uint64_t next) {
  auto tmm = [&](int i) { return ZydisRegisterGetId(d.ops[d.op[i]].reg.value); };
  switch (d.ins.mnemonic) {
    case ZYDIS_MNEMONIC_LDTILECFG: {
      const auto* p = reinterpret_cast<const uint8_t*>(address(d.ops[d.op[0]], next));
      if (p[0] != 1) fail(d, ip, "palette " + std::to_string(p[0]));
      for (int t = 0; t < 8; ++t) {
        tile_colsb[t] = p[16 + 2 * t] | p[17 + 2 * t] << 8;
        tile_rows[t] = p[48 + t];
        if (tile_rows[t] > 16 || tile_colsb[t] > 64) fail(d, ip, "tile shape out of range");
      }
      std::memset(tile, 0, sizeof tile);
      return;
    }
    case ZYDIS_MNEMONIC_TILERELEASE:
      std::memset(tile, 0, sizeof tile);
      std::memset(tile_rows, 0, sizeof tile_rows);
      std::memset(tile_colsb, 0, sizeof tile_colsb);
      return;
    case ZYDIS_MNEMONIC_TILEZERO:
      std::memset(tile[tmm(0)], 0, sizeof tile[0]);
      return;
    case ZYDIS_MNEMONIC_TILELOADD: case ZYDIS_MNEMONIC_TILELOADDT1: case ZYDIS_MNEMONIC_TILESTORED: {
      const bool store = d.ins.mnemonic == ZYDIS_MNEMONIC_TILESTORED;
      const ZydisDecodedOperand& m = d.ops[d.op[store ? 0 : 1]];
      const int t = tmm(store ? 1 : 0);
      const uint64_t base = reg_read(m.mem.base, next) + static_cast<uint64_t>(m.mem.disp.value);
      const uint64_t stride = reg_read(m.mem.index, next) * m.mem.scale;
      if (!store) std::memset(tile[t], 0, sizeof tile[t]);
      for (int row = 0; row < tile_rows[t]; ++row) {
        auto* p = reinterpret_cast<uint8_t*>(base + row * stride);
        if (store) std::memcpy(p, tile[t][row], tile_colsb[t]);
        else std::memcpy(tile[t][row], p, tile_colsb[t]);
      }
      return;
    }
    case ZYDIS_MNEMONIC_TDPBSSD: case ZYDIS_MNEMONIC_TDPBSUD: case ZYDIS_MNEMONIC_TDPBUSD: case ZYDIS_MNEMONIC_TDPBUUD: {
      const int c = tmm(0), a = tmm(1), b = tmm(2);
      const ZydisMnemonic mn = d.ins.mnemonic;
      const bool a_signed = mn == ZYDIS_MNEMONIC_TDPBSSD || mn == ZYDIS_MNEMONIC_TDPBSUD;
      const bool b_signed = mn == ZYDIS_MNEMONIC_TDPBSSD || mn == ZYDIS_MNEMONIC_TDPBUSD;
      for (int m = 0; m < tile_rows[c]; ++m)
        for (int n = 0; n < tile_colsb[c] / 4; ++n) {
          uint32_t acc;
          std::memcpy(&acc, &tile[c][m][4 * n], 4);
          for (int kk = 0; kk < tile_colsb[a] / 4; ++kk) {
            int32_t s = 0;
            for (int i = 0; i < 4; ++i) {
              const uint8_t av = tile[a][m][4 * kk + i], bv = tile[b][kk][4 * n + i];
              s += (a_signed ? static_cast<int8_t>(av) : av) * (b_signed ? static_cast<int8_t>(bv) : bv);
            }
            acc += static_cast<uint32_t>(s);
          }
          std::memcpy(&tile[c][m][4 * n], &acc, 4);
        }
      return;
    }
    default:
      fail(d, ip, "instruction outside the modelled subset");
  }
}

void X86Emulator::State::run(uint64_t ip, int64_t max_instructions) {
  executed = 0;
  while (ip != 0) {
    if (++executed > max_instructions) throw Error("x86 emulator: more than the allowed instructions (a runaway loop?)");
    const uint64_t at = ip;
    const Decoded& d = decode(at);
    const uint64_t next = at + d.ins.length;
    const ZydisDecodedOperand* o[4];
    for (int i = 0; i < d.n; ++i) o[i] = &d.ops[d.op[i]];
    const ZydisMnemonic m = d.ins.mnemonic;
    const int bits = d.n > 0 ? o[0]->size : 64;
    ip = next;
    switch (m) {
      case ZYDIS_MNEMONIC_NOP: case ZYDIS_MNEMONIC_PREFETCHT0: case ZYDIS_MNEMONIC_PREFETCHT1:
      case ZYDIS_MNEMONIC_PREFETCHT2: case ZYDIS_MNEMONIC_PREFETCHNTA:
        break;
      case ZYDIS_MNEMONIC_VZEROUPPER:
        for (int i = 0; i < 16; ++i) std::memset(v[i].u8 + 16, 0, 48);
        break;
      case ZYDIS_MNEMONIC_MOV: case ZYDIS_MNEMONIC_KMOVW: case ZYDIS_MNEMONIC_KMOVD: case ZYDIS_MNEMONIC_KMOVQ: {
        uint64_t val = scalar_read(*o[1], next);
        if (m == ZYDIS_MNEMONIC_KMOVW) val &= 0xffff;
        if (m == ZYDIS_MNEMONIC_KMOVD) val &= 0xffffffffu;
        scalar_write(*o[0], val, next);
        break;
      }
      case ZYDIS_MNEMONIC_LEA: scalar_write(*o[0], address(*o[1], next), next); break;
      case ZYDIS_MNEMONIC_ADD: case ZYDIS_MNEMONIC_SUB: case ZYDIS_MNEMONIC_CMP: {
        const uint64_t mask = width_mask(bits);
        const uint64_t a = scalar_read(*o[0], next) & mask, b = scalar_read(*o[1], next) & mask;
        const bool add = m == ZYDIS_MNEMONIC_ADD;
        const uint64_t res = (add ? a + b : a - b) & mask;
        const uint64_t sign = uint64_t{1} << (bits - 1);
        cf = add ? res < a : a < b;
        of = add ? (~(a ^ b) & (a ^ res) & sign) != 0 : ((a ^ b) & (a ^ res) & sign) != 0;
        flags(res, bits);
        if (m != ZYDIS_MNEMONIC_CMP) scalar_write(*o[0], res, next);
        break;
      }
      case ZYDIS_MNEMONIC_INC: case ZYDIS_MNEMONIC_DEC: {  // CF is kept
        const uint64_t mask = width_mask(bits);
        const uint64_t a = scalar_read(*o[0], next) & mask;
        const uint64_t res = (m == ZYDIS_MNEMONIC_INC ? a + 1 : a - 1) & mask;
        const uint64_t sign = uint64_t{1} << (bits - 1);
        of = m == ZYDIS_MNEMONIC_INC ? res == sign : a == sign;
        flags(res, bits);
        scalar_write(*o[0], res, next);
        break;
      }
      case ZYDIS_MNEMONIC_NEG: {
        const uint64_t mask = width_mask(bits);
        const uint64_t a = scalar_read(*o[0], next) & mask, res = (0 - a) & mask;
        cf = a != 0;
        of = a == (uint64_t{1} << (bits - 1));
        flags(res, bits);
        scalar_write(*o[0], res, next);
        break;
      }
      case ZYDIS_MNEMONIC_AND: case ZYDIS_MNEMONIC_OR: case ZYDIS_MNEMONIC_XOR: case ZYDIS_MNEMONIC_TEST: {
        const uint64_t a = scalar_read(*o[0], next), b = scalar_read(*o[1], next);
        const uint64_t res = m == ZYDIS_MNEMONIC_OR ? a | b : m == ZYDIS_MNEMONIC_XOR ? a ^ b : a & b;
        cf = of = false;
        flags(res, bits);
        if (m != ZYDIS_MNEMONIC_TEST) scalar_write(*o[0], res, next);
        break;
      }
      case ZYDIS_MNEMONIC_SHL: case ZYDIS_MNEMONIC_SHR: case ZYDIS_MNEMONIC_SAR: {
        const uint64_t mask = width_mask(bits);
        const int c = static_cast<int>(scalar_read(*o[1], next) & (bits == 64 ? 63 : 31));
        uint64_t a = scalar_read(*o[0], next) & mask, res = a;
        if (c) {
          if (m == ZYDIS_MNEMONIC_SHL) res = (a << c) & mask;
          else if (m == ZYDIS_MNEMONIC_SHR) res = a >> c;
          else res = static_cast<uint64_t>((static_cast<int64_t>(a << (64 - bits)) >> (64 - bits)) >> c) & mask;
          flags(res, bits);
        }
        scalar_write(*o[0], res, next);
        break;
      }
      case ZYDIS_MNEMONIC_IMUL: {
        if (d.n != 3 && d.n != 2) fail(d, at, "imul form");
        const uint64_t a = scalar_read(*o[d.n == 3 ? 1 : 0], next), b = scalar_read(*o[d.n == 3 ? 2 : 1], next);
        scalar_write(*o[0], a * b, next);
        break;
      }
      case ZYDIS_MNEMONIC_CMOVZ: case ZYDIS_MNEMONIC_CMOVNZ: case ZYDIS_MNEMONIC_CMOVNLE: case ZYDIS_MNEMONIC_CMOVLE:
      case ZYDIS_MNEMONIC_CMOVL: case ZYDIS_MNEMONIC_CMOVNL: case ZYDIS_MNEMONIC_CMOVB: case ZYDIS_MNEMONIC_CMOVNB:
      case ZYDIS_MNEMONIC_CMOVBE: case ZYDIS_MNEMONIC_CMOVNBE: case ZYDIS_MNEMONIC_CMOVS: case ZYDIS_MNEMONIC_CMOVNS:
        // A 32-bit cmov zero-extends its destination even when the condition is false.
        scalar_write(*o[0], *cond(m) ? scalar_read(*o[1], next) : scalar_read(*o[0], next), next);
        break;
      case ZYDIS_MNEMONIC_PUSH: push(scalar_read(*o[0], next)); break;
      case ZYDIS_MNEMONIC_POP: scalar_write(*o[0], pop(), next); break;
      case ZYDIS_MNEMONIC_CALL:
        push(next);
        ip = o[0]->type == ZYDIS_OPERAND_TYPE_IMMEDIATE ? next + o[0]->imm.value.u : scalar_read(*o[0], next);
        break;
      case ZYDIS_MNEMONIC_RET: ip = pop(); break;
      case ZYDIS_MNEMONIC_JMP:
        if (o[0]->type != ZYDIS_OPERAND_TYPE_IMMEDIATE) fail(d, at, "indirect jump");
        ip = next + o[0]->imm.value.u;
        break;
      default:
        if (const std::optional<bool> taken = cond(m)) {  // a conditional jump (the cmovs are above)
          if (*taken) ip = next + o[0]->imm.value.u;
        } else if (is_amx(m)) {
          step_amx(d, at, next);
        } else if (d.n > 0 && (is_vec(*o[0]) || o[0]->type == ZYDIS_OPERAND_TYPE_MEMORY)) {
          step_vector(d, at, next);
        } else {
          fail(d, at, "instruction outside the modelled subset");
        }
    }
  }
}

X86Emulator::X86Emulator() : s_(std::make_unique<State>()) {
  ZydisDecoderInit(&s_->dec, ZYDIS_MACHINE_MODE_LONG_64, ZYDIS_STACK_WIDTH_64);
}
X86Emulator::~X86Emulator() = default;

void X86Emulator::call(const uint8_t* entry, const void* arg, int64_t max_instructions) {
  State& s = *s_;
  for (uint64_t& r : s.gpr) r = 0xdeadbeefcafef00dULL;  // garbage in every register the code should not read
  for (Vec& x : s.v) std::memset(x.u8, 0xa5, sizeof x.u8);
  s.gpr[7] = reinterpret_cast<uint64_t>(arg);  // rdi
  s.gpr[4] = (reinterpret_cast<uint64_t>(s.stack.data() + s.stack.size()) & ~uint64_t{63}) - 64;
  s.push(0);  // the return address that ends run()
  s.run(reinterpret_cast<uint64_t>(entry), max_instructions);
}

int64_t X86Emulator::instructions() const { return s_->executed; }

void interpret_kernel(const uint8_t* code, const jit::GemmKernelArgs* args) {
  thread_local X86Emulator emu;
  emu.call(code, args);
}

ScopedKernelInterpreter::ScopedKernelInterpreter(bool on) : on_(on) {
  if (on_) jit::set_kernel_interpreter(interpret_kernel);
}
ScopedKernelInterpreter::~ScopedKernelInterpreter() {
  if (on_) jit::set_kernel_interpreter(nullptr);
}

}  // namespace dllm::test
