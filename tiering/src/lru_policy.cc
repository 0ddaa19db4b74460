// LRU eviction: one list of handles per priority, coldest at the front, and
// each tracked handle's place in them.
#include <algorithm>
#include <array>
#include <list>
#include <unordered_map>

#include "kvtier/tiering/policy.h"

namespace kvtier::tiering {
namespace {

class LruPolicy final : public EvictionPolicy {
 public:
  void Track(SessionHandle session, int priority) override {
    List& to = lists_[std::clamp(priority, kMinPriority, kMaxPriority)];
    auto it = places_.find(session);
    if (it == places_.end()) {
      to.push_back(session);
      places_.emplace(session, Place{&to, std::prev(to.end())});
      return;
    }
    Place& place = it->second;
    to.splice(to.end(), *place.list, place.at);  // Iterators stay valid across a splice.
    place.list = &to;
  }

  void Touch(SessionHandle session) override {
    auto it = places_.find(session);
    if (it == places_.end()) return;
    List& list = *it->second.list;
    list.splice(list.end(), list, it->second.at);
  }

  void Untrack(SessionHandle session) override {
    auto it = places_.find(session);
    if (it == places_.end()) return;
    it->second.list->erase(it->second.at);
    places_.erase(it);
  }

  void VisitColdest(const std::function<bool(SessionHandle)>& visit) const override {
    for (const List& list : lists_) {
      for (SessionHandle session : list) {
        if (!visit(session)) return;
      }
    }
  }

 private:
  using List = std::list<SessionHandle>;
  struct Place {
    List* list;
    List::iterator at;
  };

  std::array<List, kMaxPriority + 1> lists_;  // By priority, coldest first.
  std::unordered_map<SessionHandle, Place> places_;
};

}  // namespace

std::unique_ptr<EvictionPolicy> MakeLruPolicy() { return std::make_unique<LruPolicy>(); }

}  // namespace kvtier::tiering
