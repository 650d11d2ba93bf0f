// Command-line contract: the commands, their flags (declared with cxxopts), help, and every usage error.
#pragma once
#include <string>
#include <string_view>
#include <vector>

#include "cli/settings.h"

namespace dllm::cli {

// Parses argv (without the program name) into Settings. Throws dllm::Error with kind kUsage (exit 2)
// for every usage problem, before any file is opened. Sets *help_text (and returns) when help was asked.
Settings parse_command_line(const std::vector<std::string>& args, std::string* help_text);

// The command list, one line each, and the supported architectures (dllm, dllm help, dllm --help); each
// command's flags are its own usage (command_usage).
std::string global_usage();
// `dllm --version` / `dllm version`: "dllm X.Y.Z" (CMake's project VERSION), with " (git DESCRIBE)" when the
// build knew the checkout's git describe; one line.
std::string version_text(std::string_view git_describe);
// Usage of one command; "" for an unknown command.
std::string command_usage(const std::string& command);

// A number as messages show it ("%g": 0.5, -1, 1e+20).
std::string format_number(double x);

// Levenshtein distance, for "did you mean" suggestions (flags, tensor names).
size_t edit_distance(std::string_view a, std::string_view b);

// A --prompt-file / --prompts-file (flag names it in messages): the file, or standard input for "-", read whole
// (at most 64 MiB). Throws dllm::Error "cannot read FLAG PATH: reason".
std::string read_prompt_file(const std::string& path, const std::string& flag);

// Parses, runs the command, prints "ERROR: ..." lines for errors; returns the exit status. git_describe: the
// checkout's `git describe` for --version, "" when unknown (main.cpp has it from a generated header).
int main_entry(int argc, char** argv, std::string_view git_describe = "");

}  // namespace dllm::cli
