#include "common/printable.h"

#include <cstdint>
#include <cstdio>

namespace dllm {

namespace {

// Code points a terminal or a layout engine acts on rather than shows.
bool acts_on_display(uint32_t cp) {
  return (cp >= 0x80 && cp <= 0x9F) ||                       // C1 controls (U+009B is CSI)
         cp == 0x061C || cp == 0x200E || cp == 0x200F ||      // bidi marks
         (cp >= 0x2028 && cp <= 0x202E) ||                    // line/paragraph separators, bidi embeddings/overrides
         (cp >= 0x2066 && cp <= 0x2069) || cp == 0xFEFF;      // bidi isolates, BOM
}

}  // namespace

std::string escape_text(std::string_view s, size_t max) {
  std::string r;
  size_t i = 0;
  char buf[16];
  while (i < s.size() && i < max) {
    const char c = s[i];
    uint32_t cp = 0;
    const size_t n = utf8_len_at(s, i, &cp);
    if (c == '"' || c == '\\') {
      r += '\\';
      r += c;
    } else if (c == '\n') {
      r += "\\n";
    } else if (c == '\t') {
      r += "\\t";
    } else if (c == '\r') {
      r += "\\r";
    } else if (n == 0 || static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
      std::snprintf(buf, sizeof buf, "\\x%02x", static_cast<unsigned char>(c));
      r += buf;
    } else if (acts_on_display(cp)) {
      std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(cp));
      r += buf;
    } else {
      r.append(s.substr(i, n));
    }
    i += n == 0 ? 1 : n;
  }
  if (i < s.size()) r += "...";
  return r;
}

std::string escape_terminal_controls(std::string_view s) {
  std::string r;
  r.reserve(s.size());
  char buf[16];
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    uint32_t cp = 0;
    const size_t n = utf8_len_at(s, i, &cp);
    if (n == 0 || (c < 0x20 && c != '\n' && c != '\t') || c == 0x7f) {
      std::snprintf(buf, sizeof buf, "\\x%02x", static_cast<unsigned>(c));
      r += buf;
    } else if (cp >= 0x80 && cp <= 0x9F) {
      std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(cp));
      r += buf;
    } else {
      r.append(s.substr(i, n));
    }
    i += n == 0 ? 1 : n;
  }
  return r;
}

std::string shown(std::string_view s, size_t max) {
  std::string r = escape_text(s, max);
  if (s.size() > max) r += " (" + std::to_string(s.size()) + " bytes)";
  return r;
}

}  // namespace dllm
