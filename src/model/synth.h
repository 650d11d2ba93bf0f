// Synthetic models: random-weight GGUF files with the real LLaDA-8B-Instruct / Dream-7B-Instruct shapes,
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
  std::string arch = "llada";  // "llada" or "dream"
  int64_t n_layer = 32;
  int64_t n_embd = 4096;
  int64_t n_head = 32;
  int64_t n_head_kv = 32;
  int64_t n_ff = 12288;
  int64_t n_vocab = 126464;
};

// The real shapes: LLaDA-8B-Instruct and Dream-v0-Instruct-7B. Throws a usage error for another arch.
Shape real_shape(const std::string& arch);

struct Options {
  Shape shape;
  std::string quant = "Q4_K_M";  // "Q4_K_M" or "Q8_0"
  uint64_t seed = 1;
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
