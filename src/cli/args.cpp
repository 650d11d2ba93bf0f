// placeholder, replaced by the CLI contract
#include "cli/args.h"
#include "cli/commands.h"
#include "model/error.h"
#include <cstdio>
namespace dllm::cli {
Settings parse_command_line(const std::vector<std::string>& args, std::string*) {
  Settings s; if (!args.empty()) s.command = args[0];
  if (args.size() > 1) s.path = args[1];
  return s;
}
std::string global_usage() { return "usage\n"; }
std::string command_usage(const std::string&) { return ""; }
int main_entry(int argc, char** argv) {
  std::vector<std::string> a(argv + 1, argv + argc);
  try {
    std::string help;
    Settings s = parse_command_line(a, &help);
    if (s.command == "inspect") return cmd_inspect(s);
    return 2;
  } catch (const Error& e) { std::fprintf(stderr, "ERROR: %s\n", e.what()); return e.exit_code(); }
}
}  // namespace dllm::cli
