// Model specs: telling a path from an owner/repo[:QUANT] id, and picking the GGUF file a quant names among a
// repo's files (the hub's listing or the cache's), with errors that list the choices.
#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <regex>

#include "hub/internal.h"
#include "common/printable.h"
#include "common/utf8.h"

namespace dllm::hub {

namespace {

bool ends_with_gguf(const std::string& s) { return s.size() >= 5 && ascii_lower(s.substr(s.size() - 5)) == ".gguf"; }

bool name_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-'; }

// A Hugging Face user/organisation or repo name: letters, digits, '.', '_', '-', not starting with a symbol.
bool valid_name(const std::string& s) {
  if (s.empty() || s.size() > 96 || !std::isalnum(static_cast<unsigned char>(s[0]))) return false;
  if (s.find("..") != std::string::npos) return false;
  return std::all_of(s.begin(), s.end(), name_char);
}

bool valid_quant(const std::string& q) {
  if (q.empty() || q.size() > 200) return false;
  for (char c : q)
    if (!name_char(c) && c != '/') return false;
  return safe_relative_path(q);
}

// Quant names contain '_' (Q4_K_M), so a "word" is a run of letters, digits and '_'.
bool word_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

// The quant occurs in the name as a whole word (case-insensitive).
bool quant_matches(const std::string& name, const std::string& quant) {
  std::string n = ascii_lower(name), q = ascii_lower(quant);
  for (size_t pos = n.find(q); pos != std::string::npos; pos = n.find(q, pos + 1)) {
    bool start_ok = pos == 0 || !word_char(n[pos - 1]);
    size_t end = pos + q.size();
    bool end_ok = end == n.size() || !word_char(n[end]);
    if (start_ok && end_ok) return true;
  }
  return false;
}

std::string base_name(const std::string& path) {
  size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

std::vector<const RemoteFile*> gguf_candidates(const std::vector<RemoteFile>& files) {
  std::vector<const RemoteFile*> out;
  for (const auto& f : files)
    if (ends_with_gguf(f.path) && ascii_lower(base_name(f.path)).rfind("mmproj", 0) != 0) out.push_back(&f);
  std::sort(out.begin(), out.end(), [](const RemoteFile* a, const RemoteFile* b) { return a->path < b->path; });
  return out;
}

std::string describe(const std::vector<const RemoteFile*>& files) {
  std::string s;
  for (const RemoteFile* f : files) {
    if (!s.empty()) s += ", ";
    std::string label = quant_label(f->path);
    s += label.empty() ? shown(f->path) + " (" + format_bytes(f->size) + ")"
                       : shown(label) + " (" + shown(f->path) + ", " + format_bytes(f->size) + ")";
  }
  return s;
}

}  // namespace

std::optional<ModelId> parse_model_id(const std::string& spec) {
  if (spec.empty()) return std::nullopt;
  struct stat st;
  if (::stat(spec.c_str(), &st) == 0) return std::nullopt;  // an existing file or folder is used as is
  ModelId id;
  size_t colon = spec.find(':');
  id.repo = spec.substr(0, colon);
  if (colon != std::string::npos) {
    id.quant = spec.substr(colon + 1);
    if (!valid_quant(id.quant)) return std::nullopt;
  } else if (ends_with_gguf(spec)) {
    return std::nullopt;  // a path to a GGUF file that does not exist: the loader says so
  }
  size_t slash = id.repo.find('/');
  if (slash == std::string::npos || !valid_name(id.repo.substr(0, slash)) || !valid_name(id.repo.substr(slash + 1)))
    return std::nullopt;
  return id;
}

// Quant words as llama.cpp's and unsloth's repositories name them: Q4_K_M, IQ4_XS, Q5_0, and unsloth's dynamic
// UD-Q4_K_XL (whose label is Q4_K_XL; the spec may say either).
std::string quant_label(const std::string& file_name) {
  static const std::regex kQuant(
      "(I?Q[1-8]_(K(_(XL|[SML]))?|[0-9](_[0-9]_[0-9])?|XXS|XS|S|M|NL|L)|TQ[12]_0|BF16|F16|F32|MXFP4)",
      std::regex::icase | std::regex::optimize);
  std::string name = base_name(file_name), label;
  // The last whole word (a run of letters, digits and '_') that is a quant name.
  for (size_t a = 0; a < name.size();) {
    if (!word_char(name[a])) {
      ++a;
      continue;
    }
    size_t b = a;
    while (b < name.size() && word_char(name[b])) ++b;
    std::string word = name.substr(a, b - a);
    if (std::regex_match(word, kQuant)) {
      label = word;
      for (char& c : label) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    }
    a = b;
  }
  return label;
}

const RemoteFile& choose_gguf(const std::vector<RemoteFile>& files, const ModelId& id) {
  auto candidates = gguf_candidates(files);
  if (candidates.empty()) throw Error(id.repo + " has no GGUF file");
  if (id.quant.empty() && candidates.size() == 1) return *candidates[0];
  const std::string quant = id.quant.empty() ? kDefaultQuant : id.quant;
  std::vector<const RemoteFile*> matches;
  for (const RemoteFile* f : candidates)
    if (quant_matches(f->path, quant)) matches.push_back(f);
  if (matches.size() == 1) return *matches[0];
  if (matches.empty() && id.quant.empty())
    throw Error(id.repo + " has several GGUF files and none is " + kDefaultQuant +
                ": name one as " + id.repo + ":QUANT; choices: " + describe(candidates));
  if (matches.empty())
    throw Error("no GGUF file of " + id.repo + " matches the quant '" + quant + "'; choices: " + describe(candidates));
  throw AmbiguousError("the quant '" + quant + "' is ambiguous in " + id.repo + ": it matches " + describe(matches) +
              "; name the file instead, as " + id.repo + ":FILE");
}

}  // namespace dllm::hub
