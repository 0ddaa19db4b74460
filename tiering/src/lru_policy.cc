// LRU eviction: one intrusive list per priority, coldest at the head.
#include <algorithm>

#include "kvtier/tiering/policy.h"
#include "session.h"

namespace kvtier::tiering {
namespace {

class LruPolicy final : public EvictionPolicy {
 public:
  void Track(Session* s) override {
    if (s->lru_list >= 0) Unlink(s);
    PushBack(s, std::clamp(s->priority, kMinPriority, kMaxPriority));
  }

  void Touch(Session* s) override {
    const int list = s->lru_list >= 0 ? s->lru_list : std::clamp(s->priority, kMinPriority, kMaxPriority);
    if (s->lru_list >= 0) Unlink(s);
    PushBack(s, list);
  }

  void Untrack(Session* s) override {
    if (s->lru_list >= 0) Unlink(s);
  }

  void VisitColdest(const std::function<bool(Session*)>& visit) const override {
    for (int p = kMinPriority; p <= kMaxPriority; ++p) {
      for (Session* s = lists_[p].head; s != nullptr;) {
        Session* next = s->lru_next;
        if (!visit(s)) return;
        s = next;
      }
    }
  }

 private:
  struct List {
    Session* head = nullptr;
    Session* tail = nullptr;
  };

  void PushBack(Session* s, int list) {
    List& l = lists_[list];
    s->lru_list = list;
    s->lru_prev = l.tail;
    s->lru_next = nullptr;
    if (l.tail != nullptr) l.tail->lru_next = s; else l.head = s;
    l.tail = s;
  }

  void Unlink(Session* s) {
    List& l = lists_[s->lru_list];
    if (s->lru_prev != nullptr) s->lru_prev->lru_next = s->lru_next; else l.head = s->lru_next;
    if (s->lru_next != nullptr) s->lru_next->lru_prev = s->lru_prev; else l.tail = s->lru_prev;
    s->lru_prev = s->lru_next = nullptr;
    s->lru_list = -1;
  }

  List lists_[kMaxPriority + 1];
};

}  // namespace

std::unique_ptr<EvictionPolicy> MakeLruPolicy() { return std::make_unique<LruPolicy>(); }

}  // namespace kvtier::tiering
