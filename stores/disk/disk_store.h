// DiskStore: a BlockStore in a local directory, for capacity beyond RAM that
// survives restarts and crashes.
//
// One file per block, named by its StoreKey, written under a temporary name
// and renamed into place (a crash leaves the old value or the new one, never a
// torn file under a block's name). Reads and writes use O_DIRECT where the file
// system takes it (buffered I/O otherwise, said in Describe()). The directory
// is scanned at Open: every block file found is indexed by name and size (its
// contents are verified when it is read, like the warm restart's rules), stray
// temporary files are removed. A byte cap holds: a Put past it removes the
// least recently used files first (use = put or get).
//
// The directory:
// - is the store's alone: Open locks it (a second store on it, in this process
//   or another, gets kUnavailable), and any regular file in it whose name a
//   key could have (block_file_name.h) is taken for a block file, counted
//   against the cap and evicted like one. Other entries are left alone.
// - holds files of mode 0600; a directory Open creates has mode 0700.
// - is never fsync'ed: a block written before the process crashed is there
//   after it, but after a power loss or kernel crash recent blocks may be
//   missing, empty or damaged. Callers verify every record they get (a damaged
//   one is a miss), so none of these serves a wrong byte.
// - keeps use order across restarts in the files' mtimes (a put writes it, a
//   get sets it unless it is less than a minute old: kMtimeGranularity): Open
//   indexes the oldest mtime as the least recently used.
//
// Present() answers from the index alone (no file is touched); Get() of a
// file that has gone behind the store's back is a miss, and forgets it.
// Put() stores each item it can and returns the first failure: kResourceExhausted
// for a value larger than the cap, kInvalidArgument for a key whose file name
// would be over 255 bytes, kUnavailable for an I/O error (counted in
// io_errors; a full file system is one).
//
// OnEvicted reports the files removed to keep the cap (Put, and Get of a file
// past the size asked for), not those found gone or unreadable by Get (those
// are misses its caller sees).
// The directory going away: at most once a second (kDirRecheckInterval) a
// call compares the configured path with the directory the store has open
// (device and inode, and whether it is still linked). When it is gone or was
// replaced, the store drops its index and opens the path again as Open does
// (re-creating it, mode 0700, when its parent exists), re-indexing what is
// there. Until that succeeds the store is *down*: every call fails with
// kUnavailable naming why (counted in io_errors by its StoreChain; the rest
// of the chain serves on), and it is retried at most once a second. Writes
// that fail meanwhile (ENOENT in a deleted directory) are I/O errors. With
// DiskStoreOptions::wait_for_dir, a directory that cannot be used at Open is
// the same: the store starts down and comes up when it can.
//
// Counters: held_bytes and files (gauges: the block files indexed),
// evicted_files and evicted_bytes (removed to keep the cap), io_errors,
// down (a gauge: 1 while the directory cannot be used), reopens (times the
// directory was opened again after being gone, replaced or unusable).
// Thread-safety: as BlockStore's (calls from one thread at a time; Counters()
// and Describe() from any).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "kvtier/stores/block_store.h"

namespace kvtier::stores {

struct DiskStoreOptions {
  std::string dir;          // Created if missing (one level).
  uint64_t max_bytes = 0;   // Of block files; REQUIRES: > 0.
  bool direct_io = true;    // O_DIRECT when the file system takes it.
  // A directory that cannot be created, opened or listed at Open is not an
  // error: the store starts down and retries it (kvtierd's choice, as for a
  // Redis server that is down). Another store holding it stays an error.
  bool wait_for_dir = false;
};

// How often a store checks that its directory is still the one it opened, or
// retries it while down.
inline constexpr std::chrono::seconds kDirRecheckInterval{1};

// Why the disk store `store` (OpenDiskStore's) cannot use its directory now;
// empty while it can. Thread-safe.
std::string DiskStoreDownReason(const BlockStore& store);

// Opens the store in options.dir (kInvalidArgument for bad options,
// kUnavailable when the directory cannot be created or read (unless
// wait_for_dir), or another store holds it). What is found beyond max_bytes is evicted, oldest first.
// Open reads no file's contents: its cost is a stat per file.
Result<std::unique_ptr<BlockStore>> OpenDiskStore(const DiskStoreOptions& options);

}  // namespace kvtier::stores
