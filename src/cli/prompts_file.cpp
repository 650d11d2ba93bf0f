// The request lines of `dllm run --prompts-file` (prompts_file.h).
#include "cli/prompts_file.h"

#include <cmath>
#include <limits>

#include "cli/args.h"
#include "cli/run_config.h"
#include "common/error.h"

namespace dllm::cli {

namespace {

using json = nlohmann::ordered_json;

constexpr const char* kKeys[] = {"prompt",  "prompt_tokens", "id",   "system",    "no_chat",   "max_tokens",
                                 "steps",   "block_length",  "remasking", "temperature", "seed", "threshold",
                                 "dual_cache", "eb_max_steps", "eb_t_min", "eb_t_max", "eb_entropy_bound",
                                 "eb_stability", "eb_confidence", "self_cond_top_k"};
constexpr const char* kRemasking = "low_confidence|random|entropy|maskgit_plus|topk_margin";

// A value as the message shows it (JSON text, cut short).
std::string shown(const json& v) {
  std::string s = v.dump(-1, ' ', false, json::error_handler_t::replace);
  if (s.size() > 40) s = s.substr(0, 37) + "...";
  return s;
}

class LineParser {
 public:
  LineParser(const std::string& label, int64_t line) : label_(label), line_(line) {}

  Error error(const std::string& msg) const {
    return usage_error(label_ + " line " + std::to_string(line_) + ": " + msg);
  }
  Error key_error(const std::string& key, const std::string& msg) const {
    return error("key \"" + key + "\" " + msg);
  }

