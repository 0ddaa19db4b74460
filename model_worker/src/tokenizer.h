// A byte-level tokenizer: one token per UTF-8 byte, plus two specials. Enough for
// the demo's text; the cache only ever sees token IDs.
#pragma once

#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include "kvtier/block_key.h"

namespace kvtier::model {

inline constexpr TokenId kBos = 256;      // Start of a conversation.
inline constexpr TokenId kEndTurn = 257;  // Ends a user or assistant message.
// What the model identity (kvtier/model_identity.h) says of this tokenizer.
inline constexpr std::string_view kTokenizerDescription =
    "kvtier byte-level tokenizer v1: token = byte value 0-255, 256 = bos, 257 = end of turn";

inline std::vector<TokenId> Encode(std::string_view text) {
  std::vector<TokenId> out;
  out.reserve(text.size());
  for (unsigned char c : text) out.push_back(c);
  return out;
}

// Printable bytes as-is, everything else escaped, so any model output prints safely.
inline std::string Decode(const std::vector<TokenId>& tokens) {
  std::string out;
  for (TokenId t : tokens) {
    if (t >= 32 && t < 127) {
      out.push_back(static_cast<char>(t));
    } else if (t == kEndTurn) {
      out += "<|end|>";
    } else if (t == kBos) {
      out += "<|bos|>";
    } else {
      char buf[12];
      std::snprintf(buf, sizeof buf, "\\x%02x", t & 0xffu);
      out += t < 256 ? buf : "<" + std::to_string(t) + ">";
    }
  }
  return out;
}

}  // namespace kvtier::model
