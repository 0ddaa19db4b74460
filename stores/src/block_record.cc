// BlockRecord encoding and verification (block_record.h), and StoreKey (block_store.h).
#include "kvtier/stores/block_record.h"

#include <bit>
#include <cstdlib>
#include <cstring>
#include <new>

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/params.h>
#include <openssl/sha.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "kvtier/stores/block_store.h"

namespace kvtier::stores {
namespace {

static_assert(std::endian::native == std::endian::little, "records are little-endian");

template <typename T>
void PutAt(std::string& out, size_t at, const T& v) {
  std::memcpy(out.data() + at, &v, sizeof v);
}
template <typename T>
T GetAt(std::string_view in, size_t at) {
  T v;
  std::memcpy(&v, in.data() + at, sizeof v);
  return v;
}

void PutKey(std::string& out, size_t at, const BlockKey& k) {
  PutAt(out, at, k.lo);
  PutAt(out, at + 8, k.hi);
}
BlockKey GetKey(std::string_view in, size_t at) {
  return BlockKey{GetAt<uint64_t>(in, at), GetAt<uint64_t>(in, at + 8)};
}

// XXH3-64 of the header's first 88 bytes and the token ids that follow it.
uint64_t HeaderChecksum(std::string_view record, size_t tokens) {
  XXH3_state_t st;
  XXH3_64bits_reset(&st);
  XXH3_64bits_update(&st, record.data(), 88);
  XXH3_64bits_update(&st, record.data() + kRecordHeaderBytes, tokens * sizeof(TokenId));
  return XXH3_64bits_digest(&st);
}

RecordCheck Fault(RecordFault f, std::string why) { return RecordCheck{f, std::move(why), {}}; }

std::string Hex64(uint64_t v) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out(16, '0');
  for (int i = 15; i >= 0; --i, v >>= 4) out[i] = kDigits[v & 0xf];
  return out;
}

// Stamps a record EncodeBlockRecord laid out: both checksums.
void Seal(std::string& out, std::span<const TokenId> tokens, std::span<const std::byte> payload) {
  PutAt(out, 80, static_cast<uint64_t>(XXH3_64bits(payload.data(), payload.size())));
  PutAt(out, 88, static_cast<uint64_t>(HeaderChecksum(out, tokens.size())));
}

std::string Layout(uint32_t version, const BlockRecordHeader& h, std::span<const TokenId> tokens,
                   std::span<const std::byte> payload) {
  std::string out(BlockRecordBytes(tokens.size(), payload.size(), version == kRecordVersion), '\0');
  PutAt(out, 0, kRecordMagic);
  PutAt(out, 8, version);
  PutAt(out, 12, static_cast<uint32_t>(tokens.size()));
  PutAt(out, 16, h.profile_fingerprint);
  PutKey(out, 24, h.key);
  PutKey(out, 40, h.parent);
  PutKey(out, 56, h.key_ns.id);
  PutAt(out, 72, static_cast<uint64_t>(payload.size()));
  if (!tokens.empty()) std::memcpy(out.data() + kRecordHeaderBytes, tokens.data(), tokens.size_bytes());
  if (!payload.empty()) {
    std::memcpy(out.data() + kRecordHeaderBytes + tokens.size_bytes(), payload.data(), payload.size());
  }
  Seal(out, tokens, payload);
  return out;
}

}  // namespace

// The secret's bytes, wiped when the last RecordKey holding them goes.
struct RecordKey::Secret {
  std::string bytes;
  EVP_MAC* hmac = nullptr;  // OpenSSL's HMAC implementation, fetched once.
  ~Secret() {
    OPENSSL_cleanse(bytes.data(), bytes.size());
    EVP_MAC_free(hmac);
  }
};

Result<RecordKey> RecordKey::FromSecret(std::string_view secret) {
  if (secret.size() < kMinBytes || secret.size() > kMaxBytes) {
    return InvalidArgument("a record key of " + std::to_string(secret.size()) + " bytes: it must have " +
                           std::to_string(kMinBytes) + " to " + std::to_string(kMaxBytes) +
                           " (such as head -c 32 /dev/urandom)");
  }
  auto s = std::make_shared<Secret>();
  s->bytes.assign(secret);
  s->hmac = EVP_MAC_fetch(nullptr, "HMAC", nullptr);
  if (s->hmac == nullptr) return Status(StatusCode::kInternal, "OpenSSL offers no HMAC");
  static constexpr std::string_view kIdLabel = "kvtier record key id";
  unsigned char digest[SHA256_DIGEST_LENGTH];
  EVP_MD_CTX* md = EVP_MD_CTX_new();
  const bool hashed = md != nullptr && EVP_DigestInit_ex(md, EVP_sha256(), nullptr) == 1 &&
                      EVP_DigestUpdate(md, kIdLabel.data(), kIdLabel.size()) == 1 &&
                      EVP_DigestUpdate(md, secret.data(), secret.size()) == 1 &&
                      EVP_DigestFinal_ex(md, digest, nullptr) == 1;
  EVP_MD_CTX_free(md);
  if (!hashed) return Status(StatusCode::kInternal, "OpenSSL could not hash the record key");
  RecordKey key;
  std::memcpy(&key.id_, digest, sizeof key.id_);
  key.secret_ = std::move(s);
  return key;
}

