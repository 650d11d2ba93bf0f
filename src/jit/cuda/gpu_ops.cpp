// GPU operations (gpu_ops.h): parameter structs filled from device buffers and launched by kernel name.
#include "jit/cuda/gpu_ops.h"

#include <cmath>

#include "jit/cuda/kernels/params.cuh"
#include "common/error.h"

namespace dllm::jit::cuda {

static_assert(sizeof(QuantRowsParams) == 72 && sizeof(GemmParams) == 80 && sizeof(PackParams) == 64 &&
                  sizeof(AttnParams) == 152,
              "kernel parameter structs must keep the layout the device code expects");

void ActBuffers::ensure(Device& dev, int64_t rows, int64_t k) {
  const size_t qb = act_bytes(rows, k), sb = act_scale_bytes(rows, k);
  if (q.bytes() < qb) q = DeviceBuffer(dev, qb);
  if (da.bytes() < sb) da = DeviceBuffer(dev, sb);
  if (bs.bytes() < act_sum_bytes(rows, k)) bs = DeviceBuffer(dev, act_sum_bytes(rows, k));
}

void GemmWorkspace::ensure(Device& dev, size_t part_bytes, size_t counters, size_t span_counters) {
  if (span.bytes() < span_counters * sizeof(unsigned)) {
    span.reset();
    span = DeviceBuffer(dev, span_counters * sizeof(unsigned));
    dev.zero(span.addr(), span_counters * sizeof(unsigned));
  }
  if (part.bytes() < part_bytes) {
    part.reset();
    part = DeviceBuffer(dev, part_bytes);
  }
  const size_t cb = counters * sizeof(unsigned);
  if (count.bytes() < cb) {
    count.reset();
    count = DeviceBuffer(dev, cb);
    dev.zero(count.addr(), cb);
  }
}

DevAddr Scratch::get(Device& dev, size_t bytes) {
  if (buf.bytes() < bytes) {
    buf.reset();
    buf = DeviceBuffer(dev, bytes + bytes / 4);  // some headroom for a growing canvas
  }
  return buf.addr();
}

void gpu_quant(Device& dev, QuantMode mode, ActFormat fmt, int64_t k, DevAddr x, DevAddr x2, DevAddr w,
               DevAddr row_map, int64_t rows, int64_t ld, float eps, ActBuffers& act) {
  act.ensure(dev, rows, k);
  act.format = fmt;
  act.rows = rows;
  act.k = k;
  QuantRowsParams p{};
  p.x = dev_ptr<const float>(x);
  p.x2 = dev_ptr<const float>(x2);
  p.w = dev_ptr<const float>(w);
  p.row_map = dev_ptr<const int>(row_map);
  p.q = dev_ptr<unsigned char>(act.q.addr());
  p.da = dev_ptr<float>(act.da.addr());
  p.bs = dev_ptr<short>(act.bs.addr());
  p.rows = static_cast<int>(rows);
  p.ld = static_cast<int>(ld);
  p.eps = eps;
  dev.launch(QuantDesc{mode, fmt, k}.name(), quant_launch(rows), &p, sizeof p);
}

void gpu_quant_for(Device& dev, QuantMode mode, std::span<const GpuWeight* const> readers, DevAddr x, DevAddr x2,
                   DevAddr w, DevAddr row_map, int64_t rows, int64_t ld, float eps, ActPair& act) {
  bool done[2] = {false, false};
  for (const GpuWeight* r : readers) {
    const ActFormat f = act_format_for(r->layout.format);
    const size_t i = static_cast<size_t>(f);
    if (done[i]) continue;
    gpu_quant(dev, mode, f, r->layout.k, x, x2, w, row_map, rows, ld, eps, act[i]);
    done[i] = true;
  }
}

namespace {
// act_row0: the first activation row the product reads (a multiple of kRowPad; the GEMM's tiles start there).
GemmParams gemm_params(const GpuWeight& w, const ActBuffers& act, int64_t rows, DevAddr y, int64_t ldy, bool accumulate,
                       int64_t act_row0 = 0) {
  if (act.k != w.layout.k || act.format != act_format_for(w.layout.format) || act_row0 % kRowPad != 0 ||
      act_row0 + rows > act.rows || act.q.bytes() < act_bytes(act_row0 + rows, w.layout.k)) {
    throw Error("internal error: the activations quantised for " + w.name + " do not fit it");
  }
  const int64_t kbp = padded_kblocks(w.layout.k);
  GemmParams p{};
  p.a = dev_ptr<const unsigned char>(act.q.addr() + static_cast<size_t>(act_row0 / 16 * kbp * 512));
  p.da = dev_ptr<const float>(act.da.addr() + static_cast<size_t>(act_row0 * kbp) * sizeof(float));
  p.bs = dev_ptr<const short>(act.bs.addr() + static_cast<size_t>(act_row0 * kbp * 2) * sizeof(short));
  p.w = dev_ptr<const unsigned char>(w.quants.addr());
  p.ws = dev_ptr<const float>(w.scales.addr());
  p.y = dev_ptr<float>(y);
  p.rows = static_cast<int>(rows);
  p.ldy = static_cast<int>(ldy);
  p.accumulate = accumulate ? 1 : 0;
  return p;
}
}  // namespace

void gpu_gemm(Device& dev, GemmWorkspace& ws, const GpuWeight& w, const ActBuffers& act, int64_t rows, DevAddr y,
              int64_t ldy, bool accumulate, int64_t act_row0) {
  GemmParams p = gemm_params(w, act, rows, y, ldy, accumulate, act_row0);
  const GemmDesc d = w.desc();
  if (gemm_tiling(d, rows, dev.arch(), dev.sm_count()) == TcTiling::Small) {
    ws.ensure(dev, gemm_small_part_bytes(d), gemm_small_counters(d));
    p.part = ws.part.as<float>();
    p.count = ws.count.as<unsigned>();
  }
  dev.launch(gemm_kernel_name(d, rows, dev.arch(), dev.sm_count()), gemm_launch(d, rows, dev.arch(), dev.sm_count()), &p, sizeof p);
}

GemmGroupDesc gemm_group_of(std::span<const GpuWeight* const> ws) {
  GemmGroupDesc g;
  for (const GpuWeight* w : ws) g.members.push_back(w->desc());
  return g;
}

namespace {
// The launch of a group (gpu_gemm_group, gpu_gemm_group_swiglu): the members' parameters and small-row workspaces.
void launch_group(Device& dev, GemmWorkspace& work, const GemmGroupDesc& g, std::span<const GpuWeight* const> ws,
                  const ActPair& act, int64_t rows, std::span<const DevAddr> ys, std::span<const int64_t> ldys,
                  GemmGroupParams& p) {
  if (!gemm_group_ok(g.members, g.swiglu) || ys.size() != ws.size() || ldys.size() != ws.size()) {
    throw Error("internal error: products that cannot share a launch");
  }
  for (size_t i = 0; i < ws.size(); ++i) {
    const ActBuffers& a = act[static_cast<size_t>(act_format_for(ws[i]->layout.format))];
    p.m[i] = gemm_params(*ws[i], a, rows, ys[i], ldys[i], false);
  }
  if (gemm_group_tiling(g, rows, dev.arch(), dev.sm_count()) == TcTiling::Small) {  // the members' workspaces side by side
    size_t part = 0, counters = 0;
    for (const GemmDesc& m : g.members) part += gemm_small_part_bytes(m), counters += gemm_small_counters(m);
    work.ensure(dev, part, counters);
    part = counters = 0;
    for (size_t i = 0; i < ws.size(); ++i) {
      p.m[i].part = dev_ptr<float>(work.part.addr() + part);
      p.m[i].count = dev_ptr<unsigned>(work.count.addr() + counters * sizeof(unsigned));
      part += gemm_small_part_bytes(g.members[i]);
      counters += gemm_small_counters(g.members[i]);
    }
  }
  dev.launch(gemm_group_kernel_name(g, rows, dev.arch(), dev.sm_count()), gemm_group_launch(g, rows, dev.arch(), dev.sm_count()), &p,
             sizeof p);
}
}  // namespace

void gpu_gemm_group(Device& dev, GemmWorkspace& work, std::span<const GpuWeight* const> ws, const ActPair& act,
                    int64_t rows, std::span<const DevAddr> ys, std::span<const int64_t> ldys) {
  GemmGroupParams p{};
  launch_group(dev, work, gemm_group_of(ws), ws, act, rows, ys, ldys, p);
}

void gpu_gemm_group_swiglu(Device& dev, GemmWorkspace& work, std::span<const GpuWeight* const> ws, const ActPair& act,
                           int64_t rows, std::span<const DevAddr> ys, int64_t ldy, ActFormat fmt, ActBuffers& out) {
  GemmGroupDesc g = gemm_group_of(ws);
  g.swiglu = true;
  g.swiglu_act = fmt;
  const int64_t f = ws.empty() ? 0 : ws[0]->layout.n;
  for (const ActBuffers& a : act) {
    if (&a == &out) throw Error("internal error: the SwiGLU quantiser would overwrite the group's input");
  }
  out.ensure(dev, rows, f);
  out.format = fmt;
  out.rows = rows;
  out.k = f;
  // Counters for the finest row tiles (32 rows: the split tiling and the small-row kernel) of every 256 columns.
  work.ensure(dev, 0, 0, static_cast<size_t>(pad_rows(rows) / 32 * (f / 256)));
  GemmGroupParams p{};
  p.q.x = dev_ptr<const float>(ys.empty() ? 0 : ys[0]);
  p.q.x2 = dev_ptr<const float>(ys.size() < 2 ? 0 : ys[1]);
  p.q.q = dev_ptr<unsigned char>(out.q.addr());
  p.q.da = dev_ptr<float>(out.da.addr());
  p.q.bs = dev_ptr<short>(out.bs.addr());
  p.q.rows = static_cast<int>(rows);
  p.q.ld = static_cast<int>(ldy);
  p.span = work.span.as<unsigned>();
  const int64_t ldys[2] = {ldy, ldy};
  launch_group(dev, work, g, ws, act, rows, ys, std::span<const int64_t>(ldys, ys.size() < 2 ? ys.size() : 2), p);
}

namespace {
PackParams pack_params(DevAddr x, int64_t rows, int64_t ld, DevAddr bias, DevAddr cos_t, DevAddr sin_t, DevAddr pos,
                       DevAddr out) {
  PackParams p{};
  p.x = dev_ptr<const float>(x);
  p.bias = dev_ptr<const float>(bias);
  p.cos_t = dev_ptr<const double>(cos_t);
  p.sin_t = dev_ptr<const double>(sin_t);
  p.pos = dev_ptr<const int>(pos);
  p.out = dev_ptr<unsigned short>(out);
  p.rows = static_cast<int>(rows);
  p.rows_pad = static_cast<int>(pad_rows(rows));
  p.ld = static_cast<int>(ld);
  return p;
}
}  // namespace

void gpu_pack(Device& dev, const PackDesc& d, DevAddr x, int64_t rows, int64_t ld, DevAddr bias, DevAddr cos_t,
              DevAddr sin_t, DevAddr pos, DevAddr out) {
  const PackParams p = pack_params(x, rows, ld, bias, cos_t, sin_t, pos, out);
  dev.launch(d.name(), pack_launch(d, rows), &p, sizeof p);
}

void gpu_pack_qkv(Device& dev, const AttentionKernels& a, const PackArgs& q, const PackArgs& k, const PackArgs& v,
                  DevAddr cos_t, DevAddr sin_t) {
  PackQkvParams p{};
  p.q = pack_params(q.x, q.rows, q.ld, q.bias, cos_t, sin_t, q.pos, q.out);
  p.k = pack_params(k.x, k.rows, k.ld, k.bias, cos_t, sin_t, k.pos, k.out);
  p.v = pack_params(v.x, v.rows, v.ld, v.bias, 0, 0, 0, v.out);
  const unsigned bq = pack_blocks(a.q, q.rows), bk = pack_blocks(a.k, k.rows), bv = pack_blocks(a.v, v.rows);
  p.blocks_q = static_cast<int>(bq);
  p.blocks_k = static_cast<int>(bk);
  Launch l = pack_launch(a.q, q.rows);
  l.grid_x = bq + bk + bv;
  dev.launch(a.qkv.name(), l, &p, sizeof p);
}

void gpu_attention(Device& dev, const AttnDesc& d, DevAddr q, int64_t n_q, DevAddr k, DevAddr vt, int64_t n_kv,
                   float scale, DevAddr out, DevAddr ranges, const AttnQuant* quant) {
  AttnParams p{};
  AttnDesc desc = d;
  if (quant) {  // the quantising variant: rows [row0, row0 + n_q) of quant->act
    ActBuffers& a = *quant->act;
    const int64_t k = d.n_head * d.head_dim;
    if (!attn_quant_ok(static_cast<int>(d.n_head), static_cast<int>(d.head_dim)) || a.k != k ||
        quant->row0 + n_q > a.rows || a.q.bytes() < act_bytes(a.rows, k)) {
      throw Error("internal error: the attention's output does not fit the buffers it would quantise into");
    }
    desc.quant = true;
    desc.quant_act = a.format;
    quant->work->ensure(dev, 0, 0, static_cast<size_t>(attn_launch(d, n_q).grid_x) * static_cast<size_t>(k / 256));
    p.quant.q = dev_ptr<unsigned char>(a.q.addr());
    p.quant.da = dev_ptr<float>(a.da.addr());
    p.quant.bs = dev_ptr<short>(a.bs.addr());
    p.quant.rows = static_cast<int>(a.rows);
    p.quant.ld = static_cast<int>(k);
    p.span = quant->work->span.as<unsigned>();
    p.q_row0 = static_cast<int>(quant->row0);
  }
  p.ranges = dev_ptr<const int>(ranges);
  p.q = dev_ptr<const unsigned short>(q);
  p.k = dev_ptr<const unsigned short>(k);
  p.vt = dev_ptr<const unsigned short>(vt);
  p.out = dev_ptr<float>(out);
  p.n_q = static_cast<int>(n_q);
  p.n_kv = static_cast<int>(n_kv);
  p.q_pad = static_cast<int>(pad_rows(n_q));
  p.kv_pad = static_cast<int>(pad_rows(n_kv));
  p.scale_log2 = static_cast<float>(static_cast<double>(scale) * 1.4426950408889634);
  dev.launch(desc.name(), attn_launch(d, n_q), &p, sizeof p);
}

void gpu_copy_rows(Device& dev, DevAddr dst, DevAddr src, DevAddr rows, int64_t n, int64_t cols, bool scatter) {
  if (n <= 0) return;
  RowCopyParams p{};
  p.dst = dev_ptr<float>(dst);
  p.src = dev_ptr<const float>(src);
  p.rows = dev_ptr<const int>(rows);
  p.n = static_cast<int>(n);
  p.cols = static_cast<int>(cols);
  p.scatter = scatter ? 1 : 0;
  dev.launch(kRowCopyKernel, row_copy_launch(n), &p, sizeof p);
}

}  // namespace dllm::jit::cuda
