// The executor interface: what the forward program (forward.cpp, with one layer builder per architecture)
// asks of a backend. At load the model hands each weight matrix to prepare_weight() and each norm weight
// or bias to prepare_vector() once. Per step the program runs a handful of fused operations over a
// batch of rows (the computed positions of every sequence in the step, concatenated) held in
// executor-owned activation buffers that live across steps: embedding, norm + shared matmul, keys and
// values into a sequence's store (bias + RoPE), attention per sequence (bias + RoPE on the queries),
// matmul + residual, SwiGLU + matmul + residual, row gathers, and final norm + LM head on chosen rows.
// Only the logits leave the executor. Mixture-of-experts layers add two operations: a per-head RMSNorm of
// the queries and keys (head_norm), and the expert FFN (moe_ffn: route each row to its top-k experts, run
// one GEMM per (expert, matrix) over exactly the rows routed to that expert, scatter back weighted).
//
// Executor implements every operation on host memory from four primitives a CPU backend overrides
// (matmul, matmul_shared, attention, lm_head); a device backend (the GPU) overrides the operations
// themselves, so its activations and key/value stores stay on the device. Every operation works row by
// row: a row's result never depends on the other rows in the batch, which is what makes a sequence's
// logits bit-identical alone or batched.
//
// Implementations: ReferenceExecutor (reference_executor.h: portable C++, the oracle of every test), the
// JIT CPU executor and the GPU executor in src/jit. Nothing here knows which one runs.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "model/arch.h"
#include "model/gguf.h"

namespace dllm {
class ThreadPool;
}

namespace dllm::model {


// Opaque handle of a prepared weight; only the executor that returned it knows what it refers to.
struct WeightHandle {
  int32_t index = -1;
  bool valid() const { return index >= 0; }
};

// Opaque handle of a prepared vector (a norm weight or a bias); invalid = none (no bias).
struct VectorHandle {
  int32_t index = -1;
  bool valid() const { return index >= 0; }
};

// An executor-owned f32 activation buffer [rows, cols] row-major. The forward program names a few slots
// (Slot below); the executor keeps each slot's memory across steps and grows it on demand.
struct Act {
  int32_t slot = -1;
};

// Executor-owned keys and values of one sequence: `layers` layers of `positions` rows of kv_dim floats,
// bias and RoPE applied. Opened per sequence (the dual cache keeps one across steps), closed when done.
struct KvHandle {
  int32_t index = -1;
  bool valid() const { return index >= 0; }
};

// RoPE as the forward program applies it to queries and keys (algorithms.md 1.4.4).
struct RopeSpec {
  RopeStyle style{};
  int64_t n_rot = 0;    // leading dims of a head that rotate
  float base = 10000;   // freq_base
  // Optional per-pair frequency divisors (n_rot / 2 values, ggml's rope freq_factors: the angle of pair p
  // is pos * base^(-2p/n_rot) / freq_factors[p]; 1e30 keeps a pair still). Owned by the caller.
  const float* freq_factors = nullptr;
};

// The keys a query row attends to: store positions [lo, hi) (a mask that is one interval per row: causal,
// sliding-window, bidirectional or block-causal rows all are).
struct KeyRange {
  int64_t lo = 0, hi = 0;
  bool operator==(const KeyRange&) const = default;
};

// The gated activation of a GLU feed-forward: act(gate) * up.
enum class Glu {
  SiLU,      // silu(gate) * up in f32 (llama.cpp's swiglu)
  GeluTanh,  // gelu_tanh(gate) * up: the tanh approximation read from an F16 table as ggml's CPU backend does
             // (input rounded to F16, gelu of it rounded to F16; |x| >= 10 taken as 0 or x), product in f32
};

// Geometry of one attention call. Query rows and key/value rows are separate so that a caller can ask
// for a subset of query rows (the last layer computes only the rows whose logits are wanted) or, later,
// recompute a block's rows against keys/values cached for the other positions (dual cache).
struct AttentionShape {
  int64_t n_head = 0;     // query heads H
  int64_t n_head_kv = 0;  // key/value heads Hkv; query head h reads kv head h / (H / Hkv)
  int64_t head_dim = 0;   // d
  float scale = 0;        // applied to q.k: 1/sqrt(d) (1 for Gemma-4)
  int64_t kv_dim() const { return n_head_kv * head_dim; }
};

// The experts of one mixture-of-experts layer as prepared for an executor: the router as a vector of
// n_expert rows of D f32 values (row e: expert e's logit weights; prepare_vector), and every expert's
// gate/up [F_exp rows of D] and down [D rows of F_exp] as ordinary prepared weights (prepare_weight on the
// expert's 2-D slice of the 3-D tensor: repacked once per expert, never expanded to f32).
struct MoeLayer {
  VectorHandle router;
  int64_t n_expert = 0, n_used = 0, n_ff = 0;
  bool norm_weights = false;  // renormalise the top-k probabilities to sum 1 (rnd1); as they are otherwise
  std::vector<WeightHandle> gate, up, down;  // one per expert
  Glu glu = Glu::SiLU;
  // Gemma-4: the router reads rmsnorm(x) (no weight) / sqrt(D) * router_scale instead of the experts' input,
  // and expert e's top-k weight is multiplied by expert_scale[e] after the renormalisation. Invalid / empty: off.
  VectorHandle router_scale;
  std::vector<float> expert_scale;
};

// Where the forward passes' wall time went (forward.cpp adds to it), for the step split that --json and
// --verbose report. Only a synchronous executor's times are each phase's own: a device executor's calls may
// return before its work is done.
struct PassTimes {
  double embed_ms = 0;       // token embedding, canvas input norm
  double self_cond_ms = 0;   // DiffusionGemma's self-conditioning: soft embedding and its MLP
  double attention_ms = 0;   // norms, Q/K/V projections, RoPE, the keys and values stored, attention, output
  double mlp_ms = 0;         // the dense FFN (Gemma-4: the shared MLP beside the experts)
  double experts_ms = 0;     // router and experts
  double other_ms = 0;       // post-norms, sums and scalars between the blocks
  double lm_head_ms = 0;     // final norm, LM head, softcap
  double encode_ms = 0;      // passes that only fill a cache (a DiffusionGemma prompt or finished block)
  int64_t passes = 0;        // passes with logits
  double total_ms() const {
    return embed_ms + self_cond_ms + attention_ms + mlp_ms + experts_ms + other_ms + lm_head_ms;
  }
};

class Executor {
 public:
  virtual ~Executor();

