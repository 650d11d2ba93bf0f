// From an id to a verified local file: the cache first when only a path is wanted (resolve_model), the hub's
// listing when a pull must check or fetch (pull), and the cache alone when offline, saying so.
#include "hub/internal.h"
#include "common/interrupt.h"

namespace dllm::hub {

namespace {

PullResult cached_only(const ModelId& id, const Options& opts, const std::string& why) {
  std::string path = find_cached(opts, id);
  if (path.empty())
    throw Error(why + ", and " + id.str() + " is not in the cache (" + repo_cache_dir(opts, id.repo) +
                "): connect to the network and run: dllm pull " + id.str());
  opts.say(why + ": using the cached " + path + " (not checked against the hub)");
  PullResult r;
  r.path = path;
  r.status = PullStatus::kCachedOnly;
  r.file.path = path.substr(repo_cache_dir(opts, id.repo).size() + 1);
  return r;
}

}  // namespace

PullResult pull(const ModelId& id, const Options& opts) {
  if (opts.offline) return cached_only(id, opts, "offline mode (HF_HUB_OFFLINE is set)");
  // Ctrl-C stops the transfer in order: the resumable .part stays, the lock goes, the progress line is erased.
  InterruptScope interrupt_scope;
  std::vector<RemoteFile> files;
  try {
    files = list_files(opts, id.repo);
  } catch (const NetworkError& e) {
    if (!e.unreachable()) throw;
    return cached_only(id, opts, "no network: " + std::string(e.what()));
  }
  PullResult r;
  r.file = choose_gguf(files, id);
  r.path = repo_cache_dir(opts, id.repo) + "/" + r.file.path;
  if (cached_file_matches(r.path, r.file.size, r.file.sha256)) {
    r.status = PullStatus::kUpToDate;
    return r;
  }
  if (opts.confirm && !opts.confirm(r.file, r.path)) {
    r.status = PullStatus::kDeclined;
    r.path.clear();
    return r;
  }
  download_file(opts, file_url(opts, id.repo, r.file.path), r.path, r.file.size, r.file.sha256);
  r.status = PullStatus::kDownloaded;
  throw_if_interrupted(" after " + r.file.path + " was downloaded and verified");
  return r;
}

std::string resolve_model(const std::string& spec, const Options& opts) {
  const std::string s = spec.empty() ? default_model_id() : spec;
  auto id = parse_model_id(s);
  if (!id) return s;
  std::string cached = find_cached(opts, *id);
  if (!cached.empty()) return cached;
  if (opts.offline)
    throw Error("offline mode (HF_HUB_OFFLINE is set), and " + id->str() + " is not in the cache (" +
                repo_cache_dir(opts, id->repo) + "): unset HF_HUB_OFFLINE and run: dllm pull " + id->str());
  opts.say(id->str() + " is not in the cache yet: fetching it from " + host_of(opts.endpoint));
  try {
    PullResult r = pull(*id, opts);
    if (r.path.empty()) throw Error("the download of " + id->str() + " was declined");
    return r.path;
  } catch (const HttpError& e) {
    // A name that looked like an id may have been meant as a path.
    if (e.status() == 401 || e.status() == 404) throw Error(std::string(e.what()) + "; no file named " + s + " exists either");
    throw;
  }
}

std::string resolve_model(const std::string& spec) {
  auto id = parse_model_id(spec.empty() ? default_model_id() : spec);
  if (!id) return spec.empty() ? default_model_id() : spec;  // a path needs no cache folder nor HOME
  return resolve_model(spec, options_from_env());
}

}  // namespace dllm::hub
