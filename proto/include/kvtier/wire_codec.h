// Writer and Reader: the primitive encoding of control-plane messages.
//
// Everything is little-endian regardless of the host. Integers are fixed width;
// a bool is one byte, 0 or 1; an enum is its underlying integer; a double is its
// IEEE-754 bit pattern as a u64; a string or byte array is a u32 length and the
// bytes; an array is a u32 count and the elements. Nothing is optional and nothing
// is padded, so every value has exactly one encoding.
//
// Both classes record the first error they meet and ignore every later call, so
// a codec can run straight through and check status() once. Field names are used
// only in error messages ("AcquireRequest.keys: ..."); pass string literals.
//
// Reader guarantees: it never reads past its span, never allocates more than a
// bounded multiple of the bytes that remain (an array count is checked against
// its bound and against remaining() / min_element_bytes before anything is
// allocated), and reports every malformed input as StatusCode::kProtocolError.
// Neither class is thread-safe; neither owns the bytes it reads or writes.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "kvtier/status.h"

namespace kvtier::wire {

inline constexpr size_t kMaxString = 4096;                  // Default bound of a string field.
inline constexpr size_t kMaxArray = size_t{1} << 20;        // Bound of every array count.
inline constexpr size_t kMaxConfigBytes = size_t{1} << 20;  // ConfigResponse.yaml only.

// Little-endian load/store of an unsigned integer at an unaligned address.
template <typename T>
inline void StoreLE(uint8_t* p, T v) {
  static_assert(std::is_unsigned_v<T>);
  if constexpr (std::endian::native == std::endian::little) {
    std::memcpy(p, &v, sizeof(T));
  } else {
    for (size_t i = 0; i < sizeof(T); ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
  }
}
template <typename T>
inline T LoadLE(const uint8_t* p) {
  static_assert(std::is_unsigned_v<T>);
  T v = 0;
  if constexpr (std::endian::native == std::endian::little) {
    std::memcpy(&v, p, sizeof(T));
  } else {
    for (size_t i = 0; i < sizeof(T); ++i) v = static_cast<T>(v | (static_cast<T>(p[i]) << (8 * i)));
  }
  return v;
}

// Encodes values in one of three modes: appending to a vector; writing into a
// caller's buffer (bounds-checked: running past its end is an error); or, with a
// null vector, only counting the bytes (a sizing pass, so that the real pass can
// allocate once). Values that break a bound (a string over its limit, an enum out
// of range, a failed Require) are not written: they set status() to
// kInvalidArgument, and the caller must discard what was written.
class Writer {
 public:
  // `context` names the message in error messages; it must outlive the Writer.
  Writer(std::vector<uint8_t>* out, const char* context)
      : mode_(out != nullptr ? Mode::kAppend : Mode::kCount), out_(out), context_(context) {}
  Writer(std::span<uint8_t> buffer, const char* context)
      : mode_(Mode::kBuffer), cursor_(buffer.data()), limit_(buffer.data() + buffer.size()), context_(context) {}

  void U8(const char*, uint8_t v) { Put(v); }
  void U16(const char*, uint16_t v) { Put(v); }
  void U32(const char*, uint32_t v) { Put(v); }
  void U64(const char*, uint64_t v) { Put(v); }
  void I32(const char*, int32_t v) { Put(static_cast<uint32_t>(v)); }
  void F64(const char*, double v) { Put(std::bit_cast<uint64_t>(v)); }
  void Bool(const char*, bool v) { Put(static_cast<uint8_t>(v ? 1 : 0)); }

  // Writes the underlying integer. The value must lie in [first, end).
  template <typename E>
  void Enum(const char* field, E v, uint64_t end, uint64_t first = 0) {
    using U = std::underlying_type_t<E>;
    static_assert(std::is_unsigned_v<U>);
    const auto u = static_cast<U>(v);
    if (u < first || u >= end) return FailRange(field, u, first, end);
    Put(u);
  }

  void String(const char* field, std::string_view s, size_t max = kMaxString) {
    if (Length(field, s.size(), max)) PutBytes(s.data(), s.size());
  }
  void Bytes(const char* field, std::span<const uint8_t> b, size_t max) {
    if (Length(field, b.size(), max)) PutBytes(b.data(), b.size());
  }
  // An array of u32 (slots, token IDs), copied in bulk on little-endian hosts.
  void U32s(const char* field, std::span<const uint32_t> v, size_t max = kMaxArray);
  // An extension field (wire.h): written only when it is not 0. Extensions come
  // after every other field of a message.
  void ExtensionU64(const char*, uint64_t v) {
    if (v != 0) Put(v);
  }
  // An extension byte string: written only when not empty, as Bytes writes it.
  void ExtensionBytes(const char* field, std::span<const uint8_t> b, size_t max) {
    if (!b.empty()) Bytes(field, b, max);
  }

  // `element(Writer&, const T&)` writes one element. `min_element_bytes` is unused
  // here; it mirrors Reader::Array so that one codec serves both directions.
  template <typename T, typename F>
  void Array(const char* field, const std::vector<T>& v, size_t /*min_element_bytes*/, F&& element,
             size_t max = kMaxArray) {
    if (!Length(field, v.size(), max)) return;
    for (const T& e : v) {
      element(*this, e);
      if (!ok()) return;
    }
  }

  // Records an error unless `condition` holds (a cross-field rule).
  void Require(bool condition, const char* field, const char* why) {
    if (!condition) Fail(field, why);
  }

  size_t size() const { return size_; }  // Bytes written (or counted) so far.
  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }

 private:
  enum class Mode : uint8_t { kCount, kAppend, kBuffer };

  template <typename T>
  void Put(T v) {
    if (!ok()) return;
    if (mode_ == Mode::kBuffer) {
      if (sizeof(T) > static_cast<size_t>(limit_ - cursor_)) return Overflow(sizeof(T));
      StoreLE(cursor_, v);
      cursor_ += sizeof(T);
    } else if (mode_ == Mode::kAppend) {
      uint8_t buf[sizeof(T)];
      StoreLE(buf, v);
      out_->insert(out_->end(), buf, buf + sizeof(T));
    }
    size_ += sizeof(T);
  }
  void PutBytes(const void* data, size_t n);
  // Writes a u32 length after checking it against `max`.
  bool Length(const char* field, size_t n, size_t max);
  void FailRange(const char* field, uint64_t value, uint64_t first, uint64_t end);
  void Fail(const char* field, std::string_view why);
  void Overflow(size_t n);

  Mode mode_;
  std::vector<uint8_t>* out_ = nullptr;
  uint8_t* cursor_ = nullptr;
  uint8_t* limit_ = nullptr;
  const char* context_;
  size_t size_ = 0;
  Status status_;
};

// Decodes values from a span, checking every read against what remains.
class Reader {
 public:
  // `context` names the message in error messages; it must outlive the Reader.
  Reader(std::span<const uint8_t> data, const char* context)
      : p_(data.data()), end_(data.data() + data.size()), context_(context) {}