  // Short name for diagnostics ("reference", ...).
  virtual std::string name() const = 0;

  // The forward passes' time split so far (PassTimes).
  PassTimes& pass_times() { return pass_times_; }

  // After load: one sentence for the user when some matrices run on a slower path than the executor's
  // own (the JIT CPU executor's weight types without kernels), else "". Commands print it once.
  virtual std::string load_warning() const { return {}; }

  // Load time, before any weight or vector: the model's hyperparameters (prepare_forward_weights passes
  // them), so that a device backend can build everything for the model's shapes at once. Default: nothing.
  virtual void prepare_model(const HParams& hp) { (void)hp; }
  // Load time, after prepare_weight: n products that norm_matmul takes from one input together (a layer's Q, K, V;
  // its K, V alone at the last layer; gate and up), so that a device backend can build one launch for them.
  // A hint: norm_matmul must work for any products. Default: nothing.
  virtual void prepare_shared(const WeightHandle* ws, int n) {
    (void)ws;
    (void)n;
  }
  // Load time, after prepare_weight: the three products of a SwiGLU feed-forward (norm_swiglu_ffn), so that a device
  // backend can build its fused launch. A hint, as prepare_shared. Default: nothing.
  virtual void prepare_swiglu_ffn(WeightHandle gate, WeightHandle up, WeightHandle down) {
    (void)gate;
    (void)up;
    (void)down;
  }
  // Load time, after prepare_weight: an attention output projection, whose input expect_projection will announce, so
  // that a device backend can build the attention launch that quantises for it. A hint. Default: nothing.
  virtual void prepare_output_projection(WeightHandle wo) { (void)wo; }

