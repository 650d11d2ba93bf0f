// dllm pull: fetch a model (by default the one `run` uses) into the cache, verified, and print its path.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <iostream>

#include "cli/commands_hub.h"
#include "hub/hub.h"
#include "cli/args.h"
#include "common/error.h"

namespace dllm::cli {

namespace {

struct PullArgs {
  std::string id;
  std::string quant;
  bool check = false;
  bool ask = false;
  bool help = false;
};

PullArgs parse_pull_args(const std::vector<std::string>& args) {
  PullArgs p;
  for (const auto& a : args)
    if (a == "--help" || a == "-h") {
      p.help = true;
      return p;
    }
  bool seen_quant = false, seen_check = false, seen_ask = false;
  auto once = [](bool& seen, const std::string& flag) {
    if (seen) throw usage_error("flag " + flag + " is given more than once");
    seen = true;
  };
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--quant") {
      once(seen_quant, a);
      if (i + 1 >= args.size()) throw usage_error("flag --quant needs a value");
      p.quant = args[++i];
      if (p.quant.empty()) throw usage_error("flag --quant needs a value");
    } else if (a == "--check") {
      once(seen_check, a);
      p.check = true;
    } else if (a == "--ask") {
      once(seen_ask, a);
      p.ask = true;
    } else if (a.size() > 1 && a[0] == '-') {
      size_t eq = a.find('=');
      if (eq != std::string::npos && a.substr(0, eq) == "--quant")
        throw usage_error("unknown flag " + a + " for 'pull'",
                          "flags take their value as the next argument: --quant " + a.substr(eq + 1));
      std::string msg = "unknown flag " + a + " for 'pull'";
      for (const char* known : {"quant", "check", "ask"})
        if (edit_distance(a.substr(a.find_first_not_of('-')), known) <= 2) msg += " (did you mean --" + std::string(known) + "?)";
      throw usage_error(msg, "see: dllm pull --help");
    } else if (p.id.empty()) {
      p.id = a;
    } else {
      throw usage_error("unexpected argument '" + a + "' for 'pull'");
    }
  }
  return p;
}

// The id to pull, from the argument (or the default model) and --quant.
hub::ModelId model_id(const PullArgs& p) {
  const std::string spec = p.id.empty() ? hub::default_model_id() : p.id;
  auto id = hub::parse_model_id(spec);
  if (!id) {
    throw usage_error("'" + spec + "' is not a Hugging Face model id: pull takes owner/repo[:QUANT]",
                      "see: dllm pull --help");
  }
  if (!p.quant.empty()) {
    if (!id->quant.empty() && p.id.size() && id->quant != p.quant)
      throw usage_error("the quant is given twice: '" + id->quant + "' in the id and --quant " + p.quant);
    id->quant = p.quant;
  }
  return *id;
}

// --ask: one question on the terminal. Without a terminal there is nobody to ask, so nothing is downloaded.
bool ask_user(const hub::RemoteFile& file, const std::string& dest) {
  if (!isatty(STDIN_FILENO)) {
    std::fprintf(stderr, "dllm: not downloading %s (%s): --ask needs a terminal to ask on\n", file.path.c_str(),
                 hub::format_bytes(file.size).c_str());
    return false;
  }
  std::fprintf(stderr, "Download %s (%s) into %s? [y/N] ", file.path.c_str(), hub::format_bytes(file.size).c_str(),
               dest.substr(0, dest.rfind('/')).c_str());
  std::fflush(stderr);
  std::string answer;
  if (!std::getline(std::cin, answer)) return false;
  return !answer.empty() && (answer[0] == 'y' || answer[0] == 'Y');
}

}  // namespace

std::string pull_usage() {
  return std::string(
             "dllm pull - download a model into the cache, check its sha256, print its path\n"
             "Usage:\n"
             "  dllm pull [ID] [options]\n\n"
             "  ID             owner/repo[:QUANT], a Hugging Face repo of GGUF files (default: ") +
         hub::kDefaultModel +
         ")\n"
         "                 QUANT (Q4_K_M, Q8_0, ... or a file name) is matched case-insensitively against the\n"
         "                 repo's GGUF file names; without it a repo's only GGUF file, else its Q4_K_M one\n"
         "  --quant Q      the quant, instead of :QUANT in the id\n"
         "  --check        download nothing: print the cached file's path and exit 0, or exit 1 if it is not cached\n"
         "  --ask          ask on the terminal before a download starts (no terminal: no download)\n"
         "  -h, --help     print this usage and exit\n\n"
         "Environment: DLLM_CACHE (else $XDG_CACHE_HOME/dllm, else ~/.cache/dllm), HF_ENDPOINT, HF_TOKEN,\n"
         "HF_HUB_OFFLINE=1 (only the cache), DLLM_MODEL (the default model id).\n";
}

int cmd_pull(const std::vector<std::string>& args) {
  PullArgs p = parse_pull_args(args);
  if (p.help) {
    std::cout << pull_usage();
    return 0;
  }
  hub::ModelId id = model_id(p);
  hub::Options opts = hub::options_from_env();
  if (p.check) {
    std::string path = hub::find_cached(opts, id);
    if (path.empty()) {
      std::fprintf(stderr, "dllm: %s is not in the cache (%s); to download it, run: dllm pull %s\n",
                   id.str().c_str(), hub::repo_cache_dir(opts, id.repo).c_str(), id.str().c_str());
      return 1;
    }
    std::cout << path << "\n";
    return 0;
  }
  if (p.ask) opts.confirm = ask_user;
  hub::PullResult r = hub::pull(id, opts);
  switch (r.status) {
    case hub::PullStatus::kDeclined:
      opts.say("nothing downloaded");
      return 0;
    case hub::PullStatus::kUpToDate:
      opts.say(id.str() + " is up to date");
      break;
    case hub::PullStatus::kDownloaded:
    case hub::PullStatus::kCachedOnly:
      break;
  }
  std::cout << r.path << "\n";
  return 0;
}

}  // namespace dllm::cli
