// FileIndex: what the disk store knows of its directory without touching it:
// each block file's size and its place in the order of use.
//
// Thread-safety: none; the store's calls are serialized by its caller.
#pragma once

#include <cstdint>
#include <list>
#include <string>
#include <unordered_map>

namespace kvtier::stores::disk {

class FileIndex {
 public:
  bool Contains(const std::string& name) const { return files_.count(name) != 0; }
  // The size of `name`; 0 when it is not indexed.
  uint64_t BytesOf(const std::string& name) const {
    auto it = files_.find(name);
    return it == files_.end() ? 0 : it->second.bytes;
  }

  // Indexes `name` at `bytes` (replacing what was indexed under it) as the
  // most recently used.
  void Put(const std::string& name, uint64_t bytes) {
    auto it = files_.find(name);
    if (it == files_.end()) {
      order_.push_back(name);
      files_.emplace(name, Entry{bytes, std::prev(order_.end())});
    } else {
      held_bytes_ -= it->second.bytes;
      it->second.bytes = bytes;
      order_.splice(order_.end(), order_, it->second.at);
    }
    held_bytes_ += bytes;
  }

  // Makes `name`, if indexed, the most recently used.
  void Touch(const std::string& name) {
    auto it = files_.find(name);
    if (it != files_.end()) order_.splice(order_.end(), order_, it->second.at);
  }

  // Drops `name`; returns the bytes it had (0 when it was not indexed).
  uint64_t Erase(const std::string& name) {
    auto it = files_.find(name);
    if (it == files_.end()) return 0;
    const uint64_t bytes = it->second.bytes;
    order_.erase(it->second.at);
    files_.erase(it);
    held_bytes_ -= bytes;
    return bytes;
  }

  // The least recently used name. REQUIRES: !empty().
  const std::string& Oldest() const { return order_.front(); }

  bool empty() const { return files_.empty(); }
  size_t files() const { return files_.size(); }
  uint64_t held_bytes() const { return held_bytes_; }

 private:
  struct Entry {
    uint64_t bytes = 0;
    std::list<std::string>::iterator at;  // Into order_.
  };
  std::list<std::string> order_;  // Least recently used first.
  std::unordered_map<std::string, Entry> files_;
  uint64_t held_bytes_ = 0;  // Sum of files_' bytes.
};

}  // namespace kvtier::stores::disk
