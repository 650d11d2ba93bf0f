// dllm logits: placeholder until its issue lands.
#include "cli/commands.h"
#include "model/error.h"

namespace dllm::cli {
int cmd_logits(const Settings&) { throw Error("'logits' is not implemented yet"); }
}  // namespace dllm::cli
