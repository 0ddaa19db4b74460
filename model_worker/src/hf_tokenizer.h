// HfTokenizer: what the worker needs of a Hugging Face tokenizer.json.
//  - Its description for the model identity: the file as compact JSON with its
//    key order kept, the bytes the tokenizers library's to_str() gives for it,
//    which is what kvtier.hf hashes; so the worker and a Python service loading
//    one model directory compute one identity and share blocks.
//  - Decoding token ids to text, for byte-level BPE vocabularies (GPT-2, Llama 3,
//    SmolLM2): each vocabulary entry spells its bytes through GPT-2's
//    byte-to-character map.
// Encoding is not here: BPE merges and pre-tokenization belong to the tokenizers
// library, so prompts of a real model reach the worker as token ids
// (--prompt-tokens, tokenized in Python with the model's own tokenizer).
// Torch-free.
#pragma once

#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "kvtier/block_key.h"
#include "kvtier/status.h"

namespace kvtier::model {

// The identity's description of tokenizer.json at `path` (see above).
Result<std::string> HfTokenizerDescription(const std::string& path);

class HfTokenizer {
 public:
  static Result<HfTokenizer> Load(const std::string& path);
  // Text of `tokens`; ids the vocabulary lacks print as <id>. Special (added)
  // tokens print as their content.
  std::string Decode(std::span<const TokenId> tokens) const;
  bool byte_level() const { return byte_level_; }

 private:
  std::unordered_map<TokenId, std::string> pieces_;   // Decoded bytes of each vocabulary entry.
  bool byte_level_ = false;
};

}  // namespace kvtier::model
