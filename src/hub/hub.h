// Getting models: a --model value that is a Hugging Face id (owner/repo[:QUANT]) becomes a local GGUF path.
// Files are listed through the hub's API, downloaded with libcurl into a cache folder (resuming partial files,
// sha256-verified, renamed into place only when verified, one downloader per file thanks to a lock), and found
// again in the cache without a network. Environment: HF_ENDPOINT, HF_TOKEN, HF_HUB_OFFLINE, DLLM_CACHE,
// XDG_CACHE_HOME, DLLM_MODEL, DLLM_STALL_TIMEOUT.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace dllm::hub {

// The model `run` uses when --model is absent, and `pull` fetches when given no id: the one place naming it.
// LLaDA-8B-Instruct quantized by llama.cpp's converter; the file is LLaDA-8B-Instruct.Q4_K_M.gguf (4.9 GB).
inline constexpr const char* kDefaultModel = "mradermacher/LLaDA-8B-Instruct-GGUF:Q4_K_M";
// The quant picked when an id names no quant and its repo holds several GGUF files.
inline constexpr const char* kDefaultQuant = "Q4_K_M";

// $DLLM_MODEL when set and not empty, else kDefaultModel.
std::string default_model_id();

struct ModelId {
  std::string repo;   // "owner/name"
  std::string quant;  // "" when the id names none; a quant (Q4_K_M) or a file name of the repo
  std::string str() const { return quant.empty() ? repo : repo + ":" + quant; }
};

// Tells a model spec apart: an existing file or folder, or a name ending in .gguf (without an id's
// ":QUANT"), is a path (nullopt); owner/name[:QUANT] is an id. Anything else is a path too, and the model
// loader reports it.
std::optional<ModelId> parse_model_id(const std::string& spec);

// One file of a hub repository. sha256 is "" when the hub publishes none (small files kept in git).
struct RemoteFile {
  std::string path;  // relative to the repo root, '/'-separated
  uint64_t size = 0;
  std::string sha256;
};

// Picks the GGUF file an id names. The quant is matched case-insensitively against the files' paths as a
// whole word, a word being a run of letters, digits and '_' ("Q4_K" does not match "Q4_K_M", "Q4_XS" does not
// match "IQ4_XS"; a file name matches itself); an id with no quant takes the
// repo's only GGUF file, else its kDefaultQuant one. Throws dllm::Error listing the choices when nothing or
// more than one file matches. mmproj-* files (vision projectors) are never picked.
const RemoteFile& choose_gguf(const std::vector<RemoteFile>& files, const ModelId& id);
// The quant label inside a file name ("model.Q4_K_M.gguf" -> "Q4_K_M"); "" when none is recognised.
std::string quant_label(const std::string& file_name);

// Parses the hub's file listing: the tree API's array ({"type","path","size","lfs":{"oid","size"}}) or the
// model-info object ({"siblings":[{"rfilename","size","lfs":{"sha256","size"}}]}). Folders are skipped.
std::vector<RemoteFile> parse_file_list(const std::string& json, const std::string& what);

inline constexpr long kStallBytesPerSecond = 1024;

struct Options {
  std::string endpoint = "https://huggingface.co";  // HF_ENDPOINT, no trailing slash
  std::string token;                                // HF_TOKEN, sent as a bearer token to the endpoint only
  std::string cache_dir;                            // see cache_dir_from_env()
  bool offline = false;                             // HF_HUB_OFFLINE: only the cache, no network at all
  bool progress = false;                            // draw a progress bar (stderr is a terminal)
  int retries = 3;                                  // resumed attempts after an interrupted transfer
  int retry_delay_ms = 1000;                        // doubled after each retry
  // A transfer slower than kStallBytesPerSecond for this long has stalled and fails (a download is then resumed
  // by a retry): DLLM_STALL_TIMEOUT seconds, default 60. Bounds how long a trickling server can hold a pull.
  long stall_seconds = 60;
  // One line of information for the user (default: "dllm: " + line on stderr).
  std::function<void(const std::string&)> note;
  // Asked before a download starts; false skips it. Unset: download without asking.
  std::function<bool(const RemoteFile& file, const std::string& dest)> confirm;

  void say(const std::string& line) const;
};

// The cache folder: $DLLM_CACHE, else $XDG_CACHE_HOME/dllm (when absolute), else $HOME/.cache/dllm.
std::string cache_dir_from_env();
// Options from the environment; progress is on when stderr is a terminal.
Options options_from_env();

// Where the files of a repo live in the cache: <cache>/models/<owner>/<name>.
std::string repo_cache_dir(const Options& opts, const std::string& repo);
// The cached file an id names ("" when the cache holds none that matches). Throws when the cached files make
// the id ambiguous.
std::string find_cached(const Options& opts, const ModelId& id);

// Lists a repo's files through {endpoint}/api/models/{repo}/tree/main (following its pagination).
std::vector<RemoteFile> list_files(const Options& opts, const std::string& repo);
// {endpoint}/{repo}/resolve/main/{path}, each path segment percent-encoded.
std::string file_url(const Options& opts, const std::string& repo, const std::string& path);

// Downloads url to dest: through dest + ".part" (resumed with a Range request when it exists), under the lock
// dest + ".lock" (a second process waits and says so), checked against size and sha256 (when not empty), and
// renamed to dest only then. Every failure throws dllm::Error and leaves no file under dest's name. A file with
// neither a size nor a sha256 is refused (nothing bounds or checks it); one with a size only is downloaded with a
// warning, and no digest is recorded beside it.
void download_file(const Options& opts, const std::string& url, const std::string& dest, uint64_t size,
                   const std::string& sha256);

enum class PullStatus {
  kDownloaded,  // fetched and verified now
  kUpToDate,    // the cached file matches what the hub publishes
  kCachedOnly,  // offline (HF_HUB_OFFLINE or no network): the cached file, not checked against the hub
  kDeclined,    // Options::confirm said no
};
struct PullResult {
  std::string path;  // the local file ("" when declined)
  PullStatus status = PullStatus::kDownloaded;
  RemoteFile file;   // the chosen file (path relative to the repo)
};
// Makes the file an id names present and verified in the cache.
PullResult pull(const ModelId& id, const Options& opts);

// Turns a --model value into a local path: a path is returned as is; an id is looked up in the cache and
// downloaded when missing. An empty spec means default_model_id().
std::string resolve_model(const std::string& spec, const Options& opts);
std::string resolve_model(const std::string& spec);  // with options_from_env()

// Sizes and durations for messages: "4.92 GB", "1.4 MB", "512 B"; "1h02m", "3m05s", "42s".
std::string format_bytes(uint64_t n);
std::string format_duration(double seconds);

}  // namespace dllm::hub
