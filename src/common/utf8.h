// UTF-8 in one place: the validity checks, the lenient decoder llama.cpp's tokenizers use, the encoder, and the
// character classes the chat templates need. Shared by the tokenizers (model/tokenizer.cpp, pretokenizer.cpp),
// the chat templates (model/chat.cpp) and printing (common/printable.cpp, the server's JSON).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace dllm {

// The text with ASCII letters lower-cased and every other byte as it is (HTTP header values, host names, quant
// names: case-insensitive ASCII, whatever the C locale).
std::string ascii_lower(std::string_view text);

// True when text is well-formed UTF-8 (no overlongs, surrogates or code points past U+10FFFF).
bool is_valid_utf8(std::string_view text);

// Length in bytes of the well-formed UTF-8 sequence starting at text[i] (1..4); 0 when the bytes there are not one
// (a stray continuation byte, a truncated sequence, an overlong form, a surrogate, a value past U+10FFFF). When
// cp is given and the length is not 0, *cp receives the code point.
size_t utf8_len_at(std::string_view text, size_t i, uint32_t* cp = nullptr);

// The text as well-formed UTF-8: each byte that does not belong to a well-formed sequence becomes U+FFFD (as
// Python's errors="replace" does byte by byte), for text that leaves as JSON (the server's answers).
std::string sanitize_utf8(std::string_view text);

// The length of text without a multi-byte sequence cut short at its end (a lead byte and fewer continuation
// bytes than it announces): the part of a growing text that can be shown now without splitting a character.
size_t utf8_complete_prefix(std::string_view text);

// llama.cpp's lenient UTF-8 decoder (unicode_cpt_from_utf8): overlong forms and surrogates decode,
// every byte that starts no decodable sequence becomes U+FFFD and is skipped alone.
// Code points above U+10FFFF (lead bytes F5-F7), which llama.cpp cannot re-encode, become U+FFFD too.
std::vector<uint32_t> decode_utf8_lenient(std::string_view text);

// Appends the UTF-8 form of one code point (surrogates encode as 3 bytes, like llama.cpp).
void append_utf8(uint32_t cpt, std::string* out);

// Python's str.isspace() set (characters with bidirectional class WS, B or S, or category Zs): what Jinja's
// `trim` (Python's str.strip()) removes.
bool python_isspace(uint32_t cpt);

}  // namespace dllm
