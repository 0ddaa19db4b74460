// PromotionQueue: blocks waiting for GPU room, oldest first (promotions.h).
#include "promotions.h"

namespace kvtier::tiering {

size_t PromotionQueue::Add(uint32_t record, const BlockKey& key, std::chrono::steady_clock::time_point since) {
  wanted_.push_back(WantedPromotion{record, key, since});
  if (wanted_.size() <= limit_) return 0;
  wanted_.pop_front();
  return 1;
}

}  // namespace kvtier::tiering
