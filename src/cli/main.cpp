// dllm entry point: parse the command line, dispatch, map errors to exit codes.
#include "cli/args.h"
#include "git_describe.h"  // generated at build time (cmake/git_describe.cmake): DLLM_GIT_DESCRIBE

int main(int argc, char** argv) { return dllm::cli::main_entry(argc, argv, DLLM_GIT_DESCRIBE); }
