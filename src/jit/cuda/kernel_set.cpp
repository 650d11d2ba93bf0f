// Kernel descriptors, their names and launch geometry, and the generated translation unit (kernel_set.h).
#include "jit/cuda/kernel_set.h"

#include <algorithm>
#include <cstdio>
#include <sstream>
#include <utility>

#include "jit/cuda/kernel_text.h"
#include "jit/cuda/kernels/params.cuh"
#include "jit/weight_types.h"
#include "common/error.h"

namespace dllm::jit::cuda {

namespace {

// Threads per block of each family; must match kernels/*.cuh (kQuantThreads, ...; the GEMMs' kTcThreads is params.cuh's).
constexpr unsigned kQuantThreads = 128, kPackThreads = 256, kAttnThreads = 128, kCopyThreads = 256;
constexpr int64_t kAttnQRows = 64;

const char* quant_mode_name(QuantMode m) {
  switch (m) {
    case QuantMode::Plain: return "plain";
    case QuantMode::RmsNorm: return "rmsnorm";
    case QuantMode::SwiGlu: return "swiglu";
  }
  return "?";
}

const char* pack_style_name(PackStyle s) {
  switch (s) {
    case PackStyle::None: return "none";
    case PackStyle::Norm: return "norm";
    case PackStyle::Neox: return "neox";
  }
  return "?";
}

unsigned to_unsigned(int64_t v, const char* what) {
  if (v <= 0 || v > 0x7fffffff) throw Error(std::string("internal error: GPU launch ") + what + " out of range");
  return static_cast<unsigned>(v);
}

}  // namespace

bool weight_format_of(GgmlType t, WeightFormat* out) {
  const WeightTypeTraits* w = weight_traits(t);
  if (!w || !w->gpu) return false;
  *out = t;
  return true;
}

const char* weight_format_name(WeightFormat f) {
  const WeightTypeTraits* w = weight_traits(f);
  return w ? w->tag : "unsupported";
}

ActFormat act_format_for(WeightFormat f) {
  return jit::act_format_for(f) == jit::ActFormat::Q8_0 ? ActFormat::Q8_0 : ActFormat::Q8_K;
}

std::string GemmDesc::name() const {
  return std::string("dllm_gemm_") + weight_format_name(format) + "_n" + std::to_string(n) + "_k" + std::to_string(k);
}
std::string QuantDesc::name() const {
  return std::string("dllm_quant_") + quant_mode_name(mode) + (act == ActFormat::Q8_0 ? "_q8_0" : "_q8_k") + "_k" +
         std::to_string(k);
}
std::string PackDesc::name() const {
  return "dllm_pack_h" + std::to_string(n_head) + "_d" + std::to_string(head_dim) + "_r" + std::to_string(n_rot) +
         "_" + pack_style_name(style) + (transpose ? "_t" : "");
}
std::string GemmGroupDesc::name() const {
  std::string s = "dllm_gemmgrp_k" + std::to_string(members.empty() ? 0 : members[0].k);
  for (const GemmDesc& m : members) s += std::string("_") + weight_format_name(m.format) + "_n" + std::to_string(m.n);
  if (!swiglu) return s;
  return s + (swiglu_act == ActFormat::Q8_0 ? "_swiglu_q8_0" : "_swiglu");
}

bool gemm_group_ok(const std::vector<GemmDesc>& members, bool swiglu) {
  if (members.size() < 2 || members.size() > 3) return false;
  if (swiglu && (members.size() != 2 || members[0].n != members[1].n || members[0].n % 256 != 0)) return false;
  for (const GemmDesc& m : members) {
    if (!tiled_gemm(m.format) || m.k != members[0].k) return false;
  }
  return true;
}

GemmGroupDesc swiglu_group(const GemmDesc& gate, const GemmDesc& up, const GemmDesc& down) {
  GemmGroupDesc g{{gate, up}, true, act_format_for(down.format)};
  if (!gemm_group_ok(g.members, true) || !tiled_gemm(down.format) || down.k != gate.n) return {};
  return g;
}

std::string PackQkvDesc::name() const {
  return "dllm_packqkv_h" + std::to_string(n_head) + "_kv" + std::to_string(n_head_kv) + "_d" + std::to_string(head_dim) +
         "_r" + std::to_string(n_rot) + "_" + pack_style_name(style);
}
std::string AttnDesc::name() const {
  return "dllm_attn_h" + std::to_string(n_head) + "_kv" + std::to_string(n_head_kv) + "_d" + std::to_string(head_dim) +
         (!quant ? "" : quant_act == ActFormat::Q8_0 ? "_quant_q8_0" : "_quant");
}

bool tiled_gemm(WeightFormat f) {
  const WeightTypeTraits* w = weight_traits(f);
  return w && w->gpu;
}

namespace {
// Shared memory per SM of the targets (sm_80, 86, 89, 90), and one block's reservation: the wide tiling never fits twice,
// so its one-block register bound (source()) costs no occupancy.
constexpr int smem_per_sm(int arch) { return arch == 90 ? 228 * 1024 : arch == 80 ? 164 * 1024 : 100 * 1024; }
constexpr bool wide_fits_once(int arch) {
  for (int wt : {6, 8, 12, 13, 14})
    if (2 * (gemm_tc_smem_bytes(wt, arch, false) + 1024) <= smem_per_sm(arch)) return false;
  return true;
}
static_assert(wide_fits_once(80) && wide_fits_once(86) && wide_fits_once(89) && wide_fits_once(90));
const char* tiling_suffix(TcTiling t) { return t == TcTiling::Small ? "_small" : t == TcTiling::Split ? "_split" : ""; }
// Blocks of the wide tiling's grid for one product.
int64_t wide_blocks(const GemmDesc& d, int64_t rows) {
  return padded_ntiles(d.n) * 8 / tc_cols(false) * (pad_rows(rows) / tc_rows(false));
}
// wide_fits: the wide tiling's stages fit the device's shared memory (gemm_tc_fits) for every product of the launch.
TcTiling choose_tiling(int64_t rows, int64_t wide, int sms, bool wide_fits) {
  if (sms > 0 && rows <= kTcSmallRows) return TcTiling::Small;
  return wide < sms || !wide_fits ? TcTiling::Split : TcTiling::Wide;
}
bool wide_fits(const GemmDesc& d, int arch) { return gemm_tc_fits(static_cast<int>(d.format), arch, false); }
}  // namespace

TcTiling gemm_tiling(const GemmDesc& d, int64_t rows, int arch, int sms) {
  return choose_tiling(rows, wide_blocks(d, rows), sms, wide_fits(d, arch));
}

std::string gemm_kernel_name(const GemmDesc& d, int64_t rows, int arch, int sms) {
  return d.name() + tiling_suffix(gemm_tiling(d, rows, arch, sms));
}

Launch gemm_launch(const GemmDesc& d, int64_t rows, int arch, int sms) {
  static_assert(kRowPad % tc_rows(false) == 0, "tiles must divide the padding");
  if (!tiled_gemm(d.format)) throw Error(std::string("internal error: no GPU GEMM for ") + weight_format_name(d.format));
  const TcTiling t = gemm_tiling(d, rows, arch, sms);
  const int wt = static_cast<int>(d.format);
  if (t == TcTiling::Small) {  // persistent blocks, one per SM
    const int64_t items = tc_small_items(static_cast<int>(d.n), static_cast<int>(d.k));
    return {to_unsigned(std::min<int64_t>(items, sms), "grid"), 1,
            static_cast<unsigned>(kTcThreads), static_cast<unsigned>(gemm_tc_small_smem_bytes(wt, arch))};
  }
  const bool split = t == TcTiling::Split;
  return {to_unsigned(padded_ntiles(d.n) * 8 / tc_cols(split), "grid"), to_unsigned(pad_rows(rows) / tc_rows(split), "grid"),
          static_cast<unsigned>(kTcThreads), static_cast<unsigned>(gemm_tc_smem_bytes(wt, arch, split))};
}
TcTiling gemm_group_tiling(const GemmGroupDesc& g, int64_t rows, int arch, int sms) {
  int64_t wide = 0;
  bool fits = true;
  for (const GemmDesc& m : g.members) wide += wide_blocks(m, rows), fits = fits && wide_fits(m, arch);
  return choose_tiling(rows, wide, sms, fits);
}
Launch gemm_group_launch(const GemmGroupDesc& g, int64_t rows, int arch, int sms) {
  const TcTiling t = gemm_group_tiling(g, rows, arch, sms);
  const bool split = t != TcTiling::Wide;
  Launch l{0, t == TcTiling::Small ? 1u : to_unsigned(pad_rows(rows) / tc_rows(split), "grid"),
           static_cast<unsigned>(kTcThreads), 0};
  int64_t items = 0;
  for (const GemmDesc& m : g.members) {
    const int wt = static_cast<int>(m.format);
    items += tc_small_items(static_cast<int>(m.n), static_cast<int>(m.k));
    l.grid_x += to_unsigned(padded_ntiles(m.n) * 8 / tc_cols(split), "grid");
    l.shared_bytes = std::max(l.shared_bytes, static_cast<unsigned>(t == TcTiling::Small ? gemm_tc_small_smem_bytes(wt, arch)
                                                                                          : gemm_tc_smem_bytes(wt, arch, split)));
  }
  if (t == TcTiling::Small) l.grid_x = to_unsigned(std::min<int64_t>(items, sms), "grid");  // persistent, one per SM
  return l;
}
std::string gemm_group_kernel_name(const GemmGroupDesc& g, int64_t rows, int arch, int sms) {
  return g.name() + tiling_suffix(gemm_group_tiling(g, rows, arch, sms));
}
size_t gemm_small_part_bytes(const GemmDesc& d) {
  return tiled_gemm(d.format) ? static_cast<size_t>(tc_small_part_floats(static_cast<int>(d.n), static_cast<int>(d.k))) * 4 : 0;
}
size_t gemm_small_counters(const GemmDesc& d) {
  return tiled_gemm(d.format) ? static_cast<size_t>(tc_small_counters(static_cast<int>(d.n), static_cast<int>(d.k))) : 0;
}
Launch row_copy_launch(int64_t rows) { return {to_unsigned(rows, "grid"), 1, kCopyThreads}; }
Launch quant_launch(int64_t rows) { return {to_unsigned(pad_rows(rows), "grid"), 1, kQuantThreads}; }
unsigned pack_blocks(const PackDesc& d, int64_t rows) {
  const int64_t threads = pad_rows(rows) * d.n_head * (d.head_dim / 2);
  return to_unsigned((threads + kPackThreads - 1) / kPackThreads, "grid");
}
Launch pack_launch(const PackDesc& d, int64_t rows) { return {pack_blocks(d, rows), 1, kPackThreads}; }
Launch attn_launch(const AttnDesc& d, int64_t n_q) {
  // One block per 64 query rows, head and 128-wide output slice (heads wider than 128: attention.cuh).
  const int64_t slices = d.head_dim > 128 ? d.head_dim / 128 : 1;
  return {to_unsigned(pad_rows(n_q) / kAttnQRows, "grid"), to_unsigned(d.n_head * slices, "grid"), kAttnThreads};
}

size_t act_bytes(int64_t rows, int64_t k) { return static_cast<size_t>(pad_rows(rows) * padded_kblocks(k) * 32); }
size_t act_scale_bytes(int64_t rows, int64_t k) {
  return static_cast<size_t>(pad_rows(rows) * padded_kblocks(k)) * sizeof(float);
}
size_t act_sum_bytes(int64_t rows, int64_t k) {
  return static_cast<size_t>(pad_rows(rows) * padded_kblocks(k)) * 2 * sizeof(int16_t);
}

void KernelSet::add(const KernelSet& o) {
  gemm_.insert(o.gemm_.begin(), o.gemm_.end());
  group_.insert(o.group_.begin(), o.group_.end());
  quant_.insert(o.quant_.begin(), o.quant_.end());
  pack_.insert(o.pack_.begin(), o.pack_.end());
  pack_qkv_.insert(o.pack_qkv_.begin(), o.pack_qkv_.end());
  attn_.insert(o.attn_.begin(), o.attn_.end());
  row_copy_ = row_copy_ || o.row_copy_;
}

std::vector<std::string> KernelSet::names() const {
  std::vector<std::string> out;
  for (const auto& d : quant_) out.push_back(d.name());
  for (const auto& d : gemm_) {
    out.push_back(d.name());
    out.push_back(d.name() + "_split");
    out.push_back(d.name() + "_small");
  }
  for (const auto& d : group_) {
    out.push_back(d.name());
    out.push_back(d.name() + "_split");
    out.push_back(d.name() + "_small");
  }
  for (const auto& d : pack_) out.push_back(d.name());
  for (const auto& d : pack_qkv_) out.push_back(d.name());
  for (const auto& d : attn_) out.push_back(d.name());
  if (row_copy_) out.push_back(kRowCopyKernel);
  return out;
}

bool KernelSet::contains(const std::string& kernel_name) const {
  for (const std::string& n : names()) {
    if (n == kernel_name) return true;
  }
  return false;
}

std::string KernelSet::source() const {
  std::ostringstream s;
  s << "// Generated by dllm (src/jit/cuda/kernel_set.cpp): device code, then one entry point per shape.\n";
  for (const KernelFile& f : kernel_files()) s << "// ---- " << f.name << "\n" << f.text << "\n";
  s << "// ---- entry points\n";
  for (const auto& d : quant_) {
    s << "extern \"C\" __global__ void __launch_bounds__(" << kQuantThreads << ") " << d.name()
      << "(const QuantRowsParams p) { quant_rows_body<" << static_cast<int>(d.mode) << ", " << static_cast<int>(d.act)
      << ", " << d.k << ">(p); }\n";
  }
  for (const auto& d : gemm_) {
    // The wide tiling's shared memory allows one block per SM on every target (wide_fits_once): up to 255 registers,
    // room for its split-K total. The split tiling runs two: at most 128. The small-row kernel runs one with a deeper
    // pipeline (gemm_tc_small_stages).
    for (const bool split : {false, true}) {
      s << "extern \"C\" __global__ void __launch_bounds__(" << kTcThreads << ", " << (split ? 2 : 1) << ") " << d.name()
        << (split ? "_split" : "") << "(const GemmParams p) { gemm_tc_body<" << static_cast<int>(d.format) << ", "
        << d.n << ", " << d.k << ", " << (split ? "true" : "false") << ">(p); }\n";
    }
    s << "extern \"C\" __global__ void __launch_bounds__(" << kTcThreads << ", 1) " << d.name()
      << "_small(const GemmParams p) { gemm_tc_small_body<" << static_cast<int>(d.format) << ", " << d.n << ", " << d.k
      << ">(p); }\n";
  }
  for (const auto& d : pack_) {
    s << "extern \"C\" __global__ void __launch_bounds__(" << kPackThreads << ") " << d.name()
      << "(const PackParams p) { pack_heads_body<" << d.n_head << ", " << d.head_dim << ", " << d.n_rot << ", "
      << static_cast<int>(d.style) << ", " << (d.transpose ? 1 : 0) << ">(p); }\n";
  }
  for (const auto& d : group_) {  // as the tiled GEMMs, wide and split, but one block per SM: the members' code in one
    // kernel needs more than 128 registers (ptxas spills at 2 blocks); the wide tiling's shared memory allows one anyway
    for (const TcTiling t : {TcTiling::Wide, TcTiling::Split, TcTiling::Small}) {
      s << "extern \"C\" __global__ void __launch_bounds__(" << kTcThreads << ", 1) " << d.name() << tiling_suffix(t)
        << "(const GemmGroupParams p) { ";
      if (t == TcTiling::Small) s << "gemm_tc_group_small_body<" << d.members[0].k;
      else s << "gemm_tc_group_body<" << (t == TcTiling::Split ? "true" : "false") << ", " << d.members[0].k;
      for (size_t i = 0; i < 3; ++i) {
        if (i < d.members.size()) s << ", " << static_cast<int>(d.members[i].format) << ", " << d.members[i].n;
        else s << ", 0, 0";
      }
      if (d.swiglu) s << ", true, " << static_cast<int>(d.swiglu_act);
      s << ">(p); }\n";
    }
  }
  for (const auto& d : pack_qkv_) {
    s << "extern \"C\" __global__ void __launch_bounds__(" << kPackThreads << ") " << d.name()
      << "(const PackQkvParams p) { pack_qkv_body<" << d.n_head << ", " << d.n_head_kv << ", " << d.head_dim << ", "
      << d.n_rot << ", " << static_cast<int>(d.style) << ">(p); }\n";
  }
  for (const auto& d : attn_) {
    s << "extern \"C\" __global__ void __launch_bounds__(" << kAttnThreads << ") " << d.name()
      << "(const AttnParams p) { attention_body<" << d.n_head << ", " << d.n_head_kv << ", " << d.head_dim
      << (d.quant ? ", true, " + std::to_string(static_cast<int>(d.quant_act)) : std::string()) << ">(p); }\n";
  }
  if (row_copy_) {
    s << "extern \"C\" __global__ void __launch_bounds__(" << kCopyThreads << ") " << kRowCopyKernel
      << "(const RowCopyParams p) { copy_rows_body(p); }\n";
  }
  return s.str();
}

std::string KernelSet::unit_name() const { return "dllm_kernels_" + hash_hex(source()); }

std::string hash_hex(const std::string& bytes) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 1099511628211ull;
  }
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

