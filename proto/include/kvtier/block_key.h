// Block keys: 128-bit XXH3 chained over (parent key, namespace, token IDs).
//
// key(block i) = XXH3_128(key(block i-1) || namespace || tokens of block i),
// with the null key as the parent of block 0. One key therefore names a whole
// prefix, in one namespace. Only full blocks are keyed. Token IDs are hashed as
// little-endian uint32. Keys are a lookup accelerator, never proof: the cache
// stores each block's tokens and compares them, so a collision is a miss.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace kvtier {

using TokenId = uint32_t;

struct BlockKey {
  uint64_t lo = 0;
  uint64_t hi = 0;

  bool IsNull() const { return lo == 0 && hi == 0; }
  friend bool operator==(const BlockKey&, const BlockKey&) = default;
  std::string ToHex() const;  // 32 hex digits, hi first.
};

// Model profile fingerprint + tenant salt. Tenants never share keys.
struct Namespace {
  BlockKey id;

  static Namespace Make(uint64_t profile_fingerprint, std::string_view tenant_salt);
  friend bool operator==(const Namespace&, const Namespace&) = default;
};

// What a model is, beyond its KV geometry: a digest its worker supplies (by
// default of its weights and tokenizer; the first 128 bits). Two models of
// equal geometry (a base model and its fine-tune, one model under two
// tokenizers) never share a key unless their identities are equal. Null: no
// identity given (keys depend on the geometry and tenant alone).
struct ModelId {
  BlockKey id;

  bool IsNull() const { return id.IsNull(); }
  std::string ToHex() const;  // 32 hex digits; "" when null.
  // 32 hex digits (either case) into an identity; nullopt for anything else.
  static std::optional<ModelId> FromHex(std::string_view hex);
  friend bool operator==(const ModelId&, const ModelId&) = default;
};

// The namespace a tenant's blocks of `model` are keyed in: the tenant's own
// when the model is null, else both hashed together.
Namespace KeyNamespace(const Namespace& tenant, const ModelId& model);

// The key of one block. REQUIRES: tokens.size() is the profile's block_tokens.
BlockKey ChainKey(const BlockKey& parent, const Namespace& ns, std::span<const TokenId> tokens);

// Keys of the full blocks of `tokens` (tokens.size() / block_tokens of them), chained
// from `parent`. Writes min(out.size(), full blocks) keys; returns how many.
size_t ComputeKeys(const Namespace& ns, const BlockKey& parent, std::span<const TokenId> tokens,
                   uint32_t block_tokens, std::span<BlockKey> out);

struct BlockKeyHash {
  size_t operator()(const BlockKey& k) const { return static_cast<size_t>(k.lo ^ (k.hi * 0x9e3779b97f4a7c15ULL)); }
};

}  // namespace kvtier
