// dllm inspect: placeholder until its issue lands.
#include "cli/commands.h"
#include "model/error.h"

namespace dllm::cli {
int cmd_inspect(const Settings&) { throw Error("'inspect' is not implemented yet"); }
}  // namespace dllm::cli