PackDesc q_pack_desc(const model::HParams& hp) {
  return {hp.n_head, hp.head_dim, hp.n_rot, hp.rope_style == model::RopeStyle::Neox ? PackStyle::Neox : PackStyle::Norm,
          false};
}
PackDesc k_pack_desc(const model::HParams& hp) {
  PackDesc d = q_pack_desc(hp);
  d.n_head = hp.n_head_kv;
  return d;
}
PackDesc v_pack_desc(const model::HParams& hp) { return {hp.n_head_kv, hp.head_dim, hp.n_rot, PackStyle::None, true}; }
AttnDesc attn_desc(const model::HParams& hp) { return {hp.n_head, hp.n_head_kv, hp.head_dim}; }

AttentionKernels attention_kernels(const model::RopeSpec& rope, const model::AttentionShape& sh) {
  const PackStyle style = rope.style == model::RopeStyle::Neox ? PackStyle::Neox : PackStyle::Norm;
  return {PackDesc{sh.n_head, sh.head_dim, rope.n_rot, style, false},
          PackDesc{sh.n_head_kv, sh.head_dim, rope.n_rot, style, false},
          PackDesc{sh.n_head_kv, sh.head_dim, rope.n_rot, PackStyle::None, true},
          PackQkvDesc{sh.n_head, sh.n_head_kv, sh.head_dim, rope.n_rot, style},
          AttnDesc{sh.n_head, sh.n_head_kv, sh.head_dim}};
}

