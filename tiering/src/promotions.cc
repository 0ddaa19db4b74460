// PromotionQueue: blocks waiting for GPU room, oldest first (promotions.h).
#include "promotions.h"

namespace kvtier::tiering {

size_t PromotionQueue::Add(uint32_t record, const BlockKey& key, std::chrono::steady_clock::time_point since) {
  if (limit_ == 0) return 1;
  if (auto it = queued_.find(record); it != queued_.end()) {
    for (const WantedPromotion& w : wanted_) {
      if (w.record == record && w.key == key) return 0;
    }
  }
  wanted_.push_back(WantedPromotion{record, key, since});
  ++queued_[record];
  if (wanted_.size() <= limit_) return 0;
  Forget(wanted_.front().record);
  wanted_.pop_front();
  return 1;
}

}  // namespace kvtier::tiering
