// The names of the disk store's files: which file holds a key's value, and
// which names in the store's directory are block files at all.
//
// A key of [A-Za-z0-9:_.-] characters that does not start with '.' (every
// StoreKey) is its own file name. Any other key (empty, with '/', a leading
// '.', bytes beyond ASCII) is '%' followed by the lower-case hex of its bytes.
// So a name never holds '/', never starts with '.', and no two keys share one.
// Names that start with '.' are the store's own (temporary files, the lock).
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace kvtier::stores::disk {

// NAME_MAX on Linux file systems: the longest name a directory entry takes.
inline constexpr size_t kMaxFileNameBytes = 255;

// What a file being written is named until it is renamed into place; a file
// found under such a name at Open is debris of a crash.
inline constexpr std::string_view kTempFilePrefix = ".tmp.";

// The file name of `key`; nullopt when it would be longer than
// kMaxFileNameBytes (such a key cannot be stored).
std::optional<std::string> BlockFileName(std::string_view key);

// The key whose file name `name` is; nullopt for a name BlockFileName never
// returns (not a block file).
std::optional<std::string> KeyOfBlockFileName(std::string_view name);

inline bool IsTempFileName(std::string_view name) { return name.starts_with(kTempFilePrefix); }

}  // namespace kvtier::stores::disk
