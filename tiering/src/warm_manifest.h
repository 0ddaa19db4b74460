// WarmManifest: what a warm restart needs to re-adopt the host tier of one
// engine, and its byte format in a persistent shared-memory segment.
//
// The manifest lists the blocks that sit in the host pool (key, parent key,
// namespace, tokens, host slot, XXH3-64 of the payload) and the sessions that
// hold them (tenant, id, priority, chain as indices into the block list), sessions
// coldest first. Blocks come in chain order: a block's parent, if listed, comes
// before it. The pool itself is a separate segment that outlives the daemon.
//
// Format (little-endian, no pointers): a 128-byte WarmHeader, then the block
// entries (WarmBlockEntry + block_tokens token ids each), then the sessions
// (WarmSessionEntry, its flags from format 4 on, + id bytes + tenant bytes,
// padded to 8 bytes, + chain indices, padded to 8 bytes). The
// header carries an XXH3-64 of everything after it and of its own first bytes.
//
// A segment is written whole under a temporary name and renamed over the old
// one (tmpfs rename is atomic), so a reader sees the old or the new manifest,
// never a torn one, even if the writer dies mid-write.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kvtier/block_key.h"
#include "kvtier/status.h"

namespace kvtier::tiering {

inline constexpr uint64_t kWarmMagic = 0x314d5241574b544bULL;  // "KTKWARM1"
// Format 2 stores each session's tenant apart from its id; format 1 (read
// still) wrote "<tenant>/<id>" as the id.
// 3: each block's model identity. 4: each session's flags (ended).
inline constexpr uint32_t kWarmFormatVersion = 4;
inline constexpr uint32_t kWarmOldestFormatVersion = 1;

// What must be equal between the run that wrote a manifest and the run that adopts it.
struct WarmGeometry {
  uint64_t profile_fingerprint = 0;
  uint64_t block_bytes = 0;
  uint32_t block_tokens = 0;
  uint32_t host_slots = 0;
  friend bool operator==(const WarmGeometry&, const WarmGeometry&) = default;
};

struct WarmBlock {
  BlockKey key;
  BlockKey parent;        // Null for block 0 of a chain.
  Namespace ns;           // Its tenant's: with `model`, recomputes the key.
  ModelId model;          // Null in formats 1 and 2.
  uint64_t checksum = 0;  // XXH3-64 of the slot's bytes when the manifest was written.
  uint32_t host_slot = 0;
  std::vector<TokenId> tokens;  // block_tokens of them.
};

struct WarmSession {
  std::string tenant;  // Its tenant's name; the tenant's namespace is its blocks'.
  std::string id;
  int32_t priority = 0;
  std::vector<uint32_t> chain;  // Indices into WarmManifest::blocks, block 0 first.
  bool ended = false;  // Its client ended it (Engine::EndSession); false before format 4.
};

struct WarmManifest {
  WarmGeometry geometry;
  bool clean = false;  // Written at a clean shutdown (else a periodic snapshot).
  uint64_t written_unix_ms = 0;
  std::vector<WarmBlock> blocks;
  std::vector<WarmSession> sessions;  // Coldest first.
};

// XXH3-64 of a block's payload.
uint64_t PayloadChecksum(const std::byte* data, size_t bytes);

// `format`: kWarmFormatVersion, or 2 or 3 (no model identities, no session
// flags: what an older build wrote, for tests of the decoder).
std::vector<std::byte> EncodeWarmManifest(const WarmManifest& manifest, uint32_t format = kWarmFormatVersion);

// Decodes and checks structure: kCorrupt for a bad magic, a truncated or
// oversized segment, a checksum mismatch, an out-of-range slot or chain index, a
// slot listed twice; kFailedPrecondition when the format version or the geometry
// differs from `expected` (a manifest of another build or configuration). Whether
// each block's key and payload are intact is the adopter's check.
Result<WarmManifest> DecodeWarmManifest(std::span<const std::byte> bytes, const WarmGeometry& expected);

// Writes `bytes` as the shared-memory segment `name` ("/x.y"), atomically
// replacing an older one. The segment is kept when this process exits.
Status WriteWarmSegment(const std::string& name, std::span<const std::byte> bytes);
// kNotFound when there is no such segment.
Result<std::vector<std::byte>> ReadWarmSegment(const std::string& name);
// Removes the segment; true if it existed.
bool RemoveWarmSegment(const std::string& name);

}  // namespace kvtier::tiering
