// Placeholder until the redis store lands.
#include "redis/redis_store.h"
namespace kvtier::stores {
Result<std::unique_ptr<BlockStore>> OpenRedisStore(const RedisStoreOptions&) { return Unavailable("redis store: not built yet"); }
}  // namespace kvtier::stores
