// BlockStore: one store below the host tier (a disk directory, a Redis
// deployment), behind the smallest interface that serves it: a batched check of
// which blocks it holds, a batched get, a batched put.
//
// A store keeps opaque values under string keys (StoreKey): the records
// block_record.h encodes. It never interprets them and never touches GPU or
// pool memory; what it returns is verified by the caller (VerifyBlockRecord)
// before anything uses it, so a store may lose, truncate or mix up values
// without a wrong byte being served.
//
// Thread-safety: a store is driven by one thread at a time (its StoreChain's
// I/O thread), so its calls may block, each bounded by the store's own
// timeouts: none may wait longer than the timeout its configuration names.
// Counters() may be called from any thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kvtier/block_key.h"
#include "kvtier/status.h"

namespace kvtier::stores {

// The name a store keeps block `key` of profile `profile_fingerprint` under:
// "<prefix><16 hex digits of the fingerprint>:<32 hex digits of the key>".
// The key is chained in its tenant's and model's namespace, so blocks of other
// tenants, models and profiles never share a name.
std::string StoreKey(std::string_view prefix, uint64_t profile_fingerprint, const BlockKey& key);
// The block key in `name`, a StoreKey of `prefix`; nullopt for a name not of its shape.
std::optional<BlockKey> BlockKeyOfStoreKey(std::string_view prefix, std::string_view name);

struct StoreItem {
  std::string key;
  std::string value;
};

// Bytes a store returns: one heap buffer it hands over, freed with free(), so
// that a buffer a library allocated (a hiredis reply's, an aligned O_DIRECT
// read's) is passed on without a copy.
class StoreValue {
 public:
  StoreValue() = default;
  // Takes `data` (from malloc, posix_memalign or aligned_alloc; null only
  // with size 0) to free it.
  static StoreValue Adopt(char* data, size_t size) {
    StoreValue v;
    v.data_.reset(data);
    v.size_ = size;
    return v;
  }
  static StoreValue Copy(std::string_view bytes);

  std::string_view view() const { return {data_.get(), size_}; }
  operator std::string_view() const { return view(); }  // NOLINT(google-explicit-constructor): bytes, like std::string.
  friend bool operator==(const StoreValue& a, std::string_view b) { return a.view() == b; }
  // Keeps the first `n` bytes. REQUIRES: n <= size().
  void Shrink(size_t n) { size_ = n; }
  const char* data() const { return data_.get(); }
  size_t size() const { return size_; }

 private:
  struct Free {
    void operator()(char* p) const;
  };
  std::unique_ptr<char, Free> data_;
  size_t size_ = 0;
};

// One counter a store keeps beyond what its StoreChain measures
// ("reconnects", "moved_redirects", "evicted_bytes", "held_bytes").
struct StoreCounter {
  std::string name;
  uint64_t value = 0;
  bool gauge = false;  // A level (held_bytes), not a running total.
};

class BlockStore {
 public:
  static constexpr uint64_t kAnyValueSize = UINT64_MAX;

  virtual ~BlockStore() = default;

  // "disk" or "redis": the kind of store it is, in metrics, logs and cachectl.
  virtual std::string_view kind() const = 0;
  // One line for the start-up log: "redis cluster 127.0.0.1:7000 (3 masters)".
  virtual std::string Describe() const = 0;

  // How many of `keys`, from the first on, the store holds: it stops counting
  // at the first key it lacks. One batched check (a pipeline, an index
  // lookup), not a round trip per key. kUnavailable when the store cannot be
  // reached, kTimeout when it did not answer in time.
  virtual Result<size_t> Present(std::span<const std::string> keys) = 0;

  // The values of `keys`, in order: nullopt for a key the store does not hold
  // (it may have gone since Present). Errors as Present's; a store that can
  // answer some keys and not others (one cluster node down) answers those it
  // can and leaves the others nullopt. A value longer than `max_value_bytes`
  // is nullopt too, found so without reading it whole (a fetch knows the size
  // of the records it wants; a larger value under their key is no record).
  virtual Result<std::vector<std::optional<StoreValue>>> Get(std::span<const std::string> keys,
                                                            uint64_t max_value_bytes = kAnyValueSize) = 0;

  // Stores `items`, replacing the values of keys it holds. Errors as
  // Present's; a store past its byte cap makes room (its least recently used
  // values go) rather than fail.
  virtual Status Put(std::span<const StoreItem> items) = 0;

  // What the store counts itself. Thread-safe.
  virtual std::vector<StoreCounter> Counters() const { return {}; }

  // From now on `evicted` is called with the key of every value the store
  // removes on its own to keep its cap (its least recently used), from within
  // the call that removed it (so on the thread driving the store). A store
  // that does not see its own removals (Redis' expiry and maxmemory happen in
  // the server) ignores it. Call before the store's first call from its
  // driving thread.
  virtual void OnEvicted(std::function<void(std::string_view key)> evicted) { (void)evicted; }
};

}  // namespace kvtier::stores
