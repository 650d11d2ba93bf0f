#include "common/printable.h"

#include <cstdint>
#include <cstdio>

namespace dllm {

bool is_valid_utf8(std::string_view text) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    const unsigned char b = s[i];
    if (b < 0x80) {
      ++i;
      continue;
    }
    size_t len;
    uint32_t c;
    if (b >= 0xC2 && b <= 0xDF) {
      len = 2;
      c = b & 0x1F;
    } else if (b >= 0xE0 && b <= 0xEF) {
      len = 3;
      c = b & 0x0F;
    } else if (b >= 0xF0 && b <= 0xF4) {
      len = 4;
      c = b & 0x07;
    } else {
      return false;
    }
    if (n - i < len) return false;
    for (size_t k = 1; k < len; ++k) {
      if ((s[i + k] & 0xC0) != 0x80) return false;
      c = (c << 6) | (s[i + k] & 0x3F);
    }
    if ((len == 3 && c < 0x800) || (len == 4 && (c < 0x10000 || c > 0x10FFFF))) return false;
    if (c >= 0xD800 && c <= 0xDFFF) return false;
    i += len;
  }
  return true;
}

namespace {

// Length of the valid UTF-8 sequence at s[i] (no overlong forms, surrogates or values past U+10FFFF), or 0; the
// code point goes to *cp.
size_t utf8_len(std::string_view s, size_t i, uint32_t* cp) {
  auto c = static_cast<unsigned char>(s[i]);
  size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
  if (n == 0 || i + n > s.size()) return 0;
  uint32_t v = n == 1 ? c : n == 2 ? (c & 0x1Fu) : n == 3 ? (c & 0x0Fu) : (c & 0x07u);
  for (size_t k = 1; k < n; ++k) {
    auto b = static_cast<unsigned char>(s[i + k]);
    if ((b & 0xC0) != 0x80) return 0;
    v = (v << 6) | (b & 0x3Fu);
  }
  static const uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
  if (v < kMin[n] || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return 0;
  *cp = v;
  return n;
}

// Code points a terminal or a layout engine acts on rather than shows.
bool acts_on_display(uint32_t cp) {
  return (cp >= 0x80 && cp <= 0x9F) ||                       // C1 controls (U+009B is CSI)
         cp == 0x061C || cp == 0x200E || cp == 0x200F ||      // bidi marks
         (cp >= 0x2028 && cp <= 0x202E) ||                    // line/paragraph separators, bidi embeddings/overrides
         (cp >= 0x2066 && cp <= 0x2069) || cp == 0xFEFF;      // bidi isolates, BOM
}

}  // namespace

std::string sanitize_utf8(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  uint32_t cp = 0;
  for (size_t i = 0; i < text.size();) {
    const size_t n = utf8_len(text, i, &cp);
    if (n == 0) {
      out += "\xEF\xBF\xBD";  // U+FFFD
      ++i;
    } else {
      out.append(text.substr(i, n));
      i += n;
    }
  }
  return out;
}

size_t utf8_complete_prefix(std::string_view text) {
  const size_t n = text.size();
  // The last lead byte among the final three bytes (a complete 4-byte sequence needs no look further back).
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const auto b = static_cast<unsigned char>(text[n - back]);
    if ((b & 0xC0) == 0x80) continue;  // a continuation byte: keep looking for its lead
    const size_t want = (b >> 5) == 0x6 ? 2 : (b >> 4) == 0xE ? 3 : (b >> 3) == 0x1E ? 4 : 1;
    return want > back ? n - back : n;
  }
  return n;
}

std::string escape_text(std::string_view s, size_t max) {
  std::string r;
  size_t i = 0;
  char buf[16];
  while (i < s.size() && i < max) {
    const char c = s[i];
    uint32_t cp = 0;
    const size_t n = utf8_len(s, i, &cp);
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
    const size_t n = utf8_len(s, i, &cp);
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
