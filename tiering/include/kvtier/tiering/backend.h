// Backend: the memory and copy engine under the cache, one interface for the
// CUDA implementation and the host implementation (shared memory + a copy thread).
//
// Thread-safety: CreatePool and SubmitCopies are called from one thread (the
// engine's); IsComplete, Wait and copy_stats may be called from any thread.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kvtier/backend_kind.h"
#include "kvtier/fence_layout.h"
#include "kvtier/index_layout.h"
#include "kvtier/status.h"
#include "kvtier/wire.h"

namespace kvtier::tiering {

using kvtier::BackendKind;  // kvtier/backend_kind.h: one vocabulary with the wire's.
using kvtier::BackendKindName;

struct PoolSpec {
  Tier tier = Tier::kGpu;
  size_t slot_bytes = 0;
  uint32_t slots = 0;
  std::string name;  // Unique within the backend: labels its segment, shm_names::Segment(prefix, name).
  // Host backend: the pool's segment has that name and outlives the daemon (it
  // is never unlinked), owner-only; an existing segment of that name, owned by
  // this uid and of this size, is adopted with its contents (Pool::adopted());
  // one of another size is replaced. A name another uid holds (squatted) is
  // left alone: the pool is then an ordinary sealed one and
  // Pool::persistence_lost() says why. Other backends ignore it.
  bool persistent = false;
};

// What another process needs to map a pool.
struct PoolHandle {
  BackendKind backend = BackendKind::kHost;
  Tier tier = Tier::kGpu;
  uint64_t slot_bytes = 0;
  uint32_t slots = 0;
  std::string shm_name;            // The segment's label, for messages (host backend; host tier on cuda).
  // The descriptor another process maps (host backend; host tier on cuda), owned
  // by the pool: passed over the socket, never closed by the receiver of the
  // handle. -1 for device memory.
  int fd = -1;
  bool clients_write = false;      // Clients map it writable (the host backend's GPU tier).
  std::vector<uint8_t> ipc_handle; // Device-memory export (cuda); empty on host.
};

// A fixed array of equally sized block slots in one tier.
class Pool {
 public:
  virtual ~Pool() = default;
  Tier tier() const { return tier_; }
  size_t slot_bytes() const { return slot_bytes_; }
  uint32_t slots() const { return slots_; }
  // Address of slot `i` in this process (a device address for a GPU pool on cuda).
  // REQUIRES: i < slots().
  std::byte* slot_data(uint32_t i) const { return base_ + size_t{i} * slot_bytes_; }
  std::byte* base() const { return base_; }
  // True when the memory was adopted from an earlier run (PoolSpec::persistent)
  // rather than created empty.
  bool adopted() const { return adopted_; }
  // Non-empty when PoolSpec::persistent was asked for and could not be had
  // (the name is held by another uid): why. The pool works, but is not kept.
  const std::string& persistence_lost() const { return persistence_lost_; }
  virtual PoolHandle Export() const = 0;

 protected:
  Pool(Tier tier, size_t slot_bytes, uint32_t slots, std::byte* base, bool adopted = false)
      : tier_(tier), slot_bytes_(slot_bytes), slots_(slots), base_(base), adopted_(adopted) {}
  // The handle's fields every backend fills alike; Export adds how to open the memory.
  PoolHandle BaseHandle(BackendKind backend) const {
    PoolHandle h;
    h.backend = backend;
    h.tier = tier_;
    h.slot_bytes = slot_bytes_;
    h.slots = slots_;
    return h;
  }
  std::string persistence_lost_;

 private:
  Tier tier_;
  size_t slot_bytes_;
  uint32_t slots_;
  std::byte* base_;
  bool adopted_;
};

struct CopyOp {
  uint32_t src_slot;
  uint32_t dst_slot;
};

// What the copy engine did in one direction since the backend was created.
struct CopyStats {
  uint64_t batches = 0;
  uint64_t blocks = 0;
  uint64_t bytes = 0;
  double busy_seconds = 0;  // Time spent copying, queueing excluded: bytes / busy_seconds is the bandwidth.
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual BackendKind kind() const = 0;
  virtual std::string Describe() const = 0;