  // Load time: prepare a 2-D weight tensor of `n` rows (ne1) of `k` values (ne0), stored as the file
  // stores it (any type quant::can_dequantize accepts). The tensor's bytes live in the file's mapping,
  // which outlives the executor. An implementation may repack; it must never expand a whole model to f32.
  virtual WeightHandle prepare_weight(const gguf::TensorInfo& tensor) = 0;
  // Load time, before prepare_weight of the same tensor: the forward program reads rows of this tensor every
  // pass through table_row (self-conditioning decodes the embedding table), so an executor that repacks it
  // must either decode those rows from its own copy (table_row) or keep the mapping's pages resident instead
  // of dropping them. Default: nothing to keep.
  virtual void keep_mapped(const gguf::TensorInfo& tensor) { (void)tensor; }
  // Row `row` of a 2-D tensor as floats, exactly quant::dequantize_row of the file's row (thread-safe).
  // Default: decoded from the mapping.
  virtual void table_row(const gguf::TensorInfo& tensor, int64_t row, float* out) const;
  // Rows row0 .. row0 + n - 1 of the table the same way, row i at out + i * stride (self-conditioning decodes runs
  // of consecutive tokens). Default: table_row for each.
  virtual void table_rows(const gguf::TensorInfo& tensor, int64_t row0, int64_t n, float* out, int64_t stride) const;

  // y[r][j] = sum_c x[r][c] * W[j][c] for r < rows, j < n:  x is [rows, k] and y is [rows, n], both f32
  // row-major with rows packed (stride k and n). No bias. Rows are independent: the result of a row
  // must not depend on which other rows are in the call.
  virtual void matmul(WeightHandle w, const float* x, int64_t rows, float* y) = 0;

  // Several products of the same input: ys[i] = x times ws[i] (each as matmul). Backends that quantise
  // activations do it once here for all of them (Q, K and V; gate and up).
  virtual void matmul_shared(const WeightHandle* ws, float* const* ys, int n, const float* x, int64_t rows) {
    for (int i = 0; i < n; ++i) matmul(ws[i], x, rows, ys[i]);
  }

  // Products over groups of rows (a mixture-of-experts layer: one group per expert): x [.., k] holds each
  // group's rows contiguously, group g's n[g] rows from row row0[g]; for j < m, ys[g*m + j] (n[g] rows) =
  // those rows times ws[g*m + j] (each as matmul). Groups with n[g] = 0 are skipped (their handles are
  // not read). Backends that quantise activations do it once for all groups and run every group's
  // products in one pass.
  virtual void matmul_grouped(const WeightHandle* ws, float* const* ys, int m, const int64_t* row0, const int64_t* n,
                              int groups, const float* x, int64_t k) {
    for (int g = 0; g < groups; ++g) {
      if (n[g] > 0) matmul_shared(ws + g * m, ys + g * m, m, x + row0[g] * k, n[g]);
    }
  }

  // matmul_grouped over rows gathered from x [x_rows, k]: the grouped layout's row i is x's row src[i] (rows
  // up to the last group's end). This default copies the rows and calls matmul_grouped; backends that quantise
  // activations quantise x's rows once and gather the quantised rows instead (a row's quantisation depends on
  // that row alone, so the products are the same bit for bit).
  virtual void matmul_grouped_gather(const WeightHandle* ws, float* const* ys, int m, const int64_t* row0,
                                     const int64_t* n, int groups, const float* x, int64_t x_rows,
                                     const int64_t* src, int64_t k);

  // Bidirectional (non-causal, unmasked) grouped-query attention.
  // q: [n_q, H*d] (already RoPE'd), k and v: [n_kv, Hkv*d] (k RoPE'd), out: [n_q, H*d].
  // out[i][h] = sum_j softmax_j(scale * q[i][h] . k[j][g]) * v[j][g], g = h / (H / Hkv), heads
  // concatenated in head order. A query row's result must not depend on the other query rows.
  virtual void attention(const AttentionShape& shape, const float* q, int64_t n_q, const float* k,
                         const float* v, int64_t n_kv, float* out) = 0;

  // The same with a mask: query row i attends to keys [ranges[i].lo, ranges[i].hi) only (0 <= lo < hi <= n_kv).
  // Default: each run of consecutive rows with one range is an unmasked attention() over that interval of keys
  // (so a row's result depends only on its own range, never on its neighbours').
  virtual void attention_ranges(const AttentionShape& shape, const float* q, int64_t n_q, const float* k,
                                const float* v, int64_t n_kv, const KeyRange* ranges, float* out);

