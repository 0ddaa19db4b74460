// The names of the disk store's files (block_file_name.h).
#include "disk/block_file_name.h"

namespace kvtier::stores::disk {
namespace {

constexpr char kEncodedMark = '%';
constexpr std::string_view kHexDigits = "0123456789abcdef";

bool IsPlainChar(char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == ':' || c == '_' ||
         c == '.' || c == '-';
}

bool IsPlainName(std::string_view s) {
  if (s.empty() || s.front() == '.') return false;
  for (char c : s) {
    if (!IsPlainChar(c)) return false;
  }
  return true;
}

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;  // Upper case included: BlockFileName never writes it.
}

}  // namespace

std::optional<std::string> BlockFileName(std::string_view key) {
  if (IsPlainName(key)) {
    if (key.size() > kMaxFileNameBytes) return std::nullopt;
    return std::string(key);
  }
  if (1 + 2 * key.size() > kMaxFileNameBytes) return std::nullopt;
  std::string name;
  name.reserve(1 + 2 * key.size());
  name.push_back(kEncodedMark);
  for (char c : key) {
    const auto b = static_cast<unsigned char>(c);
    name.push_back(kHexDigits[b >> 4]);
    name.push_back(kHexDigits[b & 0xf]);
  }
  return name;
}

std::optional<std::string> KeyOfBlockFileName(std::string_view name) {
  if (name.size() > kMaxFileNameBytes) return std::nullopt;
  if (IsPlainName(name)) return std::string(name);
  if (name.empty() || name.front() != kEncodedMark || name.size() % 2 != 1) return std::nullopt;
  std::string key;
  key.reserve(name.size() / 2);
  for (size_t i = 1; i < name.size(); i += 2) {
    const int hi = HexValue(name[i]);
    const int lo = HexValue(name[i + 1]);
    if (hi < 0 || lo < 0) return std::nullopt;
    key.push_back(static_cast<char>((hi << 4) | lo));
  }
  // A plain key is never encoded: its encoding is not one of our names.
  if (IsPlainName(key)) return std::nullopt;
  return key;
}

}  // namespace kvtier::stores::disk
