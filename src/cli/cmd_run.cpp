// dllm run: placeholder until its issue lands.
#include "cli/commands.h"
#include "model/error.h"

namespace dllm::cli {
int cmd_run(const Settings&) { throw Error("'run' is not implemented yet"); }
}  // namespace dllm::cli