void add_attention_kernels(KernelSet& set, const model::HParams& hp, const std::vector<ActFormat>& quant_acts) {
  for (int64_t l = 0; l < std::max<int64_t>(hp.n_layer, 1); ++l) {
    const model::LayerAttention g = hp.attn(l);
    const AttentionKernels a = attention_kernels(model::RopeSpec{hp.rope_style, g.n_rot, g.rope_base},
                                                 model::AttentionShape{hp.n_head, g.n_head_kv, g.head_dim, 0.f});
    set.add(a.qkv);
    set.add(a.attn);
    // The output projection's quantiser in the attention's launch (not for Gemma-4, whose output goes through a norm).
    if (!hp.prompt_regions && attn_quant_ok(static_cast<int>(hp.n_head), static_cast<int>(g.head_dim))) {
      for (const ActFormat f : quant_acts) {
        AttnDesc q = a.attn;
        q.quant = true;
        q.quant_act = f;
        set.add(q);
      }
    }
  }
}

namespace {

// f(matrix, rows of one of its products) for every matrix the forward program multiplies by: a fused gate_up
// expert tensor's products are its gate and up halves, every other matrix's its ne1 rows.
template <class F>
void for_each_matrix(const model::ModelTensors& t, F&& f) {
  for (const model::LayerTensors& l : t.layers) {
    for (const gguf::TensorInfo* m : l.matrices()) f(*m, m == l.ffn_gate_up_exps ? m->ne[1] / 2 : m->ne[1]);
  }
  for (const gguf::TensorInfo* m : {t.self_cond_gate, t.self_cond_up, t.self_cond_down, t.output})
    if (m) f(*m, m->ne[1]);
}

}  // namespace