  virtual Result<std::unique_ptr<Pool>> CreatePool(const PoolSpec& spec) = 0;

  // Queues one batch: op i copies src.slot_bytes() bytes from src slot to dst slot.
  // Returns at once with the fence that completes when every op has landed.
  // REQUIRES: src and dst have equal slot_bytes; `dir` matches their tiers;
  // no op's destination is read or written by anyone until the fence completes.
  virtual Result<Fence> SubmitCopies(CopyDirection dir, const Pool& src, const Pool& dst,
                                     std::span<const CopyOp> ops) = 0;

  virtual bool IsComplete(const Fence& fence) const = 0;
  // kTimeout if the fence is still pending after `timeout`.
  virtual Status Wait(const Fence& fence, std::chrono::milliseconds timeout) const = 0;

  // `notify` runs on the backend's thread after fences complete; it must only
  // hand off (post to an event loop, write an eventfd). Set before submitting.
  virtual void SetCompletionNotifier(std::function<void()> notify) = 0;

  // The shared segment clients poll fences in: its label ("" if none) and the
  // descriptor to pass them (read-only, sealed; -1 if none). The backend itself
  // never reads completion back from it: a client could not change what it
  // believes, even if it could write the segment.
  virtual std::string FenceSegmentName() const = 0;
  virtual int FenceSegmentFd() const = 0;

  // kInternal once the backend can no longer copy (a CUDA context with a
  // sticky error: every later call fails the same way, and fences queued
  // never complete). The daemon then exits non-zero for its supervisor to
  // restart it. Cheap: called every tick.
  virtual Status Health() { return Status::Ok(); }

  // Counts completed copies only. May be called from any thread.
  virtual CopyStats copy_stats(CopyDirection dir) const = 0;

  // GPU-side fences for clients (Welcome.fence_events): interprocess events on
  // the promotion stream; promotion fence `seq` recorded events[seq % size()]
  // before SubmitCopies returned it. Empty when the backend has none (host).
  virtual std::vector<wire::IpcEventHandle> PromotionFenceEvents() const { return {}; }

  // --- A client's GPU work, watched from the daemon side ----------------------
  // A worker tells kvtierd when its GPU work on some blocks is done by sending
  // an interprocess event it recorded on its stream after that work (a writer
  // event at commit, a reader or writer event at release). kvtierd never makes
  // a stream of its own wait on such an event (a slow or dead client would stall
  // every demotion behind it); it polls the event instead, and holds back what
  // depends on the work (reusing the slots, demoting or serving the blocks) until
  // the event reports done.
  //
  // Starts watching `event`, an interprocess event of client `client` (an id
  // unique for the daemon's life). Returns a watch id (never 0) for QueryWatch
  // and EndWatch. Opened events are kept per (client, handle): handle bytes
  // alone can repeat across clients (a reconnect, a reused pid, another pid
  // namespace). An event reports the state of its latest record, so a client
  // must not record it again before its earlier work is done (libkvtier
  // recycles only events that completed). Engine thread only.
  // Default (host backend: workers write with the CPU before they commit):
  // kFailedPrecondition.
  virtual Result<uint64_t> WatchClientEvent(uint64_t /*client*/, const wire::IpcEventHandle& /*event*/) {
    return FailedPrecondition(std::string("backend ") + BackendKindName(kind()) +
                              " has no GPU work to wait for: a request must not carry a GPU event");
  }
  // The state of a watched event now. Never blocks. kFailed when the event
  // cannot be queried any more (its client's context is gone): no work of
  // that client runs on the GPU then.
  enum class WorkState : uint8_t { kPending, kDone, kFailed };
  virtual WorkState QueryWatch(uint64_t /*watch*/) { return WorkState::kDone; }
  // Stops watching; the event is closed with its client's last watch once the
  // client is forgotten. Engine thread only.
  virtual void EndWatch(uint64_t /*watch*/) {}
  // Client `client` is gone: its events are closed once no watch uses them.
  // Engine thread only.
  virtual void ForgetClient(uint64_t /*client*/) {}
};

}  // namespace kvtier::tiering
