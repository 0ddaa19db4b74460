// FetchTurns: whose turn is next among the fetches under way (store_chain.h,
// "Reads"). The I/O thread gives one fetch one chunk per turn, round-robin
// over the key namespaces asking (tenants), then over each namespace's
// fetches: a namespace with fetches left goes to the back after its turn, and
// a fetch given another turn goes to the back of its namespace's lane. So a
// short fetch waits about one chunk per other tenant fetching, never for
// another tenant's whole fetch, however many fetches that tenant queued.
//
// Not thread-safe: StoreChain holds its mutex around every call.
#pragma once

#include <cstdint>
#include <deque>

#include "kvtier/block_key.h"

namespace kvtier::stores {

class FetchTurns {
 public:
  struct Turn {
    Namespace ns;
    uint64_t id = 0;
  };

  // Queues fetch `id` of namespace `ns` for a turn: at the back of its
  // namespace's lane; a namespace not waiting yet joins at the back.
  void Add(const Namespace& ns, uint64_t id) {
    for (Lane& l : lanes_) {
      if (l.ns == ns) {
        l.ids.push_back(id);
        return;
      }
    }
    lanes_.push_back(Lane{ns, {id}});
  }

  bool empty() const { return lanes_.empty(); }

  // The fetch whose turn it is, no longer queued: Add it again for another
  // turn. REQUIRES: !empty().
  Turn Take() {
    Lane lane = std::move(lanes_.front());
    lanes_.pop_front();
    Turn t{lane.ns, lane.ids.front()};
    lane.ids.pop_front();
    if (!lane.ids.empty()) lanes_.push_back(std::move(lane));
    return t;
  }

 private:
  struct Lane {
    Namespace ns;
    std::deque<uint64_t> ids;
  };
  std::deque<Lane> lanes_;
};

}  // namespace kvtier::stores