  // The LM head: `rows` final-normed rows [rows, D] times the output weight -> logits [rows, n_vocab].
  // The caller passes only the rows it needs logits for. Same contract as matmul; a backend may
  // override it (the vocabulary projection is the largest matrix of all).
  virtual void lm_head(WeightHandle output, const float* x, int64_t rows, float* logits) {
    matmul(output, x, rows, logits);
  }

  // --- the operations of the forward program (default: host memory, through the primitives above) ---

  // Load time: a 1-D f32 vector the operations below read (norm weights, biases).
  virtual VectorHandle prepare_vector(std::span<const float> v);
  // The f32 values of a vector prepared by the default prepare_vector (empty for an invalid handle).
  std::span<const float> host_vector(VectorHandle v) const;
  // The buffer of `slot` with room for [rows, cols] (contents kept only while the shape fits).
  virtual Act activation(int32_t slot, int64_t rows, int64_t cols);
  // x[i] = row ids[i] of the embedding table, dequantised (rows of the file's mapping).
  virtual void embed(const gguf::TensorInfo& table, std::span<const int32_t> ids, Act x);
  // ys[i][r] = rmsnorm(x[r]) * norm  times ws[i], for r < rows (norm in double as forward.h says; an invalid
  // norm multiplies by 1).
  virtual void norm_matmul(Act x, int64_t rows, VectorHandle norm, float eps, const WeightHandle* ws,
                           const Act* ys, int n);
  // y[r] += x[r] times w, r < rows (the residual added in f32).
  virtual void matmul_add(WeightHandle w, Act x, int64_t rows, Act y);
  // y[r] += (silu(gate[r]) * up[r]) times w, r < rows (silu and product in f32); gate is overwritten.
  virtual void swiglu_matmul_add(WeightHandle w, Act gate, Act up, int64_t rows, Act y);
  // A SwiGLU feed-forward: norm_matmul of x into gate (gate_w) and up (up_w), then swiglu_matmul_add of down_w onto x.
  // One op, so that a device backend can fuse across the two (the GPU's gate/up launch quantises silu(gate) * up for
  // the down projection itself). Default: exactly those two ops.
  virtual void norm_swiglu_ffn(Act x, int64_t rows, VectorHandle norm, float eps, WeightHandle gate_w, WeightHandle up_w,
                               WeightHandle down_w, Act gate, Act up);
  // y[r] = act(gate[r]) * up[r] (Glu) times w, r < rows: written, not added; gate is overwritten.
  virtual void glu_matmul(Glu glu, WeightHandle w, Act gate, Act up, int64_t rows, Act y);
  // y[r] += rmsnorm(x[r] times w) * norm, r < rows (Gemma's post-norms; an invalid norm multiplies by 1).
  virtual void matmul_norm_add(WeightHandle w, Act x, int64_t rows, VectorHandle norm, float eps, Act y);
  // y[r] = rmsnorm(x[r]) * norm, r < rows (y may be x; an invalid norm multiplies by 1).
  virtual void norm(Act x, int64_t rows, VectorHandle norm, float eps, Act y);
  // y[r] += rmsnorm(x[r]) * norm, r < rows (an invalid norm multiplies by 1).
  virtual void norm_add(Act x, int64_t rows, VectorHandle norm, float eps, Act y);
  // y[r] += x[r], r < rows.
  virtual void add(Act x, int64_t rows, Act y);
  // x[r] *= s[r], r < s.size().
  virtual void scale_rows(Act x, std::span<const float> s);
  // x[r] = softmax(logits[r] / temperature) (over n_vocab values, host memory [rows, n_vocab]) times the
  // embedding table [n_vocab rows of D] times `scale`, r < rows: the expected embedding of Gemma-4's
  // self-conditioning. As the reference (llama.cpp's CPU backend) does it, the probabilities and the table's
  // values are rounded to F16 first and the products summed in F32 (here in ascending token order).
  // top_k > 0 (an opt-in approximation): each row keeps only its top_k largest F16 probabilities (ties: the
  // lower id first), not renormalised; the row is off by at most the dropped probability mass times the
  // table's largest row norm times `scale`.
  virtual void soft_embed(const gguf::TensorInfo& table, const float* logits, int64_t rows, float temperature,
                          int64_t top_k, float scale, Act x);
  // dst[i] = src[rows[i]].
  virtual void gather(Act src, std::span<const int64_t> rows, Act dst);
  // dst[rows[i]] = src[i] (src and dst distinct).
  virtual void scatter(Act src, std::span<const int64_t> rows, Act dst);
  // Keys and values of a sequence's store: one layer per width, layer l's rows widths[l] floats (its Hkv * d,
  // shape.kv_dim() in kv_store and attend; layers of different geometry take only their own room).
  virtual KvHandle kv_open(std::span<const int64_t> widths, int64_t positions);
  virtual void kv_close(KvHandle kv);
  // Room for `positions` positions, the stored ones kept (a cached prefix that grows). Default: host stores.
  virtual void kv_grow(KvHandle kv, int64_t positions);
  // A store's first `positions` positions, copied to host memory: layer by layer its keys then its values
  // (layer l: positions * widths[l] floats each), and back into a store with the same widths and room for
  // them (`data` holding `data_positions` >= positions positions in that layout). What a prefix cache across
  // requests keeps. Default: host stores.
  virtual std::vector<float> kv_read(KvHandle kv, int64_t positions);
  virtual void kv_write(KvHandle kv, int64_t positions, std::span<const float> data, int64_t data_positions);
  // Stores rows [row0, row0 + rows) of k and v as positions [pos0, pos0 + rows) of layer `layer`:
  // bias (when valid) then RoPE at those positions on the keys, bias on the values.
  virtual void kv_store(KvHandle kv, int64_t layer, Act k, Act v, int64_t row0, int64_t rows, int64_t pos0,
                        VectorHandle bk, VectorHandle bv, const RopeSpec& rope, const AttentionShape& shape);
  // out rows [row0, row0 + positions.size()) = attention of q's same rows (bias then RoPE at `positions`
  // applied first; q is overwritten) over positions [0, n_kv) of layer `layer` of the store, or with `ranges`
  // (one per row, empty = every key) over each row's interval of them.
  virtual void attend(KvHandle kv, int64_t layer, int64_t n_kv, Act q, int64_t row0,
                      std::span<const int64_t> positions, VectorHandle bq, const RopeSpec& rope,
                      const AttentionShape& shape, Act out, std::span<const KeyRange> ranges = {});
  // A hint before the attend() calls that fill `out`: the caller's next use of out is matmul_add(w, out, rows, ...), and
  // until then only attend() writes it, so a device backend may prepare that product's input while attention writes
  // each row. Default: nothing.
  virtual void expect_projection(Act out, int64_t rows, WeightHandle w) {
    (void)out;
    (void)rows;
    (void)w;
  }
  // x[r] head by head (n_heads heads of head_dim values) = rmsnorm(head) * w (w: head_dim values; invalid:
  // 1), in place, r < rows (RMSNorm in double as norm_matmul). The per-head q/k(/v) norms of qk_norm layers.
  virtual void head_norm(Act x, int64_t rows, int64_t n_heads, int64_t head_dim, VectorHandle w, float eps);
  // x[r] += sum over the top-k experts e of row r (router softmax of rmsnorm(x[r]) * norm) of
  // p_e * down_e(silu(gate_e(h)) * up_e(h)), h = rmsnorm(x[r]) * norm, r < rows; the weighted expert
  // outputs are summed in the order of the top-k (most probable first), in f32. Default: moe_ffn_on_host.
  virtual void moe_ffn(const MoeLayer& m, Act x, int64_t rows, VectorHandle norm, float eps);
  // The same written to out [rows, D] instead of added to x (Gemma-4's experts, post-normed before the residual).
  virtual void moe_ffn_to(const MoeLayer& m, Act x, int64_t rows, VectorHandle norm, float eps, Act out);
  // The router step of moe_ffn on host rows h [rows, D] (every executor routes on the host: the router is
  // a few thousand values per row): ids and weights of each row's top-k experts as moe_route computes them.
  // Default: moe_route. (A test overrides it to force one decision.)
  virtual void route(const MoeLayer& m, std::span<const float> router, const float* h, int64_t rows, int64_t D,
                     int32_t* ids, float* weights);
  // logits[i] = cap * tanh(logits[i] / cap), i < n (host memory): Gemma's final softcap, in f32 as llama.cpp
  // (scale by 1/cap, tanh rounded to f32, scale by cap; the tangent tanh_f64's, vectorised). Default: split
  // over the host pool.
  virtual void softcap(float* logits, int64_t n, float cap);
  // logits (host, [rows, n_vocab]) = rmsnorm(x[r]) * norm through the LM head, r < rows.
  virtual void final_logits(WeightHandle output, Act x, int64_t rows, VectorHandle norm, float eps,
                            float* logits);

