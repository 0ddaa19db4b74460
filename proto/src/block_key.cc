#include "kvtier/block_key.h"

#include <bit>
#include <cstring>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "kvtier/model_profile.h"

namespace kvtier {

static_assert(std::endian::native == std::endian::little, "block keys hash little-endian token IDs");

std::string BlockKey::ToHex() const {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out(32, '0');
  for (int i = 0; i < 16; ++i) {
    out[15 - i] = kDigits[(hi >> (4 * i)) & 0xf];
    out[31 - i] = kDigits[(lo >> (4 * i)) & 0xf];
  }
  return out;
}

Namespace Namespace::Make(uint64_t profile_fingerprint, std::string_view tenant_salt) {
  const XXH128_hash_t h = XXH3_128bits_withSeed(tenant_salt.data(), tenant_salt.size(), profile_fingerprint);
  return Namespace{BlockKey{h.low64, h.high64}};
}

BlockKey ChainKey(const BlockKey& parent, const Namespace& ns, std::span<const TokenId> tokens) {
  // One contiguous input lets XXH3 take its short-input fast path; block_tokens is
  // bounded by kMaxBlockTokens, so the buffer fits the stack.
  alignas(64) unsigned char buf[32 + kMaxBlockTokens * sizeof(TokenId)];
  const size_t n = tokens.size() <= kMaxBlockTokens ? tokens.size() : kMaxBlockTokens;
  std::memcpy(buf, &parent.lo, 8);
  std::memcpy(buf + 8, &parent.hi, 8);
  std::memcpy(buf + 16, &ns.id.lo, 8);
  std::memcpy(buf + 24, &ns.id.hi, 8);
  std::memcpy(buf + 32, tokens.data(), n * sizeof(TokenId));
  const XXH128_hash_t h = XXH3_128bits(buf, 32 + n * sizeof(TokenId));
  BlockKey key{h.low64, h.high64};
  if (key.IsNull()) key.lo = 1;  // The null key means "no parent"; never produce it.
  return key;
}

size_t ComputeKeys(const Namespace& ns, const BlockKey& parent, std::span<const TokenId> tokens,
                   uint32_t block_tokens, std::span<BlockKey> out) {
  if (block_tokens == 0) return 0;
  size_t blocks = tokens.size() / block_tokens;
  if (blocks > out.size()) blocks = out.size();
  BlockKey prev = parent;
  for (size_t i = 0; i < blocks; ++i) {
    prev = ChainKey(prev, ns, tokens.subspan(i * block_tokens, block_tokens));
    out[i] = prev;
  }
  return blocks;
}

}  // namespace kvtier