  bool U8(const char* field, uint8_t& v) { return Get(field, v); }
  bool U16(const char* field, uint16_t& v) { return Get(field, v); }
  bool U32(const char* field, uint32_t& v) { return Get(field, v); }
  bool U64(const char* field, uint64_t& v) { return Get(field, v); }
  bool I32(const char* field, int32_t& v) {
    uint32_t u = 0;
    if (!Get(field, u)) return false;
    v = static_cast<int32_t>(u);
    return true;
  }
  bool F64(const char* field, double& v) {
    uint64_t u = 0;
    if (!Get(field, u)) return false;
    v = std::bit_cast<double>(u);
    return true;
  }
  bool Bool(const char* field, bool& v) {
    uint8_t u = 0;
    if (!Get(field, u)) return false;
    if (u > 1) return FailRange(field, u, 0, 2);
    v = u == 1;
    return true;
  }

  // Reads the underlying integer and accepts it only in [first, end).
  template <typename E>
  bool Enum(const char* field, E& v, uint64_t end, uint64_t first = 0) {
    std::underlying_type_t<E> u{};
    static_assert(std::is_unsigned_v<decltype(u)>);
    if (!Get(field, u)) return false;
    if (u < first || u >= end) return FailRange(field, u, first, end);
    v = static_cast<E>(u);
    return true;
  }

