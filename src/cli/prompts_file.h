// `dllm run --prompts-file`: the requests of a JSON Lines file, one object a line, checked whole before the
// model is opened. A line holds "prompt" (text) or "prompt_tokens" (ids), optionally "id" (a string or a
// number, echoed back), "system", "no_chat" and the generation flags as keys without dashes ("max_tokens",
// "steps", "block_length", "remasking", "temperature", "seed", "threshold", "dual_cache"); the flags are
// the defaults. Blank lines are skipped.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "cli/settings.h"
#include "engine/request.h"

namespace dllm::cli {

struct FileRequest {
  int64_t line = 0;            // 1-based line of the file
  nlohmann::ordered_json id;   // "id" as given; null when absent
  engine::Request request;     // the flags with the line's keys applied
  Settings settings;           // the same as flags (for the --json report's "settings")
};

// "--prompts-file PATH" or "--prompts-file - (standard input)": how messages name the file.
std::string prompts_file_label(const std::string& path);

// Parses every line. Throws dllm::usage_error "LABEL line N: ..." naming the key at fault: not JSON, not an
// object, an unknown key, a value of the wrong type or out of range, both or neither of prompt and
// prompt_tokens, and the settings' rules that need no model (engine::check_sampling).
std::vector<FileRequest> parse_prompts_file(std::string_view text, const Settings& flags, const std::string& label);

// A request file's names for the engine's settings: {setting} -> "key", {max_tokens} -> "\"max_tokens\"".
std::string key_name(std::string_view name);

// The usage error of a request the engine refused: "LABEL line N: " + its message in the file's names.
Error line_error(const std::string& label, int64_t line, const engine::RequestError& e);

}  // namespace dllm::cli
