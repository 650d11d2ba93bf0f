// The commands' entry points. Each takes the parsed settings, prints results to stdout and
// diagnostics to stderr, and returns the exit status (errors are thrown as dllm::Error).
#pragma once
#include "cli/settings.h"

namespace dllm::cli {

int cmd_inspect(const Settings& s);   // cmd_inspect.cpp
int cmd_tokenize(const Settings& s);  // cmd_tokenize.cpp
int cmd_logits(const Settings& s);    // cmd_logits.cpp
int cmd_run(const Settings& s);       // cmd_run.cpp
int cmd_synth(const Settings& s);     // cmd_synth.cpp
int cmd_doctor(const Settings& s);    // cmd_doctor.cpp

}  // namespace dllm::cli