std::string RecordKey::IdHex() const { return Hex64(id_); }

void RecordKey::Mac(std::string_view bytes, unsigned char* out) const {
  // A context per call (its setup hashes two blocks, nothing beside a record's
  // hundreds of KiB), so that calls from several threads share nothing mutable.
  EVP_MAC_CTX* ctx = EVP_MAC_CTX_new(secret_->hmac);
  char digest_name[] = "SHA256";
  const OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest_name, 0),
                               OSSL_PARAM_construct_end()};
  size_t len = 0;
  const bool ok = ctx != nullptr &&
                  EVP_MAC_init(ctx, reinterpret_cast<const unsigned char*>(secret_->bytes.data()),
                               secret_->bytes.size(), params) == 1 &&
                  EVP_MAC_update(ctx, reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size()) == 1 &&
                  EVP_MAC_final(ctx, out, &len, kRecordMacBytes) == 1 && len == kRecordMacBytes;
  EVP_MAC_CTX_free(ctx);
  // Out of memory inside OpenSSL: a MAC of all ones signs nothing anyone can verify.
  if (!ok) std::memset(out, 0xff, kRecordMacBytes);
}

StoreValue StoreValue::Copy(std::string_view bytes) {
  char* p = bytes.empty() ? nullptr : static_cast<char*>(std::malloc(bytes.size()));
  if (p == nullptr && !bytes.empty()) throw std::bad_alloc();
  if (!bytes.empty()) std::memcpy(p, bytes.data(), bytes.size());
  return Adopt(p, bytes.size());
}

void StoreValue::Free::operator()(char* p) const { std::free(p); }

std::string StoreKey(std::string_view prefix, uint64_t profile_fingerprint, const BlockKey& key) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out(prefix);
  out.reserve(prefix.size() + 16 + 1 + 32);
  for (int i = 15; i >= 0; --i) out.push_back(kDigits[(profile_fingerprint >> (4 * i)) & 0xf]);
  out.push_back(':');
  out += key.ToHex();
  return out;
}

std::optional<BlockKey> BlockKeyOfStoreKey(std::string_view prefix, std::string_view name) {
  if (!name.starts_with(prefix) || name.size() != prefix.size() + 16 + 1 + 32 || name[prefix.size() + 16] != ':') {
    return std::nullopt;
  }
  uint64_t words[2] = {0, 0};  // hi, lo: ToHex spells hi first.
  const std::string_view hex = name.substr(prefix.size() + 17);
  for (size_t i = 0; i < 32; ++i) {
    const char c = hex[i];
    const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    if (d < 0) return std::nullopt;
    words[i / 16] = words[i / 16] << 4 | static_cast<uint64_t>(d);
  }
  return BlockKey{words[1], words[0]};
}

std::string EncodeBlockRecord(const BlockRecordHeader& h, std::span<const TokenId> tokens,
                              std::span<const std::byte> payload) {
  return Layout(kUnsignedRecordVersion, h, tokens, payload);
}

std::string EncodeBlockRecord(const BlockRecordHeader& h, std::span<const TokenId> tokens,
                              std::span<const std::byte> payload, const RecordKey& key, bool sign_now) {
  std::string out = Layout(kRecordVersion, h, tokens, payload);
  PutAt(out, out.size() - kRecordTrailerBytes, key.id());
  if (sign_now) SignBlockRecord(key, &out);
  return out;
}

bool SignBlockRecord(const RecordKey& key, std::string* record) {
  if (record->size() < kRecordHeaderBytes + kRecordTrailerBytes || GetAt<uint32_t>(*record, 8) != kRecordVersion) {
    return false;
  }
  const size_t mac_at = record->size() - kRecordMacBytes;
  key.Mac(std::string_view(*record).substr(0, mac_at), reinterpret_cast<unsigned char*>(record->data() + mac_at));
  return true;
}

