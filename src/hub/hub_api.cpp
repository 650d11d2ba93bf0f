// The Hugging Face hub's HTTP API as dllm uses it: the file listing of a repo with each file's size and the
// sha256 the hub publishes for it (its LFS object id), and the URL a file is downloaded from.
#include <curl/curl.h>
#include <nlohmann/json.hpp>

#include <cctype>

#include "hub/internal.h"
#include "common/printable.h"

namespace dllm::hub {

namespace {

using nlohmann::json;

// Bounds on one page of a listing (a real page of 1000 files is well under 1 MB, and 3 levels deep).
constexpr size_t kMaxListingBytes = 16u << 20;
constexpr int kMaxListingDepth = 16;

// A 64-digit hex sha256 (lower-cased), "" for anything else; accepts a "sha256:" prefix.
std::string normalize_sha(std::string s) {
  if (s.rfind("sha256:", 0) == 0) s = s.substr(7);
  if (s.size() != 64) return "";
  for (char& c : s) {
    if (!std::isxdigit(static_cast<unsigned char>(c))) return "";
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  return s;
}

uint64_t size_of(const json& v) {
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  if (v.is_number_integer() && v.get<int64_t>() >= 0) return static_cast<uint64_t>(v.get<int64_t>());
  return 0;
}

RemoteFile entry(const json& e, const char* path_key, const char* sha_key) {
  RemoteFile f;
  f.path = e.value(path_key, "");
  if (e.contains("size")) f.size = size_of(e["size"]);
  if (e.contains("lfs") && e["lfs"].is_object()) {
    const json& lfs = e["lfs"];
    if (lfs.contains(sha_key) && lfs[sha_key].is_string()) f.sha256 = normalize_sha(lfs[sha_key].get<std::string>());
    if (lfs.contains("size")) f.size = size_of(lfs["size"]);
  }
  return f;
}

// The URL of the next page from a Link header: <https://...>; rel="next".
std::string next_link(const Headers& headers) {
  auto it = headers.find("link");
  if (it == headers.end()) return "";
  const std::string& v = it->second;
  for (size_t pos = 0; (pos = v.find('<', pos)) != std::string::npos; ++pos) {
    size_t end = v.find('>', pos);
    if (end == std::string::npos) break;
    size_t next = v.find('<', end);
    std::string params = v.substr(end, next == std::string::npos ? std::string::npos : next - end);
    if (params.find("rel=\"next\"") != std::string::npos || params.find("rel=next") != std::string::npos)
      return v.substr(pos + 1, end - pos - 1);
  }
  return "";
}

// True when the JSON text nests arrays and objects deeper than max_depth (strings are skipped). A listing is a
// list of flat objects: a deep one is hostile (30 million levels would take gigabytes once parsed).
bool nested_deeper_than(const std::string& text, int max_depth) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if (in_string) {
      if (c == '\\') ++i;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) return true;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return false;
}

std::string escape_segment(const std::string& s) {
  char* e = curl_easy_escape(nullptr, s.c_str(), static_cast<int>(s.size()));
  if (!e) throw Error("cannot encode the URL path segment '" + s + "'");
  std::string out = e;
  curl_free(e);
  return out;
}

}  // namespace

std::vector<RemoteFile> parse_file_list(const std::string& text, const std::string& what) {
  if (text.size() > kMaxListingBytes)
    throw Error("the hub's file list for " + what + " is larger than " + format_bytes(kMaxListingBytes));
  if (nested_deeper_than(text, kMaxListingDepth))
    throw Error("the hub's file list for " + what + " is nested deeper than " + std::to_string(kMaxListingDepth) +
                " levels: not a file list");
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded()) throw Error("the hub's file list for " + what + " is not valid JSON");
  std::vector<RemoteFile> files;
  auto keep = [&](RemoteFile f) {
    if (f.path.empty()) return;
    if (!safe_relative_path(f.path)) throw Error("the hub's file list for " + what + " has an unsafe path: " + shown(f.path));
    files.push_back(std::move(f));
  };
  try {
    if (j.is_array()) {  // /api/models/{repo}/tree/{revision}
      for (const json& e : j)
        if (e.is_object() && e.value("type", "file") == "file") keep(entry(e, "path", "oid"));
    } else if (j.is_object() && j.contains("siblings") && j["siblings"].is_array()) {  // /api/models/{repo}
      for (const json& e : j["siblings"])
        if (e.is_object()) keep(entry(e, "rfilename", "sha256"));
    } else {
      throw Error("the hub's answer for " + what + " is not a file list");
    }
  } catch (const json::exception& e) {
    throw Error("the hub's file list for " + what + " has an unexpected shape: " + e.what());
  }
  return files;
}

std::vector<RemoteFile> list_files(const Options& opts, const std::string& repo) {
  std::vector<RemoteFile> all;
  std::string url = opts.endpoint + "/api/models/" + repo + "/tree/main?recursive=true";
  for (int page = 0; !url.empty(); ++page) {
    if (page > 1000) throw Error("the hub's file list for " + repo + " does not end");
    HttpResponse r = http_get(opts, url, kMaxListingBytes);
    if (r.status != 200) throw HttpError(http_status_message(r.status, r.headers, r.body, repo, opts), r.status);
    if (looks_like_html(r.headers, r.body))
      throw Error("the hub at " + opts.endpoint + " answered with an HTML page instead of the file list of " + repo +
                  " (is HF_ENDPOINT right?)");
    auto files = parse_file_list(r.body, repo);
    all.insert(all.end(), files.begin(), files.end());
    url = next_link(r.headers);
    // The next page must come from the endpoint itself: another host, port or scheme (an http downgrade, a
    // file: URL) would receive the token, or serve a listing nobody vouched for.
    if (!url.empty() && origin_of(url) != origin_of(opts.endpoint))
      throw Error("the hub's file list for " + repo + " points its next page at another address (" + shown(url) +
                  ") than " + opts.endpoint + ": refused");
  }
  return all;
}

std::string file_url(const Options& opts, const std::string& repo, const std::string& path) {
  std::string url = opts.endpoint + "/" + repo + "/resolve/main";
  size_t a = 0;
  for (;;) {
    size_t b = path.find('/', a);
    url += '/';
    url += escape_segment(path.substr(a, b == std::string::npos ? std::string::npos : b - a));
    if (b == std::string::npos) break;
    a = b + 1;
  }
  return url;
}

}  // namespace dllm::hub
