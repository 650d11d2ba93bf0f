// The GEMM driver: row tiles and panel runs as work items, kernel lookup, and the portable twin.
#include "jit/gemm.h"

#include <algorithm>
#include <string>

#include "common/error.h"
#include "jit/weight_types.h"
#include "common/thread_pool.h"

namespace dllm::jit {

namespace {

void check_operands(const QuantMatrix& w, const QuantizedActs& a) {
  if (a.fmt != act_format_for(w.type) || a.k != w.k)
    throw Error("gemm: activations (" + std::string(a.fmt == ActFormat::Q8_K ? "Q8_K" : "Q8_0") + ", k = " +
                std::to_string(a.k) + ") do not fit " + ggml_type_name(w.type) + " weights with k = " +
                std::to_string(w.k));
}

// The portable family: the kernels' float contract (kernel_order.h) in plain C++, one output at a time.
void gemm_portable(const QuantMatrix& w, const QuantizedActs& a, int64_t row0, int64_t rows, float* y,
                   ThreadPool& pool) {
  // The dot of one weight row with one activation row (the weight table's portable twin).
  float (*dot)(int64_t, const void*, const void*) = require_weight_traits(w.type, "gemm: weights").portable_dot;
  const size_t row_bytes = w.src_row_bytes();
  const int64_t chunk = 16;
  const int64_t n_chunks = (w.n + chunk - 1) / chunk;
  pool.parallel_for(n_chunks * rows, [&](int64_t item, int) {
    const int64_t r = item / n_chunks, c = item % n_chunks;
    const void* act = a.row_blocks(row0 + r);
    for (int64_t n = c * chunk; n < std::min(w.n, (c + 1) * chunk); ++n)
      y[r * w.n + n] = dot(w.k, w.src + n * row_bytes, act);
  });
}

}  // namespace

std::vector<RowTile> plan_row_tiles(Isa isa, GgmlType t, int64_t n, int64_t k, int64_t rows) {
  std::vector<RowTile> tiles;
  if (isa == Isa::Portable) return tiles;
  auto add = [&](Isa family, int64_t r0, int64_t m) {
    RowTile tile;
    tile.r0 = r0;
    tile.desc.isa = family;
    tile.desc.wtype = t;
    tile.desc.n = n;
    tile.desc.k = k;
    tile.desc.m = static_cast<int>(m);
    tiles.push_back(tile);
  };
  const int mmax = max_row_tile(isa, t, k);
  int64_t r = 0;
  for (; r + mmax <= rows; r += mmax) add(isa, r, mmax);
  if (r < rows) {
    // AMX Q4_K and Q5_K share avx512-vnni's weight layout: a remainder that one vnni tile holds (8 rows) runs
    // there, a larger one as a partial AMX tile, faster than two vnni tiles (bench/results/gemm-amx-20261207).
    const bool shared = t == GgmlType::Q4_K || t == GgmlType::Q5_K;
    const bool vnni = isa == Isa::Amx && shared && rows - r <= max_row_tile(Isa::Avx512Vnni, t, k);
    add(vnni ? Isa::Avx512Vnni : isa, r, rows - r);
  }
  if (!tiles.empty() && first_tile_prefetches(tiles[0].desc.isa, tiles[0].desc.m)) tiles[0].desc.prefetch = true;
  return tiles;
}

void point_at_rows(GemmKernelArgs& args, const QuantizedActs& a, Isa isa, int64_t r0) {
  args.xq = isa == Isa::Amx ? a.tiles.data() + (r0 / 16) * a.tile_chunks() * 1024 : a.qs.data() + r0 * a.k;
  args.xd = a.d.data() + r0 * a.blocks_per_row();
  args.xs = a.fmt == ActFormat::Q8_K ? a.s32.data() + r0 * (a.k / 32) : nullptr;
  args.xc = a.corr.data() + r0 * a.corr_per_row();
}

std::vector<std::shared_ptr<const Kernel>> kernels_for(const QuantMatrix& w, int64_t rows, KernelCache& cache) {
  std::vector<std::shared_ptr<const Kernel>> out;
  std::vector<GemmDesc> seen;
  for (const RowTile& t : plan_row_tiles(w.isa, w.type, w.n, w.k, rows)) {
    if (std::find(seen.begin(), seen.end(), t.desc) != seen.end()) continue;
    seen.push_back(t.desc);
    out.push_back(cache.get(t.desc));
  }
  return out;
}

namespace {

// One matrix of a gemm call, cut into work items: runs of panels (small enough to stay in L2 while the
// row tiles pass over them) times groups of row tiles, so that even narrow matrices give every thread work.
struct GemmPlan {
  const QuantMatrix* w = nullptr;
  float* y = nullptr;
  int64_t row0 = 0;  // the first activation row (y's row 0)
  std::vector<RowTile> tiles;
  std::vector<GemmKernelFn> fns;
  int64_t run = 1, n_runs = 1, tiles_per_group = 1, n_groups = 1;
  int64_t items() const { return n_runs * n_groups; }
};

GemmPlan plan_gemm(const QuantMatrix& w, int64_t row0, int64_t rows, float* y, int64_t threads, KernelCache& cache) {
  GemmPlan g;
  g.w = &w;
  g.y = y;
  g.row0 = row0;
  const PackedLayout& L = w.layout;
  g.tiles = plan_row_tiles(w.isa, w.type, w.n, w.k, rows);
  for (const RowTile& t : g.tiles) g.fns.push_back(cache.get(t.desc)->fn());
  // Runs: at most max_run panels (512 KB), at least 4 per thread, and a multiple of the thread count of
  // equal length, so that the last items do not leave threads idle.
  const int64_t max_run = std::max<int64_t>(1, (512 * 1024) / L.panel_bytes);
  int64_t n_runs = std::max<int64_t>(4 * threads, (L.n_panels + max_run - 1) / max_run);
  n_runs = (n_runs + threads - 1) / threads * threads;
  g.run = std::max<int64_t>(1, (L.n_panels + n_runs - 1) / n_runs);
  g.n_runs = (L.n_panels + g.run - 1) / g.run;
  const int64_t n_tiles = static_cast<int64_t>(g.tiles.size());
  const int64_t groups = std::clamp<int64_t>((4 * threads + g.n_runs - 1) / g.n_runs, 1, n_tiles);
  g.tiles_per_group = (n_tiles + groups - 1) / groups;
  g.n_groups = (n_tiles + g.tiles_per_group - 1) / g.tiles_per_group;
  return g;
}

void run_item(const GemmPlan& g, const QuantizedActs& a, int64_t item) {
  const QuantMatrix& w = *g.w;
  const PackedLayout& L = w.layout;
  const int64_t p0 = (item / g.n_groups) * g.run, grp = item % g.n_groups;
  const int64_t np = std::min(g.run, L.n_panels - p0);
  const int64_t last_cols = w.n - (L.n_panels - 1) * L.p;
  const int64_t n_tiles = static_cast<int64_t>(g.tiles.size());
  GemmKernelArgs args{};
  args.w = w.packed.data() + p0 * L.panel_bytes;
  args.n_panels = np;
  args.tail_cols = p0 + np == L.n_panels ? last_cols : L.p;
  for (int64_t t = grp * g.tiles_per_group; t < std::min(n_tiles, (grp + 1) * g.tiles_per_group); ++t) {
    const RowTile& tile = g.tiles[static_cast<size_t>(t)];
    point_at_rows(args, a, tile.desc.isa, g.row0 + tile.r0);
    args.y = g.y + tile.r0 * w.n + p0 * L.p;
    if (const KernelInterpreter run = kernel_interpreter())
      run(reinterpret_cast<const uint8_t*>(g.fns[static_cast<size_t>(t)]), &args);
    else
      g.fns[static_cast<size_t>(t)](&args);
  }
}

}  // namespace

void gemm_ranges(const GemmRange* rs, int n, const QuantizedActs& a, ThreadPool& pool, KernelCache& cache) {
  std::vector<GemmPlan> plans;
  bool amx = false;  // AMX kernels read the quants as 16-row tiles (quant_act.h)
  for (int i = 0; i < n; ++i) {
    const GemmRange& r = rs[i];
    const QuantMatrix& w = *r.w;
    check_operands(w, a);
    if (r.row0 < 0 || r.rows < 0 || r.row0 + r.rows > a.rows)
      throw Error("internal error: gemm rows " + std::to_string(r.row0) + " + " + std::to_string(r.rows) +
                  " past the " + std::to_string(a.rows) + " activation rows");
    if (r.rows == 0) continue;
    if (w.isa == Isa::Portable) {
      gemm_portable(w, a, r.row0, r.rows, r.y, pool);
      continue;
    }
    plans.push_back(plan_gemm(w, r.row0, r.rows, r.y, pool.size(), cache));
    bool tiles_amx = false;
    for (const RowTile& t : plans.back().tiles) tiles_amx = tiles_amx || t.desc.isa == Isa::Amx;
    if (tiles_amx && r.row0 % 16 != 0) throw Error("internal error: AMX GEMM rows must start at a multiple of 16");
    amx = amx || tiles_amx;
  }
  if (plans.empty()) return;
  if (amx) build_amx_tiles(a, pool);
  // One pass over every matrix's items: one wake-up of the pool, and the threads stay busy across the
  // boundaries between matrices.
  std::vector<int64_t> first(plans.size() + 1, 0);
  for (size_t i = 0; i < plans.size(); ++i) first[i + 1] = first[i] + plans[i].items();
  pool.parallel_for(first.back(), [&](int64_t item, int) {
    const size_t i = static_cast<size_t>(std::upper_bound(first.begin(), first.end(), item) - first.begin() - 1);
    run_item(plans[i], a, item - first[i]);
  });
}

void gemm_many(const QuantMatrix* const* ws, float* const* ys, int n, const QuantizedActs& a, ThreadPool& pool,
               KernelCache& cache) {
  std::vector<GemmRange> rs;
  for (int i = 0; i < n; ++i) rs.push_back({ws[i], ys[i], 0, a.rows});
  gemm_ranges(rs.data(), n, a, pool, cache);
}

void gemm(const QuantMatrix& w, const QuantizedActs& a, float* y, ThreadPool& pool, KernelCache& cache) {
  const QuantMatrix* ws[1] = {&w};
  float* ys[1] = {y};
  gemm_many(ws, ys, 1, a, pool, cache);
}

void gemm(const QuantMatrix& w, const float* x, int64_t rows, float* y, ThreadPool& pool, KernelCache& cache) {
  QuantizedActs a;
  quantize_acts(act_format_for(w.type), x, rows, w.k, a, pool);
  gemm(w, a, y, pool, cache);
}

}  // namespace dllm::jit