std::string gpu_support_error(const model::ModelTensors& tensors) {
  std::string err;
  for_each_matrix(tensors, [&](const gguf::TensorInfo& m, int64_t rows) {
    if (!err.empty()) return;
    WeightFormat f = WeightFormat::Q8_0;
    if (!weight_format_of(m.type(), &f)) {
      err = "tensor " + std::string(m.name) + " is " + ggml_type_name(m.type_id) +
            ": the GPU backend has matrix kernels for " + gpu_type_list() + " (run with --device cpu)";
    } else if (rows % 8 != 0) {
      err = "tensor " + std::string(m.name) + " has " + std::to_string(rows) +
            " rows: the GPU matrix kernels need a multiple of 8 (run with --device cpu)";
    }
  });
  return err;
}

std::string head_dim_error(int64_t head_dim, int64_t n_rot) {
  const bool narrow = head_dim % 16 == 0 && head_dim > 0 && head_dim <= 128;
  const bool wide = head_dim % 128 == 0 && head_dim > 128 && head_dim <= 512;
  if ((narrow || wide) && n_rot % 2 == 0 && n_rot <= head_dim) return {};
  return "head dimension " + std::to_string(head_dim) + " (rotating " + std::to_string(n_rot) +
         "): the GPU attention kernel needs a multiple of 16 up to 128 or of 128 up to 512 (run with --device cpu)";
}

