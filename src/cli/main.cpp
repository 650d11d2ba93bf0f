// dllm entry point: parse the command line, dispatch, map errors to exit codes.
#include "cli/args.h"

int main(int argc, char** argv) { return dllm::cli::main_entry(argc, argv); }
