// dllm tokenize: placeholder until its issue lands.
#include "cli/commands.h"
#include "model/error.h"

namespace dllm::cli {
int cmd_tokenize(const Settings&) { throw Error("'tokenize' is not implemented yet"); }
}  // namespace dllm::cli
