// kvtier._native's shared pieces (bindings.h): errors, conversions, block views.
#include <algorithm>
#include <cstring>

#include "bindings.h"

namespace kvtier::python {
namespace {

using Seconds = std::chrono::duration<double>;

// "not_found" -> "NotFoundError": the class kvtier/__init__.py defines.
std::string ErrorClassName(StatusCode code) {
  std::string out;
  bool upper = true;
  for (char c : StatusCodeName(code)) {
    if (c == '_') {
      upper = true;
      continue;
    }
    out.push_back(upper ? static_cast<char>(c - 'a' + 'A') : c);
    upper = false;
  }
  return out + "Error";
}

py::dtype NumpyDtype(DType d) {
  switch (d) {
    case DType::kF16:
      return py::dtype("float16");
    case DType::kF32:
      return py::dtype("float32");
    case DType::kBF16:
      return py::dtype("uint16");  // numpy has no bfloat16: the raw bits.
  }
  return py::dtype("uint8");
}

}  // namespace

std::chrono::milliseconds Ms(double seconds) {
  if (!(seconds >= 0)) throw py::value_error("a timeout must be >= 0 seconds");
  // A caller's float may be past what milliseconds hold (1e17 s, infinity): converting it is undefined,
  // and on x86 gave a negative count ("a ttl must not be negative"). Longer than kMaxSeconds is as good as
  // forever for a timeout, and past every limit kvtierd sets, so it is clamped there.
  constexpr double kMaxSeconds = 1e12;  // ~31,700 years.
  return std::chrono::duration_cast<std::chrono::milliseconds>(Seconds(std::min(seconds, kMaxSeconds)));
}

// Raises the status as kvtier.<Code>Error. REQUIRES: the GIL held, !st.ok().
[[noreturn]] void Raise(const Status& st) {
  py::object cls = py::module_::import("kvtier").attr(ErrorClassName(st.code()).c_str());
  PyErr_SetString(cls.ptr(), st.message().c_str());
  throw py::error_already_set();
}

void Check(const Status& st) {
  if (!st.ok()) Raise(st);
}

// acquire's promote: True, False or "after_read".
Promote PromoteFrom(const py::object& promote) {
  if (py::isinstance<py::bool_>(promote)) return promote.cast<bool>() ? Promote::kNow : Promote::kNo;
  if (py::isinstance<py::str>(promote) && promote.cast<std::string>() == "after_read") return Promote::kAfterRead;
  throw py::value_error("promote must be True, False or 'after_read', not " + py::repr(promote).cast<std::string>());
}

std::vector<TokenId> Tokens(const std::vector<int64_t>& tokens) {
  std::vector<TokenId> out;
  out.reserve(tokens.size());
  for (int64_t t : tokens) {
    if (t < 0 || t > 0xffffffffLL) throw py::value_error("token id " + std::to_string(t) + " is not a uint32");
    out.push_back(static_cast<TokenId>(t));
  }
  return out;
}

BlockKey KeyFromHex(const std::optional<std::string>& hex) {
  if (!hex || hex->empty()) return BlockKey{};
  const std::optional<ModelId> k = ModelId::FromHex(*hex);  // Same 32-hex-digit form.
  if (!k) throw py::value_error("a block key is 32 hex digits");
  return k->id;
}

ModelId ModelFrom(const py::object& model) {
  if (model.is_none()) return ModelId{};
  if (py::isinstance<py::bytes>(model)) {
    const std::string raw = model.cast<std::string>();
    if (raw.size() < 16) throw py::value_error("a model identity in bytes needs at least 16 bytes (a digest)");
    ModelId id;
    std::memcpy(&id.id.lo, raw.data(), 8);  // The first 128 bits, as ModelIdentity::Finish lays them out.
    std::memcpy(&id.id.hi, raw.data() + 8, 8);
    if (id.IsNull()) throw py::value_error("the null model identity");
    return id;
  }
  const std::optional<ModelId> id = ModelId::FromHex(model.cast<std::string>());
  if (!id || id->IsNull()) throw py::value_error("a model identity is 32 hex digits (not all zero) or 16+ bytes");
  return *id;
}

py::dict ProfileDict(const ModelProfile& p) {
  py::dict d;
  d["name"] = p.name;
  d["layers"] = p.layers;
  d["kv_heads"] = p.kv_heads;
  d["head_dim"] = p.head_dim;
  d["dtype"] = std::string(DTypeName(p.dtype));
  d["block_tokens"] = p.block_tokens;
  d["block_bytes"] = p.BlockBytes();
  return d;
}

py::dict SummaryDict(const SessionSummary& s) {
  py::dict d;
  d["id"] = s.id;
  d["tenant"] = s.tenant;
  d["model"] = s.model.IsNull() ? py::object(py::none()) : py::object(py::str(s.model.ToHex()));
  d["blocks"] = s.blocks;
  d["gpu_blocks"] = s.gpu_blocks;
  d["host_blocks"] = s.host_blocks;
  d["moving"] = s.moving;
  d["tokens"] = s.tokens;
  d["idle_s"] = static_cast<double>(s.last_use_ms_ago) / 1000.0;
  d["priority"] = s.priority;
  return d;
}

// A block as a numpy array [layers, 2 (K, V), block_tokens, kv_heads, head_dim]
// over the mapped pool, keeping `owner` alive.
py::array BlockArray(std::byte* data, const ModelProfile& p, bool writable, py::handle owner) {
  if (data == nullptr) {
    Raise(FailedPrecondition(
        "this block lies in GPU memory (the cuda backend's GPU tier), which numpy cannot view; read it with a "
        "GPU framework, or acquire with promote=False to lease host-tier copies"));
  }
  const py::dtype dt = NumpyDtype(p.dtype);
  const auto e = static_cast<py::ssize_t>(DTypeSize(p.dtype));
  const std::vector<py::ssize_t> shape = {p.layers, 2, p.block_tokens, p.kv_heads, p.head_dim};
  const std::vector<py::ssize_t> strides = {
      2 * static_cast<py::ssize_t>(p.PlaneBytes()), static_cast<py::ssize_t>(p.PlaneBytes()),
      static_cast<py::ssize_t>(p.kv_heads) * p.head_dim * e, static_cast<py::ssize_t>(p.head_dim) * e, e};
  py::array a(dt, shape, strides, data, owner);
  if (!writable) py::detail::array_proxy(a.ptr())->flags &= ~py::detail::npy_api::NPY_ARRAY_WRITEABLE_;
  return a;
}

void CheckHeld(uint64_t id, const char* what) {
  if (id == 0) Raise(FailedPrecondition(std::string(what) + " was released: its blocks may be another's now"));
}

uint64_t Address(std::byte* p) { return static_cast<uint64_t>(reinterpret_cast<uintptr_t>(p)); }

// A cudaStream_t / CUstream passed from Python as an int (torch: stream.cuda_stream).
void* Stream(uint64_t s) { return reinterpret_cast<void*>(static_cast<uintptr_t>(s)); }

}  // namespace kvtier::python
