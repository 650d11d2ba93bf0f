// placeholder so the jit library has a source; replaced by CPU detection.
namespace dllm::jit { int placeholder_symbol = 0; }
