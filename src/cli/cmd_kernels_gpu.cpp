// `dllm kernels --gpu-arch sm_XX --model PATH --out DIR` (commands_gpu.h): the GPU kernel unit of a
// model, its PTX and CUBIN, written without a GPU. Files are written through a temporary name and
// renamed, so a failed run leaves no half-written file behind.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>

#include "cli/commands_gpu.h"
#include "jit/cuda/kernel_set.h"
#include "jit/cuda/nvrtc.h"
#include "model/arch.h"
#include "common/error.h"
#include "model/gguf.h"

namespace dllm::cli {

namespace {

namespace fs = std::filesystem;
namespace jc = dllm::jit::cuda;

void write_atomically(const fs::path& path, const std::string& bytes) {
  const fs::path tmp = path.string() + ".tmp" + std::to_string(::getpid());
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (!f) {
      std::error_code ec;
      fs::remove(tmp, ec);
      throw Error("cannot write " + path.string());
    }
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) {
    fs::remove(tmp, ec);
    throw Error("cannot write " + path.string() + ": " + ec.message());
  }
}

// The compute capability of "sm_XX" / "sm_XXX", or a usage error.
int parse_arch(const std::string& arch) {
  static const std::regex re("sm_([0-9]{2,3})");
  std::smatch m;
  if (!std::regex_match(arch, m, re)) {
    throw usage_error("flag --gpu-arch needs an architecture such as sm_80, sm_86, sm_89 or sm_90, got '" + arch + "'");
  }
  return std::stoi(m[1].str());
}

}  // namespace

int cmd_kernels_gpu(const std::string& model_path, const std::string& arch, const std::string& out_dir) {
  const int cc = parse_arch(arch);
  if (out_dir.empty()) throw usage_error("missing required flag --out for 'kernels'");
  const auto file = gguf::File::open(model_path);
  const model::HParams hp = model::read_hparams(*file);
  const model::ModelTensors tensors = model::check_tensors(*file, hp);
  const jc::KernelSet set = jc::kernels_for_model(hp, tensors);  // names the first tensor without a kernel

  const jc::Nvrtc* nv = jc::Nvrtc::get();
  if (!nv) throw Error("dllm kernels --gpu-arch needs NVRTC (libnvrtc.so from the CUDA toolkit): " + jc::Nvrtc::load_error());
  if (cc < 80) throw Error("--gpu-arch " + arch + ": the GPU backend needs compute capability 8.0 or newer");
  if (!nv->supports(cc)) {
    std::string list;
    for (int a : nv->supported_archs()) list += (list.empty() ? "sm_" : ", sm_") + std::to_string(a);
    throw Error("NVRTC " + nv->version_string() + " cannot compile for " + arch + " (it supports " + list + ")");
  }
  const std::string source = set.source();
  const std::string unit = set.unit_name();
  const jc::CompiledUnit out = nv->compile(source, unit, arch);

  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec) throw Error("cannot create " + out_dir + ": " + ec.message());
  const fs::path dir(out_dir);
  write_atomically(dir / (unit + ".cu"), source);
  write_atomically(dir / (unit + "." + arch + ".ptx"), out.ptx);
  write_atomically(dir / (unit + "." + arch + ".cubin"), out.cubin);

  // Which tensors use each GEMM.
  std::map<std::string, std::vector<std::string>> users;
  auto note = [&](const gguf::TensorInfo* t) {
    jc::WeightFormat f = jc::WeightFormat::Q8_0;
    jc::weight_format_of(t->type(), &f);
    users[jc::GemmDesc{f, t->ne[1], t->ne[0]}.name()].emplace_back(t->name);
  };
  for (const model::LayerTensors& l : tensors.layers) {
    for (const gguf::TensorInfo* m : l.matrices()) note(m);
  }
  note(tensors.output);
  nlohmann::json manifest = {{"model", model_path},
                             {"unit", unit},
                             {"target", arch},
                             {"nvrtc", nv->version_string()},
                             {"compile_seconds", out.seconds},
                             {"files", {unit + ".cu", unit + "." + arch + ".ptx", unit + "." + arch + ".cubin"}},
                             {"kernels", nlohmann::json::array()}};
  for (const std::string& name : set.names()) {
    nlohmann::json k = {{"name", name}};
    if (auto it = users.find(name); it != users.end()) k["tensors"] = it->second;
    manifest["kernels"].push_back(k);
  }
  write_atomically(dir / "gpu-manifest.json", manifest.dump(2) + "\n");
  if (!out.log.empty()) std::fprintf(stderr, "%s\n", out.log.c_str());
  std::printf("wrote %zu GPU kernels for %s to %s: %s.cu, %s.%s.ptx (%zu bytes), %s.%s.cubin (%zu bytes), "
              "gpu-manifest.json (NVRTC %s, %.2f s)\n",
              set.names().size(), arch.c_str(), out_dir.c_str(), unit.c_str(), unit.c_str(), arch.c_str(),
              out.ptx.size(), unit.c_str(), arch.c_str(), out.cubin.size(), nv->version_string().c_str(), out.seconds);
  return 0;
}

}  // namespace dllm::cli
