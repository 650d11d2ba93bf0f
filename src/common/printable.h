// Untrusted text (GGUF metadata, token texts, hub file names, URLs) on its way to a terminal: one helper, used by
// error messages, hub messages and `inspect`, so no file or server can move the cursor, retitle the window,
// reorder what follows (bidi overrides) or flood the screen.
#pragma once
#include <cstddef>
#include <string>
#include <string_view>

#include "common/utf8.h"  // is_valid_utf8, sanitize_utf8, utf8_complete_prefix: printing's UTF-8 helpers

namespace dllm {

// The text with \" \\ \n \t \r escaped, other C0 control bytes, DEL and bytes of invalid UTF-8 as \xNN, and the
// characters a terminal or a text layout acts on (C1 controls U+0080..U+009F, bidi marks and overrides, line and
// paragraph separators) as \uNNNN; cut after about `max` input bytes, at a character boundary, with "...".
std::string escape_text(std::string_view s, size_t max);

// Text shown as it is (a model's answer) on a terminal, which must not act on it: C0 control bytes other than
// newline and tab (ESC, CR, BEL, backspace, ...), DEL and bytes of invalid UTF-8 (an 8-bit terminal reads
// 0x80..0x9F as C1 controls) as \xNN, C1 controls (U+0080..U+009F; U+009B is CSI) as \u00NN; everything else
// (quotes, backslashes, bidi marks of right-to-left scripts) unchanged, and nothing cut.
std::string escape_terminal_controls(std::string_view s);

// For messages: escape_text cut at 200 bytes, saying how long the whole was ("... (102400 bytes)").
std::string shown(std::string_view s, size_t max = 200);

}  // namespace dllm