 protected:
  // The host operations' thread pool (element-wise work); executors that keep the defaults set it.
  explicit Executor(ThreadPool* pool = nullptr);
  // The host buffer of an activation slot as the default operations read and write it (sized by
  // Executor::activation): a device executor mirrors a slot's rows there to run a default operation.
  float* host_data(Act a);

 private:
  struct HostState;
  HostState& host();
  // Keeps its buffers in the executor's host state from layer to layer.
  friend void moe_ffn_on_host(Executor& ex, ThreadPool* pool, const MoeLayer& m, std::span<const float> router,
                              std::span<const float> norm, float eps, float* x, int64_t rows, int64_t D, float* out,
                              std::span<const float> router_scale);
  ThreadPool* host_pool_ = nullptr;
  std::unique_ptr<HostState> host_;
  PassTimes pass_times_;

 public:
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;
};

// --- the mixture-of-experts pieces on host memory (moe_host.cpp; dot_f64, the GLU rows and the head norm in
// host_ops.cpp), shared by every executor ---

// sum a[i]*b[i] over i < n in double, in eight interleaved partial sums (element i into sum i % 8) combined
// in a fixed order, so that the clone that runs (AVX-512, AVX2, baseline) never changes the result.
double dot_f64(const float* a, const float* b, int64_t n);
// out[j] = dot_f64(a, b + j * stride, n) for j < 4, bit for bit, at about four times the rate.
void dot4_f64(const float* a, const float* b, int64_t stride, int64_t n, double* out);
// out[r * 4 + j] = dot_f64(a + r * astride, b + j * bstride, n) for r, j < 4, bit for bit, both operands' rows
// given in double (the f32 values converted): the router, four rows by four experts at a time.
void dot4x4_f64(const double* a, int64_t astride, const double* b, int64_t bstride, int64_t n, double* out);

// Router of `rows` rows h [rows, D]: logits l[r][e] = h[r] . router[e] (dot_f64, rounded to f32), softmax
// over the experts (f32 probabilities), the k most probable experts (ties: lower index) most probable first
// into ids[r*k + j], their probabilities (renormalised to sum 1 when norm_weights) into weights[r*k + j].
// probs (optional, [rows, E]) receives every probability. Rows are split over pool (when given); each
// row's values do not depend on it.
void moe_route(std::span<const float> router, const float* h, int64_t rows, int64_t D, int64_t n_expert, int64_t k,
               bool norm_weights, int32_t* ids, float* weights, float* probs = nullptr, ThreadPool* pool = nullptr);

// Executor::moe_ffn on host rows x [rows, D] (in place): RMSNorm, moe_route, the (row, expert) pairs grouped
// by expert, one ex.matmul_grouped_gather for every expert's gate and up (each pair reading its row of the
// normed rows) and one ex.matmul_grouped for every expert's down (each expert over exactly its rows), the
// weighted outputs summed per row in top-k order and added to x. router and norm are the host values of the
// layer's vectors. A device executor calls it on a downloaded copy of its residual stream.
// out (optional): the experts' sum written there instead of added to x. router_scale: m.router_scale's values.
void moe_ffn_on_host(Executor& ex, ThreadPool* pool, const MoeLayer& m, std::span<const float> router,
                     std::span<const float> norm, float eps, float* x, int64_t rows, int64_t D, float* out = nullptr,
                     std::span<const float> router_scale = {});

// gelu_tanh(x) as ggml's CPU backend computes it (Glu::GeluTanh): 0 for x <= -10, x for x >= 10, else the
// F16 table entry of x rounded to F16.
float gelu_tanh_f16_table(float x);
// gate[i] = gelu_tanh_f16_table(gate[i]) * up[i], i < n (vectorised where the CPU has F16C: the same values).
void geglu_row(float* gate, const float* up, int64_t n);

// Executor::head_norm on host rows x [rows, n_heads * head_dim] (in place).
void head_norm_on_host(ThreadPool* pool, float* x, int64_t rows, int64_t n_heads, int64_t head_dim, const float* w,
                       float eps);

}  // namespace dllm::model
