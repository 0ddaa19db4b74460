// safetensors: the weights format of Hugging Face checkpoints.
//
//   u64 little-endian N | N bytes of JSON header | raw tensor bytes
//   header: {"<name>": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...,
//            "__metadata__": {"k": "v"}}   (offsets relative to the end of the header)
//
// Torch-free: the reader maps the file and hands out byte spans; the model turns
// them into tensors. Every malformed input is an error naming what is wrong.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kvtier/status.h"

namespace kvtier::model {

enum class StDType : uint8_t { kF32, kF16, kBF16, kF64, kI64, kI32, kI16, kI8, kU8, kBool };
size_t StDTypeSize(StDType d);
const char* StDTypeName(StDType d);

struct StTensor {
  StDType dtype = StDType::kF32;
  std::vector<int64_t> shape;
  std::span<const std::byte> data;  // Into the mapped file; valid while the file lives.
  int64_t numel() const;
};

class SafetensorsFile {
 public:
  static Result<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::map<std::string, StTensor>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // nullptr if absent.
  const StTensor* Find(const std::string& name) const;

 private:
  SafetensorsFile() = default;
  void* map_ = nullptr;
  size_t size_ = 0;
  std::map<std::string, StTensor> tensors_;
  std::map<std::string, std::string> metadata_;
};

struct StTensorToWrite {
  std::string name;
  StDType dtype = StDType::kF32;
  std::vector<int64_t> shape;
  std::span<const std::byte> data;
};
// Writes tensors back to back in the given order; the header is padded with
// spaces so the data starts 8-byte aligned, as the reference writer does.
Status WriteSafetensors(const std::string& path, const std::vector<StTensorToWrite>& tensors,
                        const std::map<std::string, std::string>& metadata = {});

}  // namespace kvtier::model
