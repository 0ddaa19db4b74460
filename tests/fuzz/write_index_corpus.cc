// Writes the seed corpus of the index fuzz target: index segments made by the
// daemon's own writer (tiering::BlockIndex), with chained entries in both tiers,
// a block in flight, colliding home slots and erased entries, plus copies with
// one corrupted field each. Usage: kvtier-index-corpus DIR. The seeds in
// tests/fuzz/corpus/index were made with it; rerun it after a layout change.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "block_index.h"
#include "kvtier/block_key.h"
#include "kvtier/index_layout.h"
#include "kvtier/shm_segment.h"

namespace {

using Bytes = std::vector<uint8_t>;
using kvtier::BlockKey;
using kvtier::Tier;
using kvtier::TokenId;

bool Write(const std::filesystem::path& dir, const std::string& name, const Bytes& bytes) {
  std::ofstream out(dir / name, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  return static_cast<bool>(out);
}

// The segment as a client maps it: a read-only mapping of the descriptor the
// writer passes.
Bytes Snapshot(const kvtier::tiering::BlockIndex& index) {
  auto seg = kvtier::ShmSegment::MapPassed(index.share_fd(), /*writable=*/false, sizeof(kvtier::IndexHeader), "index");
  if (!seg.ok()) return {};
  const auto* p = reinterpret_cast<const uint8_t*>(seg->data());
  return Bytes(p, p + seg->size());
}

struct Built {
  Bytes bytes;
  uint32_t first_slot = 0;  // Table position of an occupied slot.
};

// `blocks` chained blocks from the null parent; every third in the host tier,
// the second moving; `colliding` extra keys sharing block 0's home slot; the
// last chained block erased again when `erase_last`.
Built Build(uint32_t block_tokens, uint32_t max_records, uint32_t blocks, uint32_t colliding, bool erase_last) {
  static int serial = 0;
  const std::string name = "/kvtier-fuzz-corpus." + std::to_string(::getpid()) + "." + std::to_string(serial++);
  auto created = kvtier::tiering::BlockIndex::Create(name, block_tokens, max_records, 0xf00d);
  if (!created.ok()) {
    std::fprintf(stderr, "%s\n", created.status().ToString().c_str());
    return {};
  }
  kvtier::tiering::BlockIndex& index = *created;
  const auto ns = kvtier::Namespace::Make(0xf00d, "tenant");
  const uint32_t tag = kvtier::NamespaceTag(ns);
  std::vector<TokenId> tokens(size_t{blocks} * block_tokens);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<TokenId>(100 + 7 * i);
  std::vector<BlockKey> keys(blocks);
  kvtier::ComputeKeys(ns, BlockKey{}, tokens, block_tokens, keys);
  uint32_t record = 0;
  for (uint32_t i = 0; i < blocks; ++i) {
    const std::span<const TokenId> block(tokens.data() + size_t{i} * block_tokens, block_tokens);
    index.WriteRow(record, i == 0 ? BlockKey{} : keys[i - 1], block);
    index.Insert(keys[i], record++, tag, i % 3 == 2 ? Tier::kHost : Tier::kGpu);
  }
  if (blocks > 1) index.SetLocation(keys[1], Tier::kHost, /*moving=*/true);
  for (uint32_t c = 0; c < colliding && blocks > 0; ++c) {
    const BlockKey key{(keys[0].lo & 0xffffffffu) | (uint64_t{c + 1} << 32), keys[0].hi ^ (c + 1)};
    std::vector<TokenId> t(block_tokens, c);
    index.WriteRow(record, keys[0], t);
    index.Insert(key, record++, tag + c, Tier::kGpu);
  }
  if (erase_last && blocks > 0) index.Erase(keys[blocks - 1]);
  Built b;
  b.bytes = Snapshot(index);
  const uint32_t slots = kvtier::IndexGeometry::For(block_tokens, max_records).table_slots;
  b.first_slot = blocks > 0 ? kvtier::HomeSlot(keys[0], slots) : 0;
  return b;
}

template <typename T>
void Poke(Bytes& b, size_t offset, T value) {
  std::memcpy(b.data() + offset, &value, sizeof(value));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  const std::filesystem::path dir(argv[1]);
  std::filesystem::create_directories(dir);
  bool ok = true;

  const Built empty = Build(4, 8, 0, 0, false);
  const Built small = Build(4, 16, 5, 2, false);
  const Built wide = Build(16, 32, 12, 3, true);
  const Built single = Build(1, 32, 20, 0, false);
  for (const Built* b : {&empty, &small, &wide, &single}) ok &= !b->bytes.empty();
  if (!ok) return 1;
  ok &= Write(dir, "valid_empty", empty.bytes);
  ok &= Write(dir, "valid_chain_4x5", small.bytes);
  ok &= Write(dir, "valid_chain_16x12_erased", wide.bytes);
  ok &= Write(dir, "valid_chain_1x20", single.bytes);

  const size_t s0 = kvtier::kIndexHeaderBytes + size_t{small.first_slot} * sizeof(kvtier::IndexSlot);
  Bytes b = small.bytes;
  Poke<uint8_t>(b, s0 + offsetof(kvtier::IndexSlot, tier), 7);
  ok &= Write(dir, "bad_tier", b);
  b = small.bytes;
  Poke<uint32_t>(b, s0 + offsetof(kvtier::IndexSlot, record), 16);  // == max_records
  ok &= Write(dir, "bad_record_max", b);
  b = small.bytes;
  Poke<uint32_t>(b, s0 + offsetof(kvtier::IndexSlot, record), 0x7fffffffu);
  ok &= Write(dir, "bad_record_huge", b);
  // Every slot taken (what a client that could write the index once did to
  // make lookups of absent keys spin): probes must end after one pass.
  b = small.bytes;
  {
    const auto& h = *reinterpret_cast<const kvtier::IndexHeader*>(b.data());
    for (uint32_t i = 0; i < h.table_slots; ++i) {
      const size_t at = kvtier::kIndexHeaderBytes + size_t{i} * sizeof(kvtier::IndexSlot);
      uint32_t rec;
      std::memcpy(&rec, b.data() + at + offsetof(kvtier::IndexSlot, record), sizeof rec);
      if (rec != kvtier::kNoRecord) continue;
      Poke<uint32_t>(b, at + offsetof(kvtier::IndexSlot, record), i % 16);
      Poke<uint64_t>(b, at + offsetof(kvtier::IndexSlot, key_lo), 0x5eed0000ull + i);
      Poke<uint64_t>(b, at + offsetof(kvtier::IndexSlot, key_hi), 0xfull);
    }
  }
  ok &= Write(dir, "bad_every_slot_taken", b);
  b = small.bytes;
  Poke<uint32_t>(b, s0 + offsetof(kvtier::IndexSlot, seq), 1);  // A writer that never finished.
  ok &= Write(dir, "bad_seq_odd", b);
  b = small.bytes;
  Poke<uint64_t>(b, offsetof(kvtier::IndexHeader, magic), 0);
  ok &= Write(dir, "bad_magic", b);
  b = small.bytes;
  Poke<uint32_t>(b, offsetof(kvtier::IndexHeader, abi_version), kvtier::kShmAbiVersion + 1);
  ok &= Write(dir, "bad_abi", b);
  b = small.bytes;
  Poke<uint32_t>(b, offsetof(kvtier::IndexHeader, max_records), 0x80000001u);
  ok &= Write(dir, "bad_max_records", b);
  b = small.bytes;
  Poke<uint32_t>(b, offsetof(kvtier::IndexHeader, block_tokens), 1024);
  ok &= Write(dir, "bad_block_tokens", b);
  b = small.bytes;
  Poke<uint64_t>(b, offsetof(kvtier::IndexHeader, tokens_offset), 64);
  ok &= Write(dir, "bad_tokens_offset", b);
  b = small.bytes;
  b.resize(b.size() - 1);
  ok &= Write(dir, "bad_truncated", b);
  b = Bytes(small.bytes.begin(), small.bytes.begin() + kvtier::kIndexHeaderBytes);
  ok &= Write(dir, "bad_header_only", b);

  if (!ok) {
    std::fprintf(stderr, "failed to write the corpus to %s\n", argv[1]);
    return 1;
  }
  return 0;
}
