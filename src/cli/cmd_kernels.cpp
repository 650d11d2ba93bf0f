// `dllm kernels --model PATH --out DIR [--isa F] [--rows N]`: generates the GEMM kernels a model's weight
// matrices use (without loading or running the model) and writes, per kernel, its machine code
// (NAME.bin), a listing (NAME.txt: objdump's disassembly when objdump is installed, else hex) and one
// manifest.json (shape, family, tile, size, and which tensors use each kernel).
#include <cxxopts.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>

#include "cli/commands_jit.h"
#include "jit/gemm.h"
#include "jit/gemm_desc.h"
#include "jit/kernel_cache.h"
#include "common/error.h"
#include "model/gguf.h"

namespace dllm::cli {

namespace {

namespace fs = std::filesystem;

const char* kSynopsis = "kernels --model PATH --out DIR [--isa F] [--rows N]";

// The full path of an executable on PATH, or "".
std::string find_on_path(const std::string& exe) {
  const char* path = std::getenv("PATH");
  std::string p = path ? path : "/usr/bin:/bin";
  size_t start = 0;
  while (start <= p.size()) {
    const size_t end = p.find(':', start);
    const std::string dir = p.substr(start, end == std::string::npos ? std::string::npos : end - start);
    if (!dir.empty() && access((dir + "/" + exe).c_str(), X_OK) == 0) return dir + "/" + exe;
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return "";
}

// Runs argv (no shell) with stdout sent to out_path; true on exit status 0.
bool run_to_file(const std::vector<std::string>& argv, const std::string& out_path) {
  const pid_t pid = fork();
  if (pid < 0) return false;
  if (pid == 0) {
    FILE* f = std::fopen(out_path.c_str(), "w");
    if (!f) _exit(127);
    dup2(fileno(f), 1);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  int status = 0;
  if (waitpid(pid, &status, 0) < 0) return false;
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

void write_file(const fs::path& path, const void* data, size_t size) {
  std::ofstream f(path, std::ios::binary);
  f.write(static_cast<const char*>(data), static_cast<std::streamsize>(size));
  if (!f) throw Error("cannot write " + path.string());
}

std::string hex_listing(const uint8_t* code, size_t size) {
  std::string out;
  char buf[32];
  for (size_t i = 0; i < size; i += 16) {
    std::snprintf(buf, sizeof buf, "%08zx:", i);
    out += buf;
    for (size_t j = i; j < std::min(size, i + 16); ++j) {
      std::snprintf(buf, sizeof buf, " %02x", code[j]);
      out += buf;
    }
    out += "\n";
  }
  return out;
}

}  // namespace

std::string kernels_usage() {
  return std::string("usage: dllm ") + kSynopsis +
         "\n\nGenerates the GEMM kernels the model's weight matrices use and writes NAME.bin (machine code),\n"
         "NAME.txt (objdump disassembly, or hex without objdump) and manifest.json to DIR. Needs no GPU and\n"
         "does not run the model.\n"
         "  --isa F    kernel family: " + isa_list(/*generated_only=*/true) +
         ", also one this CPU lacks (the code\n"
         "             is written, never run; default: the best this CPU has, capped by DLLM_ISA; portable, the\n"
         "             plain C++ family, has no generated kernels)\n"
         "  --rows N   only the row tiles a call with N activation rows uses (default: every tile size)\n";
}

int cmd_kernels(const std::vector<std::string>& args) {
  cxxopts::Options opts("dllm kernels", "Writes the model's generated GEMM kernels.");
  opts.add_options()("model", "GGUF file", cxxopts::value<std::string>())("out", "output folder", cxxopts::value<std::string>())(
      "isa", "kernel family", cxxopts::value<std::string>())("rows", "activation rows", cxxopts::value<int64_t>())(
      "h,help", "this help");
  std::vector<std::string> words = {"dllm"};
  words.insert(words.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& w : words) argv.push_back(w.data());
  cxxopts::ParseResult res;
  try {
    res = opts.parse(static_cast<int>(argv.size()), argv.data());
  } catch (const cxxopts::exceptions::exception& e) {
    throw usage_error(std::string(e.what()) + " (dllm kernels)", "see: dllm kernels --help");
  }
  if (res.count("help")) {
    std::cout << kernels_usage();
    return 0;
  }
  if (!res.unmatched().empty())
    throw usage_error("unexpected argument '" + res.unmatched().front() + "' for dllm kernels", "see: dllm kernels --help");
  for (const char* req : {"model", "out"})
    if (!res.count(req)) throw usage_error(std::string("dllm kernels needs --") + req, "see: dllm kernels --help");
  const int64_t rows = res.count("rows") ? res["rows"].as<int64_t>() : 0;
  if (res.count("rows") && rows < 1) throw usage_error("--rows must be a positive integer");
  // Any family, also one this CPU lacks: the kernels are generated and written, never run.
  const jit::Isa isa = isa_from_flag(res.count("isa") ? res["isa"].as<std::string>() : "", "kernels",
                                     /*any_cpu=*/true, /*generated_only=*/true);

  const auto file = gguf::File::open(res["model"].as<std::string>());
  const fs::path out_dir = res["out"].as<std::string>();
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec || !fs::is_directory(out_dir)) throw Error("cannot create output folder " + out_dir.string() + ": " + ec.message());

  // Each matrix the forward pass multiplies by (embedding lookups are not products), by descriptor.
  std::map<std::string, std::pair<jit::GemmDesc, std::vector<std::string>>> uses;
  std::vector<nlohmann::json> skipped;
  for (const gguf::TensorInfo& t : file->tensors()) {
    // Matrices, and the 3-D expert tensors (one kernel shape for all their experts).
    if ((t.n_dims != 2 && !(t.n_dims == 3 && t.name.ends_with("_exps.weight"))) || t.name == "token_embd.weight") continue;
    if (t.name.ends_with("ffn_gate_inp.weight")) continue;  // a router: computed with the routing, on the host
    if (!jit::jit_supports_type(t.type())) {
      skipped.push_back({{"tensor", std::string(t.name)}, {"type", ggml_type_name(t.type())}, {"reason", "no JIT kernel for this type (reference path)"}});
      continue;
    }
    // The tiles gemm() uses for --rows rows, or every tile size a call could use, in the family the executor
    // runs this type in (under amx, the avx512-vnni kernels for a type without an AMX body).
    const jit::Isa family = jit::matrix_family(isa, t.type());
    std::vector<int64_t> row_counts;
    if (rows > 0) {
      row_counts.push_back(rows);
    } else {
      for (int64_t r = 1; r <= jit::max_row_tile(family, t.type(), t.ne[0]); ++r) row_counts.push_back(r);
    }
    std::vector<std::string> names;
    for (int64_t r : row_counts) {
      for (const jit::RowTile& tile : jit::plan_row_tiles(family, t.type(), t.ne[1], t.ne[0], r)) {
        const std::string name = tile.desc.name();
        if (std::find(names.begin(), names.end(), name) != names.end()) continue;
        names.push_back(name);
        auto& entry = uses[name];
        entry.first = tile.desc;
        entry.second.emplace_back(t.name);
      }
    }
  }

  const std::string objdump = find_on_path("objdump");
  nlohmann::json manifest = {{"model", file->path()},
                             {"isa", jit::isa_name(isa)},
                             {"cpu", jit::cpu_features().brand},
                             {"listing", objdump.empty() ? "hex" : "objdump -D -b binary -mi386:x86-64"},
                             {"kernels", nlohmann::json::array()},
                             {"skipped", skipped}};
  size_t total = 0;
  for (const auto& [name, entry] : uses) {
    const auto kernel = jit::generate_kernel(entry.first, /*any_cpu=*/true);
    const fs::path bin = out_dir / (name + ".bin"), txt = out_dir / (name + ".txt");
    write_file(bin, kernel->code(), kernel->code_size());
    bool listed = false;
    if (!objdump.empty())
      listed = run_to_file({objdump, "-D", "-b", "binary", "-mi386:x86-64", bin.string()}, txt.string());
    if (!listed) {
      const std::string hex = hex_listing(kernel->code(), kernel->code_size());
      write_file(txt, hex.data(), hex.size());
    }
    const jit::GemmDesc& d = entry.first;
    manifest["kernels"].push_back({{"name", name},
                                   {"family", jit::isa_name(d.isa)},
                                   {"weight_type", ggml_type_name(d.wtype)},
                                   {"activation_type", jit::act_format_for(d.wtype) == jit::ActFormat::Q8_0 ? "Q8_0" : "Q8_K"},
                                   {"n", d.n},
                                   {"k", d.k},
                                   {"row_tile", d.m},
                                   {"panel_rows", d.p()},
                                   {"code_bytes", kernel->code_size()},
                                   {"bin", bin.filename().string()},
                                   {"listing", txt.filename().string()},
                                   {"listing_kind", listed ? "objdump" : "hex"},
                                   {"tensors", entry.second}});
    total += kernel->code_size();
  }
  std::ofstream mf(out_dir / "manifest.json");
  mf << manifest.dump(1) << "\n";
  if (!mf) throw Error("cannot write " + (out_dir / "manifest.json").string());
  std::cout << "wrote " << uses.size() << " kernels (" << total << " bytes of code, " << jit::isa_name(isa) << ") to "
            << out_dir.string() << "\n";
  if (!skipped.empty()) std::cout << skipped.size() << " matrices have no JIT kernel (see manifest.json)\n";
  return 0;
}

}  // namespace dllm::cli
