// dllm synth: writes a synthetic full-size (or shorter, with --layers) LLaDA / Dream / LLaDA-MoE / RND1 GGUF
// (or a mixture of experts' dense twin, --dense) for benchmarks.
#include <cstdio>
#include <iostream>

#include "cli/commands.h"
#include "cli/progress.h"
#include "model/synth.h"

namespace dllm::cli {

int cmd_synth(const Settings& s) {
  synth::Options o;
  o.shape = synth::real_shape(s.arch);
  if (s.layers > 0) o.shape.n_layer = s.layers;
  o.quant = s.quant;
  o.seed = s.seed;
  o.dense = s.dense;
  ProgressBar bar("writing " + s.out);
  uint64_t size = synth::write_model(s.out, o, [&](uint64_t done, uint64_t total) { bar.update(done, total); });
  bar.finish();
  std::cout << "wrote " << s.out << ": synthetic " << s.arch << (s.dense ? " (dense twin)" : "") << ", " << o.shape.n_layer << " layers, " << s.quant
            << ", " << size << " bytes (" << human_bytes(static_cast<double>(size)) << ")\n";
  return 0;
}

}  // namespace dllm::cli
