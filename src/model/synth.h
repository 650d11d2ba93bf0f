// Synthetic models: random-weight GGUF files with the real LLaDA-8B-Instruct / Dream-7B-Instruct /
// LLaDA-MoE-7B-A1B / RND1-30B-A3B (fewer layers) / DiffusionGemma-26B-A4B shapes,
// metadata, special tokens, a tokenizer-sized vocabulary and the tensor-type mix of a real Q4_K_M (or Q8_0)
// download, valid for dllm and llama.cpp alike. Used for benchmarks (real weights cannot be downloaded here)
// and, at tiny sizes, for end-to-end tests. Weights are random quantized blocks scaled so that every
// projection roughly preserves the RMS of its input; activations stay finite through every layer.
#pragma once
#include <cstdint>
#include <functional>
#include <string>

namespace dllm::synth {

struct Shape {
  std::string arch = "llada";  // "llada", "dream", "llada-moe", "rnd1" or "diffusion-gemma"
  int64_t n_layer = 32;
  int64_t n_embd = 4096;
  int64_t n_head = 32;
  int64_t n_head_kv = 32;
  int64_t n_ff = 12288;
  int64_t n_vocab = 126464;
  int64_t head_dim = 0;       // 0: n_embd / n_head (rnd1: 128, attention.key_length)
  int64_t n_expert = 0;       // mixture of experts (llada-moe, rnd1): experts, used per token, expert FFN width
  int64_t n_expert_used = 0;
  int64_t n_ff_exp = 0;
  // diffusion-gemma: global layers use n_head_kv and head_dim (every 6th layer and the last), sliding layers
  // these; the sliding window and the canvas (diffusion.canvas_length).
  int64_t n_head_kv_swa = 0;
  int64_t head_dim_swa = 0;
  int64_t n_swa = 0;
  int64_t canvas = 0;
};

// diffusion-gemma: whether layer i of n is a sliding-window layer (five of every six; the last is global).
bool sliding_layer(int64_t i, int64_t n_layer);

// The real shapes: LLaDA-8B-Instruct, Dream-v0-Instruct-7B, LLaDA-MoE-7B-A1B, RND1-30B-A3B with 24 of
// its 48 layers (so that a Q4_K_M file fits a 24 GiB machine), and DiffusionGemma-26B-A4B (all 30 layers). Throws a usage error for another arch.
Shape real_shape(const std::string& arch);

struct Options {
  Shape shape;
  std::string quant = "Q4_K_M";  // "Q4_K_M" or "Q8_0"
  uint64_t seed = 1;
  // For a mixture-of-experts shape: write instead its dense twin, a llada model with the same active
  // parameters (FFN width = experts used x expert width) and the same attention weight types.
  bool dense = false;
};

// Progress: bytes written so far and the total.
using Progress = std::function<void(uint64_t done, uint64_t total)>;

// Writes the model to `path` (atomically). Memory stays small whatever the file size. Returns the file size.
uint64_t write_model(const std::string& path, const Options& options, const Progress& progress = {});

// Special token ids of the synthetic vocabulary (the real models' ids for the real vocabulary sizes).
struct SpecialIds {
  int32_t bos, eos, eot, mask, pad;
  int32_t pad_begin;  // first of the unused [PAD...] rows at the end of the vocabulary
};
SpecialIds special_ids(const Shape& shape);

}  // namespace dllm::synth
