#include "safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

namespace kvtier::model {
namespace {

struct DTypeEntry {
  StDType dtype;
  const char* name;
  size_t size;
};
constexpr DTypeEntry kDTypes[] = {
    {StDType::kF32, "F32", 4},  {StDType::kF16, "F16", 2}, {StDType::kBF16, "BF16", 2},
    {StDType::kF64, "F64", 8},  {StDType::kI64, "I64", 8}, {StDType::kI32, "I32", 4},
    {StDType::kI16, "I16", 2},  {StDType::kI8, "I8", 1},   {StDType::kU8, "U8", 1},
    {StDType::kBool, "BOOL", 1},
};

// The header may not claim more than this: a guard against absurd allocations.
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

}  // namespace

size_t StDTypeSize(StDType d) { return kDTypes[static_cast<int>(d)].size; }
const char* StDTypeName(StDType d) { return kDTypes[static_cast<int>(d)].name; }

int64_t StTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

SafetensorsFile::~SafetensorsFile() {
  if (map_ != nullptr) ::munmap(map_, size_);
}

const StTensor* SafetensorsFile::Find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

Result<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return NotFound(path + ": " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    return Internal(path + ": fstat: " + std::strerror(errno));
  }
  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->size_ = static_cast<size_t>(st.st_size);
  if (f->size_ < 8) {
    ::close(fd);
    return Corrupt(path + ": " + std::to_string(f->size_) + " bytes is too short for a safetensors file");
  }
  f->map_ = ::mmap(nullptr, f->size_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (f->map_ == MAP_FAILED) {
    f->map_ = nullptr;
    return Internal(path + ": mmap: " + std::strerror(errno));
  }
  const auto* base = static_cast<const std::byte*>(f->map_);
  uint64_t header_len = 0;
  std::memcpy(&header_len, base, 8);  // Little-endian on every host kvtier supports.
  if (header_len > kMaxHeaderBytes || header_len > f->size_ - 8) {
    return Corrupt(path + ": header length " + std::to_string(header_len) + " exceeds the file (" +
                   std::to_string(f->size_) + " bytes)");
  }
  const auto* hdr = reinterpret_cast<const char*>(base + 8);
  nlohmann::json header = nlohmann::json::parse(hdr, hdr + header_len, nullptr, /*allow_exceptions=*/false);
  if (!header.is_object()) return Corrupt(path + ": the header is not a JSON object");
  const std::byte* data = base + 8 + header_len;
  const uint64_t data_bytes = f->size_ - 8 - header_len;
  for (auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) return Corrupt(path + ": __metadata__ is not an object");
      for (auto& [k, v] : entry.items()) {
        if (!v.is_string()) return Corrupt(path + ": __metadata__." + k + " is not a string");
        f->metadata_[k] = v.get<std::string>();
      }
      continue;
    }
    const std::string where = path + ": tensor '" + name + "'";
    if (!entry.is_object() || !entry.contains("dtype") || !entry.contains("shape") ||
        !entry.contains("data_offsets")) {
      return Corrupt(where + ": needs dtype, shape and data_offsets");
    }
    StTensor t;
    const auto& dt = entry["dtype"];
    bool known = false;
    for (const auto& d : kDTypes) {
      if (dt.is_string() && dt.get<std::string>() == d.name) {
        t.dtype = d.dtype;
        known = true;
      }
    }
    if (!known) return Corrupt(where + ": unknown dtype " + dt.dump());
    const auto& shape = entry["shape"];
    if (!shape.is_array()) return Corrupt(where + ": shape is not an array");
    uint64_t numel = 1;
    for (const auto& d : shape) {
      if (!d.is_number_unsigned() || d.get<uint64_t>() > (1ull << 40)) return Corrupt(where + ": bad dimension " + d.dump());
      t.shape.push_back(d.get<int64_t>());
      numel *= d.get<uint64_t>();
      if (numel > (1ull << 40)) return Corrupt(where + ": too many elements");
    }
    const auto& off = entry["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned()) {
      return Corrupt(where + ": data_offsets must be [begin, end]");
    }
    const uint64_t b = off[0].get<uint64_t>(), e = off[1].get<uint64_t>();
    if (b > e || e > data_bytes) {
      return Corrupt(where + ": data_offsets [" + std::to_string(b) + ", " + std::to_string(e) +
                     ") outside the " + std::to_string(data_bytes) + " data bytes");
    }
    if (e - b != numel * StDTypeSize(t.dtype)) {
      return Corrupt(where + ": " + std::to_string(e - b) + " bytes for " + std::to_string(numel) + " x " +
                     StDTypeName(t.dtype));
    }
    t.data = {data + b, static_cast<size_t>(e - b)};
    f->tensors_.emplace(name, std::move(t));
  }
  return f;
}

Status WriteSafetensors(const std::string& path, const std::vector<StTensorToWrite>& tensors,
                        const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    uint64_t numel = 1;
    for (int64_t d : t.shape) numel *= static_cast<uint64_t>(d);
    if (numel * StDTypeSize(t.dtype) != t.data.size()) {
      return InvalidArgument("tensor '" + t.name + "': " + std::to_string(t.data.size()) +
                             " bytes do not match its shape");
    }
    header[t.name] = {{"dtype", StDTypeName(t.dtype)}, {"shape", t.shape},
                      {"data_offsets", {offset, offset + t.data.size()}}};
    offset += t.data.size();
  }
  std::string text = header.dump();
  text.append((8 - (text.size() % 8)) % 8, ' ');  // Data starts 8-byte aligned.
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return NotFound("cannot write " + path);
  const uint64_t n = text.size();
  out.write(reinterpret_cast<const char*>(&n), 8);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  for (const auto& t : tensors) out.write(reinterpret_cast<const char*>(t.data.data()), static_cast<std::streamsize>(t.data.size()));
  out.flush();
  if (!out) return Internal("writing " + path + " failed");
  return Status::Ok();
}

}  // namespace kvtier::model
