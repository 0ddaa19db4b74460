#include "hf_tokenizer.h"

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace kvtier::model {
namespace {

Result<nlohmann::ordered_json> ReadJson(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound("cannot open tokenizer " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  try {
    return nlohmann::ordered_json::parse(ss.str());
  } catch (const nlohmann::json::exception& e) {
    return InvalidArgument(path + ": " + e.what());
  }
}

// GPT-2's map from characters back to bytes: printable bytes stand for
// themselves, the others for U+0100 upwards in byte order.
std::unordered_map<char32_t, unsigned char> ByteLevelInverse() {
  std::unordered_map<char32_t, unsigned char> inverse;
  char32_t next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
    inverse[printable ? char32_t(b) : next++] = static_cast<unsigned char>(b);
  }
  return inverse;
}

// The code points of UTF-8 text (a malformed byte stands for itself).
std::vector<char32_t> CodePoints(const std::string& s) {
  std::vector<char32_t> out;
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    const int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
    char32_t cp = n == 1 ? c : c & (0x7f >> n);
    for (int k = 1; k < n && i + k < s.size(); ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3f);
    out.push_back(cp);
    i += n;
  }
  return out;
}

}  // namespace

Result<std::string> HfTokenizerDescription(const std::string& path) {
  auto j = ReadJson(path);
  if (!j.ok()) return j.status();
  // The tokenizers library writes a BPE or WordPiece vocabulary in id order
  // whatever order the file had it in: do the same.
  if (j->contains("model") && (*j)["model"].is_object() && (*j)["model"].contains("vocab") &&
      (*j)["model"]["vocab"].is_object()) {
    auto& vocab = (*j)["model"]["vocab"];
    std::vector<std::pair<std::string, nlohmann::ordered_json>> entries;
    for (auto& [piece, id] : vocab.items()) entries.emplace_back(piece, id);
    std::stable_sort(entries.begin(), entries.end(), [](const auto& a, const auto& b) {
      return a.second.is_number_unsigned() && b.second.is_number_unsigned() &&
             a.second.template get<uint64_t>() < b.second.template get<uint64_t>();
    });
    nlohmann::ordered_json sorted = nlohmann::ordered_json::object();
    for (auto& [piece, id] : entries) sorted[piece] = std::move(id);
    vocab = std::move(sorted);
  }
  return j->dump();
}

Result<HfTokenizer> HfTokenizer::Load(const std::string& path) {
  auto j = ReadJson(path);
  if (!j.ok()) return j.status();
  HfTokenizer t;
  const auto& decoder = (*j)["decoder"];
  t.byte_level_ = decoder.is_object() && decoder.value("type", "") == "ByteLevel";
  const auto inverse = ByteLevelInverse();
  const auto& vocab = (*j)["model"]["vocab"];
  if (vocab.is_object()) {
    for (const auto& [piece, id] : vocab.items()) {
      if (!id.is_number_unsigned()) continue;
      std::string text;
      if (t.byte_level_) {
        for (char32_t cp : CodePoints(piece)) {
          auto it = inverse.find(cp);
          text.push_back(it == inverse.end() ? '?' : static_cast<char>(it->second));
        }
      } else {
        text = piece;
      }
      t.pieces_[static_cast<TokenId>(id.get<uint64_t>())] = std::move(text);
    }
  }
  if (const auto& added = (*j)["added_tokens"]; added.is_array()) {
    for (const auto& a : added) {
      if (a.is_object() && a["id"].is_number_unsigned() && a["content"].is_string()) {
        t.pieces_[static_cast<TokenId>(a["id"].get<uint64_t>())] = a["content"].get<std::string>();
      }
    }
  }
  if (t.pieces_.empty()) return InvalidArgument(path + ": no vocabulary (model.vocab) found");
  return t;
}

std::string HfTokenizer::Decode(std::span<const TokenId> tokens) const {
  std::string out;
  for (TokenId id : tokens) {
    auto it = pieces_.find(id);
    out += it == pieces_.end() ? "<" + std::to_string(id) + ">" : it->second;
  }
  return out;
}

}  // namespace kvtier::model