bool ReadOwnBlockRecord(std::string_view record, BlockRecordHeader* header, std::vector<TokenId>* tokens) {
  if (record.size() < kRecordHeaderBytes) return false;
  const uint32_t n = GetAt<uint32_t>(record, 12);
  if (record.size() < kRecordHeaderBytes + size_t{n} * sizeof(TokenId)) return false;
  header->profile_fingerprint = GetAt<uint64_t>(record, 16);
  header->key = GetKey(record, 24);
  header->parent = GetKey(record, 40);
  header->key_ns.id = GetKey(record, 56);
  tokens->resize(n);
  if (n > 0) std::memcpy(tokens->data(), record.data() + kRecordHeaderBytes, size_t{n} * sizeof(TokenId));
  return true;
}

RecordCheck VerifyBlockRecord(std::string_view rec, const RecordExpectation& want) {
  if (rec.size() < kRecordHeaderBytes) {
    return Fault(RecordFault::kCorrupt,
                 "record of " + std::to_string(rec.size()) + " bytes is shorter than its header");
  }
  if (GetAt<uint64_t>(rec, 0) != kRecordMagic) return Fault(RecordFault::kCorrupt, "bad record magic");
  const uint32_t version = GetAt<uint32_t>(rec, 8);
  if (version != kRecordVersion && version != kUnsignedRecordVersion) {
    return Fault(RecordFault::kCorrupt, "record format " + std::to_string(version) + ", this build reads " +
                                            std::to_string(kUnsignedRecordVersion) + " and " +
                                            std::to_string(kRecordVersion));
  }
  const bool is_signed = version == kRecordVersion;
  if (want.record_key != nullptr && !is_signed) {
    // Checked before anything else is: whatever else it holds, nobody with the key vouched for it.
    return Fault(RecordFault::kForged, "an unsigned record (format 1) while a record key is configured");
  }
  const uint32_t n = GetAt<uint32_t>(rec, 12);
  const uint64_t payload_bytes = GetAt<uint64_t>(rec, 72);
  if (n != want.tokens.size() || payload_bytes != want.payload_bytes) {
    return Fault(RecordFault::kForeign, "record of " + std::to_string(n) + " tokens and " +
                                            std::to_string(payload_bytes) + " payload bytes, the profile's are " +
                                            std::to_string(want.tokens.size()) + " and " +
                                            std::to_string(want.payload_bytes));
  }
  if (rec.size() != BlockRecordBytes(n, payload_bytes, is_signed)) {
    return Fault(RecordFault::kCorrupt, "record of " + std::to_string(rec.size()) + " bytes, its header says " +
                                            std::to_string(BlockRecordBytes(n, payload_bytes, is_signed)));
  }
  if (GetAt<uint64_t>(rec, 88) != HeaderChecksum(rec, n)) return Fault(RecordFault::kCorrupt, "header checksum");
  if (GetAt<uint64_t>(rec, 16) != want.profile_fingerprint) {
    return Fault(RecordFault::kForeign, "record of another profile");
  }
  if (GetKey(rec, 56) != want.key_ns.id) return Fault(RecordFault::kForeign, "record of another tenant or model");
  if (GetKey(rec, 24) != want.key) return Fault(RecordFault::kForeign, "record of another key");
  if (GetKey(rec, 40) != want.parent) return Fault(RecordFault::kForeign, "record of another parent");
  const char* tokens = rec.data() + kRecordHeaderBytes;
  if (std::memcmp(tokens, want.tokens.data(), want.tokens.size_bytes()) != 0) {
    return Fault(RecordFault::kForeign, "record of other tokens");
  }
  if (ChainKey(want.parent, want.key_ns, want.tokens) != want.key) {
    return Fault(RecordFault::kForeign, "key not chained in the asker's namespace");
  }
  const auto* payload = reinterpret_cast<const std::byte*>(tokens + want.tokens.size_bytes());
  if (XXH3_64bits(payload, payload_bytes) != GetAt<uint64_t>(rec, 80)) {
    return Fault(RecordFault::kCorrupt, "payload checksum");
  }
  if (want.record_key != nullptr) {
    // Damage was told by the checksums above; what is left to fail here was
    // made, or changed, without the key.
    const size_t mac_at = rec.size() - kRecordMacBytes;
    if (const auto id = GetAt<uint64_t>(rec, mac_at - 8); id != want.record_key->id()) {
      return Fault(RecordFault::kForeign,
                   "signed under key id " + Hex64(id) + ", ours is " + want.record_key->IdHex());
    }
    unsigned char mac[kRecordMacBytes];
    want.record_key->Mac(rec.substr(0, mac_at), mac);
    if (CRYPTO_memcmp(mac, rec.data() + mac_at, kRecordMacBytes) != 0) {
      return Fault(RecordFault::kForged, "MAC does not verify under the record key");
    }
  }
  return RecordCheck{RecordFault::kNone, {}, std::span<const std::byte>(payload, payload_bytes)};
}

}  // namespace kvtier::stores