  int64_t integer(const std::string& key, const json& v, int64_t min, int64_t max = INT64_MAX) const {
    if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX)))
      throw key_error(key, "needs an integer, got " + shown(v));
    const int64_t x = v.get<int64_t>();
    if (x < min) throw key_error(key, "must be at least " + std::to_string(min) + ", got " + std::to_string(x));
    if (x > max) throw key_error(key, "must be at most " + std::to_string(max) + ", got " + std::to_string(x));
    return x;
  }
  double number(const std::string& key, const json& v, double lo, double hi) const {
    if (!v.is_number()) throw key_error(key, "needs a number, got " + shown(v));
    const double x = v.get<double>();
    if (!std::isfinite(x)) throw key_error(key, "needs a finite number, got " + shown(v));
    if (x < lo) throw key_error(key, "must be at least " + format_number(lo) + ", got " + format_number(x));
    if (x > hi) {
      throw key_error(key, "must be between " + format_number(lo) + " and " + format_number(hi) + ", got " +
                               format_number(x));
    }
    return x;
  }
  bool boolean(const std::string& key, const json& v) const {
    if (!v.is_boolean()) throw key_error(key, "needs true or false, got " + shown(v));
    return v.get<bool>();
  }
  std::string string(const std::string& key, const json& v) const {
    if (!v.is_string()) throw key_error(key, "needs a string, got " + shown(v));
    return v.get<std::string>();
  }

  FileRequest parse(std::string_view text, const Settings& flags) const {
    json obj;
    try {
      obj = json::parse(text);
    } catch (const json::parse_error& e) {
      std::string why = e.what();
      if (const size_t p = why.find("parse error"); p != std::string::npos) why = why.substr(p);
      throw error("not valid JSON (" + why + ")");
    }
    if (!obj.is_object()) throw error("needs a JSON object, got " + shown(obj));
    FileRequest fr;
    fr.line = line_;
    Settings& s = fr.settings;
    s = flags;
    bool has_prompt = false, has_tokens = false;
    for (const auto& [key, v] : obj.items()) {
      if (key == "prompt") {
        s.prompt = string(key, v), s.has_prompt = has_prompt = true;
      } else if (key == "prompt_tokens") {
        if (!v.is_array()) throw key_error(key, "needs an array of token ids, got " + shown(v));
        s.prompt_tokens.clear();
        for (const auto& id : v) {
          if (!id.is_number_integer() || (id.is_number_unsigned() && id.get<uint64_t>() > uint64_t(INT64_MAX)))
            throw key_error(key, "needs an array of integers, got " + shown(id) + " in it");
          if (id.get<int64_t>() < 0) throw key_error(key, "needs non-negative ids, got " + shown(id));
          s.prompt_tokens.push_back(id.get<int64_t>());
        }
        s.has_prompt_tokens = has_tokens = true;
      } else if (key == "id") {
        if (!v.is_string() && !v.is_number()) throw key_error(key, "needs a string or a number, got " + shown(v));
        fr.id = v;
      } else if (key == "system") {
        fr.request.system = string(key, v);
      } else if (key == "no_chat") {
        s.no_chat = boolean(key, v);
      } else if (key == "max_tokens") {
        s.max_tokens = integer(key, v, 1);
      } else if (key == "steps") {
        s.steps = integer(key, v, 1);
      } else if (key == "block_length") {
        s.block_length = integer(key, v, 1), s.has_block_length = true;
      } else if (key == "remasking") {
        s.remasking = string(key, v);
        if (!model::parse_remasking(s.remasking))
          throw key_error(key, std::string("must be one of ") + kRemasking + ", got " + shown(v));
      } else if (key == "temperature") {
        s.temperature = number(key, v, 0, std::numeric_limits<double>::infinity());
      } else if (key == "seed") {
        if (!v.is_number_integer()) throw key_error(key, "needs an integer, got " + shown(v));
        if (v.is_number_integer() && !v.is_number_unsigned() && v.get<int64_t>() < 0)
          throw key_error(key, "must be at least 0, got " + shown(v));
        s.seed = v.get<uint64_t>();
      } else if (key == "threshold") {
        s.threshold = number(key, v, 0, 1);
      } else if (key == "dual_cache") {
        s.dual_cache = boolean(key, v);
      } else if (key == "eb_max_steps") {
        s.eb_max_steps = integer(key, v, 1);
      } else if (key == "eb_stability") {
        s.eb_stability = integer(key, v, 0);
      } else if (key == "self_cond_top_k") {
        s.self_cond_top_k = integer(key, v, 0, model::kMaxSelfCondTopK);
      } else if (key == "eb_t_min" || key == "eb_t_max" || key == "eb_entropy_bound" || key == "eb_confidence") {
        const double x = number(key, v, 0, std::numeric_limits<double>::infinity());
        (key == "eb_t_min" ? s.eb_t_min : key == "eb_t_max" ? s.eb_t_max : key == "eb_entropy_bound" ? s.eb_entropy_bound : s.eb_confidence) = x;
      } else {
        std::string suggestion;
        size_t best = 3;
        for (const char* k : kKeys) {
          const size_t d = edit_distance(key, k);
          if (d < best) best = d, suggestion = k;
        }
        throw error("unknown key \"" + key + "\"" + (suggestion.empty() ? "" : " (did you mean \"" + suggestion + "\"?)"));
      }
    }
    if (has_prompt && has_tokens) throw error("keys \"prompt\" and \"prompt_tokens\" cannot be combined: give one of them");
    if (!has_prompt && !has_tokens) throw error("needs key \"prompt\" or \"prompt_tokens\"");
    const std::optional<std::string> system = fr.request.system;
    fr.request = request_of(s);
    fr.request.system = system;
    try {
      engine::check_sampling(fr.request.sampling);
    } catch (const engine::RequestError& e) {
      throw line_error(label_, line_, e);
    }
    return fr;
  }

 private:
  const std::string& label_;
  int64_t line_;
};

}  // namespace

std::string prompts_file_label(const std::string& path) {
  return path == "-" ? "--prompts-file - (standard input)" : "--prompts-file " + path;
}

std::string key_name(std::string_view name) {
  if (name == "setting") return "key";
  if (name == "settings") return "keys";
  return "\"" + std::string(name) + "\"";
}

Error line_error(const std::string& label, int64_t line, const engine::RequestError& e) {
  return usage_error(label + " line " + std::to_string(line) + ": " + e.message(key_name));
}

std::vector<FileRequest> parse_prompts_file(std::string_view text, const Settings& flags, const std::string& label) {
  std::vector<FileRequest> out;
  int64_t line = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t nl = text.find('\n', pos);
    std::string_view l = text.substr(pos, nl == std::string_view::npos ? std::string_view::npos : nl - pos);
    pos = nl == std::string_view::npos ? text.size() : nl + 1;
    ++line;
    if (!l.empty() && l.back() == '\r') l.remove_suffix(1);
    if (line == 1 && l.substr(0, 3) == "\xEF\xBB\xBF") l.remove_prefix(3);  // a UTF-8 byte order mark
    if (l.find_first_not_of(" \t") == std::string_view::npos) continue;  // blank
    out.push_back(LineParser(label, line).parse(l, flags));
  }
  return out;
}

}  // namespace dllm::cli
