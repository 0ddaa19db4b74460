#include "kvtier/wire_codec.h"

#include <cstring>

namespace kvtier::wire {
namespace {

constexpr bool kLittleEndianHost = std::endian::native == std::endian::little;

std::string FieldPath(const char* context, const char* array, uint32_t index, const char* field) {
  std::string path(context);
  if (array != nullptr) {
    path += '.';
    path += array;
    path += '[';
    path += std::to_string(index);
    path += ']';
  }
  if (field != nullptr && *field != '\0' && (array == nullptr || std::strcmp(array, field) != 0)) {
    path += '.';
    path += field;
  }
  return path;
}

}  // namespace

// ---- Writer ----

void Writer::PutBytes(const void* data, size_t n) {
  if (!ok() || n == 0) return;
  const auto* p = static_cast<const uint8_t*>(data);
  if (mode_ == Mode::kBuffer) {
    if (n > static_cast<size_t>(limit_ - cursor_)) return Overflow(n);
    std::memcpy(cursor_, p, n);
    cursor_ += n;
  } else if (mode_ == Mode::kAppend) {
    out_->insert(out_->end(), p, p + n);
  }
  size_ += n;
}

void Writer::Overflow(size_t n) {
  Fail(nullptr, "needs " + std::to_string(n) + " more bytes, " + std::to_string(limit_ - cursor_) +
                    " remain in the output buffer");
}

bool Writer::Length(const char* field, size_t n, size_t max) {
  if (!ok()) return false;
  if (n > max) {
    Fail(field, "length " + std::to_string(n) + " exceeds the bound " + std::to_string(max));
    return false;
  }
  Put(static_cast<uint32_t>(n));
  return true;
}

void Writer::U32s(const char* field, std::span<const uint32_t> v, size_t max) {
  if (!Length(field, v.size(), max)) return;
  if constexpr (kLittleEndianHost) {
    PutBytes(v.data(), v.size_bytes());
  } else {
    for (uint32_t x : v) Put(x);
  }
}

void Writer::FailRange(const char* field, uint64_t value, uint64_t first, uint64_t end) {
  Fail(field,
       "value " + std::to_string(value) + " is outside [" + std::to_string(first) + ", " + std::to_string(end) + ")");
}

void Writer::Fail(const char* field, std::string_view why) {
  if (!ok()) return;
  status_ = InvalidArgument("cannot encode " + FieldPath(context_, nullptr, 0, field) + ": " + std::string(why));
}

// ---- Reader ----

bool Reader::Length(const char* field, size_t max, uint32_t& n) {
  if (!Get(field, n)) return false;
  if (n > max) {
    return Fail(field, "length " + std::to_string(n) + " exceeds the bound " + std::to_string(max));
  }
  if (n > remaining()) {
    return Fail(field,
                "length " + std::to_string(n) + " exceeds the " + std::to_string(remaining()) + " remaining bytes");
  }
  return true;
}

bool Reader::String(const char* field, std::string& s, size_t max) {
  uint32_t n = 0;
  if (!Length(field, max, n)) return false;
  s.assign(reinterpret_cast<const char*>(p_), n);
  p_ += n;
  return true;
}

bool Reader::Bytes(const char* field, std::vector<uint8_t>& b, size_t max) {
  uint32_t n = 0;
  if (!Length(field, max, n)) return false;
  b.assign(p_, p_ + n);
  p_ += n;
  return true;
}

bool Reader::Count(const char* field, size_t min_element_bytes, size_t max, uint32_t& n) {
  if (!Get(field, n)) return false;
  if (n > max) {
    return Fail(field, "count " + std::to_string(n) + " exceeds the bound " + std::to_string(max));
  }
  const size_t unit = min_element_bytes == 0 ? 1 : min_element_bytes;
  if (n > remaining() / unit) {
    return Fail(field, "count " + std::to_string(n) + " needs at least " + std::to_string(uint64_t{n} * unit) +
                           " bytes, " + std::to_string(remaining()) + " remain");
  }
  return true;
}

bool Reader::U32s(const char* field, std::vector<uint32_t>& v, size_t max) {
  uint32_t n = 0;
  if (!Count(field, sizeof(uint32_t), max, n)) return false;
  v.resize(n);
  if constexpr (kLittleEndianHost) {
    if (n != 0) std::memcpy(v.data(), p_, size_t{n} * sizeof(uint32_t));
  } else {
    for (uint32_t i = 0; i < n; ++i) v[i] = LoadLE<uint32_t>(p_ + size_t{i} * sizeof(uint32_t));
  }
  p_ += size_t{n} * sizeof(uint32_t);
  return true;
}

Status Reader::Finish() {
  if (ok() && remaining() != 0) {
    status_ =
        ProtocolError(std::string(context_) + ": " + std::to_string(remaining()) + " trailing bytes after the message");
  }
  return status_;
}

bool Reader::FailShort(const char* field, size_t n) {
  return Fail(field, "needs " + std::to_string(n) + " bytes, " + std::to_string(remaining()) + " remain");
}

bool Reader::FailRange(const char* field, uint64_t value, uint64_t first, uint64_t end) {
  return Fail(field, "value " + std::to_string(value) + " is outside [" + std::to_string(first) + ", " +
                         std::to_string(end) + ")");
}

bool Reader::Fail(const char* field, std::string_view why) {
  if (ok()) status_ = ProtocolError(FieldPath(context_, array_, index_, field) + ": " + std::string(why));
  return false;
}

}  // namespace kvtier::wire