std::string attention_geometry_error(const model::HParams& hp) {
  for (int64_t l = 0; l < std::max<int64_t>(hp.n_layer, 1); ++l) {
    const model::LayerAttention g = hp.attn(l);
    if (std::string err = head_dim_error(g.head_dim, g.n_rot); !err.empty())
      return hp.layer_attn.empty() ? err : "layer " + std::to_string(l) + ": " + err;
  }
  return {};
}

std::string gpu_model_error(const model::HParams& hp, const model::ModelTensors& tensors) {
  if (std::string err = gpu_support_error(tensors); !err.empty()) return err;
  return attention_geometry_error(hp);
}

KernelSet kernels_for_model(const model::HParams& hp, const model::ModelTensors& tensors) {
  if (const std::string err = gpu_model_error(hp, tensors); !err.empty()) throw Error(err);
  KernelSet set;
  for_each_matrix(tensors, [&](const gguf::TensorInfo& m, int64_t rows) {
    WeightFormat f = WeightFormat::Q8_0;
    weight_format_of(m.type(), &f);
    set.add(GemmDesc{f, rows, m.ne[0]});
  });
  // The activation quantisers, in the format of each matrix that reads them.
  auto quant = [&](QuantMode mode, const gguf::TensorInfo* m) {
    WeightFormat f = WeightFormat::Q8_0;
    weight_format_of(m->type(), &f);
    set.add(QuantDesc{mode, act_format_for(f), m->ne[0]});
  };
  for (const model::LayerTensors& l : tensors.layers) {
    for (const gguf::TensorInfo* m : {l.wq, l.wk, l.wv, l.ffn_gate, l.ffn_up}) {
      if (m) quant(QuantMode::RmsNorm, m);
    }
    quant(QuantMode::Plain, l.wo);  // attention output -> output projection
    // gate, up -> down projection: SwiGLU fused into its quantiser; Gemma's GELU-tanh GeGLU on the host,
    // then quantised plain
    if (l.ffn_down) quant(hp.prompt_regions ? QuantMode::Plain : QuantMode::SwiGlu, l.ffn_down);
    // Experts: their rows are normed and gathered on the host, then quantised plain for gate/up and down.
    for (const gguf::TensorInfo* m : {l.ffn_gate_exps, l.ffn_gate_up_exps, l.ffn_down_exps}) {
      if (m) quant(QuantMode::Plain, m);
    }
  }
  if (tensors.self_cond_gate) {  // self-conditioning's GeGLU MLP, as the shared one
    quant(QuantMode::RmsNorm, tensors.self_cond_gate);
    quant(QuantMode::Plain, tensors.self_cond_down);
  }
  quant(QuantMode::RmsNorm, tensors.output);  // final norm -> LM head
  // The products that share one launch (prepare_forward_weights announces the same groups to the executor).
  const auto desc = [](const gguf::TensorInfo* m) {
    WeightFormat f = WeightFormat::Q8_0;
    weight_format_of(m->type(), &f);
    return GemmDesc{f, m->ne[1], m->ne[0]};
  };
  const auto group = [&](std::initializer_list<const gguf::TensorInfo*> ms) {
    GemmGroupDesc g;
    for (const gguf::TensorInfo* m : ms) {
      if (!m) return;
      g.members.push_back(desc(m));
    }
    if (gemm_group_ok(g.members)) set.add(g);
  };
  for (const model::LayerTensors& l : tensors.layers) {
    if (l.wv) {
      group({l.wq, l.wk, l.wv});
      group({l.wk, l.wv});
    } else {
      group({l.wq, l.wk});
    }
    group({l.ffn_gate, l.ffn_up});
    if (l.ffn_gate && l.ffn_up && l.ffn_down && !hp.prompt_regions) {  // SwiGLU layers: the gate/up launch quantises
      const GemmGroupDesc g = swiglu_group(desc(l.ffn_gate), desc(l.ffn_up), desc(l.ffn_down));
      if (!g.members.empty()) set.add(g);
    }
  }
  group({tensors.self_cond_gate, tensors.self_cond_up});
  std::vector<ActFormat> quant_acts;  // the output projections' activation formats (the set keeps each kernel once)
  for (const model::LayerTensors& l : tensors.layers) {
    if (l.wo) quant_acts.push_back(act_format_for(desc(l.wo).format));
  }
  add_attention_kernels(set, hp, quant_acts);
  set.add_row_copy();
  return set;
}