  bool String(const char* field, std::string& s, size_t max = kMaxString);
  bool Bytes(const char* field, std::vector<uint8_t>& b, size_t max);
  bool U32s(const char* field, std::vector<uint32_t>& v, size_t max = kMaxArray);
  // An extension field (wire.h): 0 when no bytes remain; otherwise a u64 that
  // must not be 0 (an encoded default would give the message a second encoding).
  bool ExtensionU64(const char* field, uint64_t& v) {
    v = 0;
    if (!ok() || remaining() == 0) return ok();
    if (!Get(field, v)) return false;
    return Require(v != 0, field, "is encoded with its default 0; omit it instead");
  }
  // An extension byte string: empty when no bytes remain; otherwise a length
  // (at most `max`) and the bytes, which must not be empty (one encoding only).
  bool ExtensionBytes(const char* field, std::vector<uint8_t>& b, size_t max) {
    b.clear();
    if (!ok() || remaining() == 0) return ok();
    if (!Bytes(field, b, max)) return false;
    return Require(!b.empty(), field, "is encoded empty; omit it instead");
  }

  // Reads an element count: at most `max`, and no more elements than the
  // remaining bytes can hold at `min_element_bytes` (>= 1) each.
  bool Count(const char* field, size_t min_element_bytes, size_t max, uint32_t& n);

  // `element(Reader&, T&)` reads one element; it reports failure through status().
  template <typename T, typename F>
  bool Array(const char* field, std::vector<T>& v, size_t min_element_bytes, F&& element, size_t max = kMaxArray) {
    uint32_t n = 0;
    if (!Count(field, min_element_bytes, max, n)) return false;
    v.clear();
    v.resize(n);
    const char* outer_array = array_;
    const uint32_t outer_index = index_;
    array_ = field;
    for (uint32_t i = 0; i < n && ok(); ++i) {
      index_ = i;
      element(*this, v[i]);
    }
    array_ = outer_array;
    index_ = outer_index;
    return ok();
  }

  // Records an error unless `condition` holds (a cross-field rule).
  bool Require(bool condition, const char* field, const char* why) {
    if (!condition && ok()) Fail(field, why);
    return ok();
  }

  // Ends decoding: any byte left over is an error. Returns status().
  Status Finish();

  size_t remaining() const { return static_cast<size_t>(end_ - p_); }
  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }

 private:
  template <typename T>
  bool Get(const char* field, T& v) {
    if (!Need(field, sizeof(T))) return false;
    v = LoadLE<T>(p_);
    p_ += sizeof(T);
    return true;
  }
  bool Need(const char* field, size_t n) {
    if (!ok()) return false;
    if (n <= remaining()) return true;
    return FailShort(field, n);
  }
  // Reads a u32 length, bounded by `max` and by remaining().
  bool Length(const char* field, size_t max, uint32_t& n);
  bool FailShort(const char* field, size_t n);
  bool FailRange(const char* field, uint64_t value, uint64_t first, uint64_t end);
  bool Fail(const char* field, std::string_view why);

  const uint8_t* p_;
  const uint8_t* end_;
  const char* context_;
  const char* array_ = nullptr;  // Innermost array being read, for error messages.
  uint32_t index_ = 0;
  Status status_;
};

}  // namespace kvtier::wire
