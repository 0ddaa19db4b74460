// The hash slot of a key in Redis Cluster: CRC16 (XMODEM) of the key, or of
// its hash tag, modulo 16384 (the Redis Cluster specification, "Keys
// distribution model").
#pragma once

#include <cstdint>
#include <string_view>

namespace kvtier::stores::redis {

inline constexpr uint16_t kClusterSlots = 16384;

// CRC16-CCITT as Redis Cluster uses it (XMODEM: polynomial 0x1021, initial
// value 0, no reflection, no final xor). Crc16("123456789") == 0x31C3.
uint16_t Crc16(std::string_view bytes);

// The slot of `key`. A hash tag is the text between the first '{' and the
// first '}' after it, when that text is not empty: then only the tag is
// hashed, so "{user1}.a" and "{user1}.b" share a slot.
uint16_t KeySlot(std::string_view key);

}  // namespace kvtier::stores::redis