KernelSet kernels_for_hparams(const model::HParams& hp, const std::vector<WeightFormat>& formats) {
  KernelSet set;
  const int64_t D = hp.n_embd, Q = hp.q_dim(), KV = hp.kv_dim(), F = hp.n_ff, V = hp.n_vocab;
  for (WeightFormat f : formats) {
    for (const auto& [n, k] : {std::pair{Q, D}, {KV, D}, {D, Q}, {F, D}, {D, F}, {V, D}}) set.add(GemmDesc{f, n, k});
  }
  for (WeightFormat f : formats) {
    const ActFormat a = act_format_for(f);
    set.add(QuantDesc{QuantMode::RmsNorm, a, D});
    set.add(QuantDesc{QuantMode::SwiGlu, a, F});
    for (int64_t k : {D, Q, F}) set.add(QuantDesc{QuantMode::Plain, a, k});
  }
  set.add(q_pack_desc(hp));
  set.add(k_pack_desc(hp));
  set.add(v_pack_desc(hp));
  set.add(PackDesc{hp.n_head, hp.head_dim, hp.head_dim, PackStyle::None, false});
  set.add(PackDesc{hp.n_head_kv, hp.head_dim, hp.head_dim, PackStyle::None, false});
  set.add(PackDesc{hp.n_head_kv, hp.head_dim, hp.head_dim, PackStyle::None, true});
  set.add(attn_desc(hp));
  std::vector<ActFormat> quant_acts;
  for (WeightFormat f : formats) quant_acts.push_back(act_format_for(f));
  add_attention_kernels(set, hp, quant_acts);  // the fused packs the forward program runs
  set.add_row_copy();
  return set;
}

}  // namespace dllm::jit::cuda
