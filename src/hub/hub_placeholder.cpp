// Keeps the hub library non-empty before its first source lands.
namespace dllm::hub { int hub_placeholder_symbol = 0; }
