// kvtier._native: libkvtier for Python (pybind11). The package kvtier
// (python/kvtier/__init__.py) re-exports it with its exception classes.
//
// Every call that may block (a round trip to kvtierd, a fence wait) runs with
// the GIL released, so one Client serves several Python threads (libkvtier's
// Client is thread-safe). Errors raise kvtier.<Code>Error with kvtierd's message.
// Block views are numpy arrays over the mapped pools, valid while the lease's
// connection lives; they keep the lease object (and so the mapping) alive.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kvtier/client.h"
#include "kvtier/model_identity.h"

namespace py = pybind11;

namespace kvtier::python {
namespace {

using Seconds = std::chrono::duration<double>;

std::chrono::milliseconds Ms(double seconds) {
  if (!(seconds >= 0)) throw py::value_error("a timeout must be >= 0 seconds");
  return std::chrono::duration_cast<std::chrono::milliseconds>(Seconds(seconds));
}

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

// Raises the status as kvtier.<Code>Error. REQUIRES: the GIL held, !st.ok().
[[noreturn]] void Raise(const Status& st) {
  py::object cls = py::module_::import("kvtier").attr(ErrorClassName(st.code()).c_str());
  PyErr_SetString(cls.ptr(), st.message().c_str());
  throw py::error_already_set();
}

void Check(const Status& st) {
  if (!st.ok()) Raise(st);
}

template <typename T>
T Take(Result<T>&& r) {
  if (!r.ok()) Raise(r.status());
  return std::move(r).value();
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

// Runs `f` (a libkvtier call that may block) with the GIL released.
template <typename F>
auto Unlocked(F&& f) {
  py::gil_scoped_release unlocked;
  return f();
}

// Ends a lease's use from Python: a view asked for after it is an error (the
// arrays already made stay valid memory, mapped while the client lives, but
// may show another block by then).
void CheckHeld(uint64_t id, const char* what) {
  if (id == 0) Raise(FailedPrecondition(std::string(what) + " was released: its blocks may be another's now"));
}

uint64_t Address(std::byte* p) { return static_cast<uint64_t>(reinterpret_cast<uintptr_t>(p)); }

// A cudaStream_t / CUstream passed from Python as an int (torch: stream.cuda_stream).
void* Stream(uint64_t s) { return reinterpret_cast<void*>(static_cast<uintptr_t>(s)); }

// Copies layers [first, first + count) of the lease's blocks (in host memory)
// into `dst`, laid out as [count, 2 (K, V), kv_heads, capacity, head_dim]:
// Hugging Face's [kv_heads, seq, head_dim] per plane, the blocks' rows filling
// the first blocks * block_tokens of each head's `capacity`. One pass, reading
// each block in order (a second thread measured no faster: the copy is bound
// by memory bandwidth).
void GatherBlocks(const Lease& lease, const ModelProfile& p, uint32_t first, uint32_t count, size_t capacity,
                  std::byte* dst) {
  const size_t n = lease.size(), bt = p.block_tokens, kvh = p.kv_heads;
  const size_t row = size_t{p.head_dim} * DTypeSize(p.dtype);  // One head of one token.
  for (uint32_t layer = first; layer < first + count; ++layer) {
    for (uint32_t kv = 0; kv < 2; ++kv) {
      std::byte* plane = dst + (size_t{layer - first} * 2 + kv) * kvh * capacity * row;
      for (size_t i = 0; i < n; ++i) {
        const std::byte* src = lease.block(i).data + p.PlaneOffset(layer, kv);
        for (size_t t = 0; t < bt; ++t) {
          for (size_t h = 0; h < kvh; ++h) {
            std::memcpy(plane + (h * capacity + i * bt + t) * row, src + (t * kvh + h) * row, row);
          }
        }
      }
    }
  }
}

// A Python-side client: the libkvtier Client and what its views need.
struct PyClient {
  std::unique_ptr<Client> client;
};

struct PyLease {
  Lease lease;
  ModelProfile profile;
  bool lease_backend_cuda = false;  // GPU-tier blocks are device memory.
};

struct PyWriteLease {
  WriteLease lease;
  ModelProfile profile;
};

}  // namespace
}  // namespace kvtier::python

using namespace kvtier;          // NOLINT: the module's body names most of the API.
using namespace kvtier::python;  // NOLINT

PYBIND11_MODULE(_native, m) {
  m.doc() = "libkvtier bindings; import kvtier instead";
  m.attr("PROTOCOL_VERSION") = ProtocolVersion();

  py::class_<ModelIdentity>(m, "ModelIdentity",
                            "The model identity of kvtier/model_identity.h: add every tensor in ascending name "
                            "order, then the tokenizer's description, then finish() gives 32 hex digits")
      .def(py::init<>())
      .def(
          "add_tensor",
          [](ModelIdentity& id, const std::string& name, const std::string& dtype, const std::vector<int64_t>& shape,
             const py::buffer& data) {
            const py::buffer_info info = data.request();
            if (!PyBuffer_IsContiguous(info.view(), 'C')) throw py::value_error("tensor bytes must be C-contiguous");
            const auto* bytes = static_cast<const std::byte*>(info.ptr);
            const auto n = static_cast<size_t>(info.size * info.itemsize);
            Check(Unlocked([&] { return id.AddTensor(name, dtype, shape, {bytes, n}); }));
          },
          py::arg("name"), py::arg("dtype"), py::arg("shape"), py::arg("data"),
          "dtype as safetensors names it (F32, BF16, F16, ...); data: the raw little-endian bytes")
      .def(
          "add_config", [](ModelIdentity& id, const std::string& settings) { Check(id.AddConfig(settings)); },
          py::arg("settings"), "The architecture's settings, as kvtier/model_identity.h spells them")
      .def(
          "add_tokenizer",
          [](ModelIdentity& id, const py::bytes& description) {
            const std::string d = description;
            Check(id.AddTokenizer(std::string_view(d)));
          },
          py::arg("description"))
      .def("finish", [](ModelIdentity& id) { return Take(id.Finish()).ToHex(); });

  py::class_<PyLease>(m, "Lease", "A read lease on a cached prefix (release it, or use it as a context manager)")
      .def_property_readonly("id", [](const PyLease& l) { return l.lease.id(); })
      .def_property_readonly(
          "matched", [](const PyLease& l) { return l.lease.matched(); }, "Blocks of the prefix found in the cache")
      .def_property_readonly("promoted", [](const PyLease& l) { return l.lease.promoted(); })
      .def("__len__", [](const PyLease& l) { return l.lease.size(); })
      .def_property_readonly(
          "blocks",
          [](const PyLease& l) {
            py::list out;
            for (const BlockRef& b : l.lease.blocks())
              out.append(py::make_tuple(std::string(TierName(b.tier)), b.slot));
            return out;
          },
          "(tier, slot) of each leased block")
      .def(
          "wait", [](PyLease& l, double timeout) { Check(Unlocked([&] { return l.lease.Wait(Ms(timeout)); })); },
          py::arg("timeout") = 10.0, "Waits until promoted blocks have landed in the GPU tier")
      .def(
          "block",
          [](py::object self, size_t i) {
            PyLease& l = self.cast<PyLease&>();
            CheckHeld(l.lease.id(), "the lease");
            if (i >= l.lease.size())
              throw py::index_error("block " + std::to_string(i) + " of a lease of " + std::to_string(l.lease.size()));
            return BlockArray(l.lease.block(i).data, l.profile, /*writable=*/false, self);
          },
          py::arg("i"),
          "Block i as a read-only numpy array [layers, 2, block_tokens, kv_heads, head_dim] over the pool "
          "(bf16 as uint16 bits); wait() first if blocks were promoted")
      .def(
          "address",
          [](PyLease& l, size_t i) {
            CheckHeld(l.lease.id(), "the lease");
            if (i >= l.lease.size()) throw py::index_error("block index out of range");
            const BlockRef& b = l.lease.block(i);
            return py::make_tuple(std::string(TierName(b.tier)), Address(b.data));
          },
          py::arg("i"),
          "(tier, address) of block i in this process: a device address for a GPU-tier block on the cuda "
          "backend (0 if the client did not open the GPU)")
      .def(
          "gather",
          [](PyLease& l, const py::buffer& dst, uint32_t first_layer, std::optional<uint32_t> layers,
             std::optional<size_t> capacity) {
            CheckHeld(l.lease.id(), "the lease");
            const py::buffer_info info = dst.request(/*writable=*/true);
            const ModelProfile& p = l.profile;
            const uint32_t count = layers.value_or(p.layers - std::min(first_layer, p.layers));
            if (first_layer >= p.layers || count == 0 || count > p.layers - first_layer) {
              throw py::value_error("gather: layers [" + std::to_string(first_layer) + ", +" + std::to_string(count) +
                                    ") of a profile of " + std::to_string(p.layers));
            }
            const size_t seq = l.lease.size() * p.block_tokens;
            const size_t rows = capacity.value_or(seq);
            if (rows < seq) {
              throw py::value_error("gather: a capacity of " + std::to_string(rows) + " rows cannot hold the " +
                                    std::to_string(seq) + " tokens leased");
            }
            const size_t want = 2 * size_t{count} * rows * p.kv_heads * p.head_dim * DTypeSize(p.dtype);
            if (!PyBuffer_IsContiguous(info.view(), 'C') || static_cast<size_t>(info.size * info.itemsize) != want) {
              throw py::value_error("gather needs a C-contiguous buffer of " + std::to_string(want) +
                                    " bytes: [layers, 2, kv_heads, capacity, head_dim]");
            }
            for (const BlockRef& b : l.lease.blocks()) {
              if (b.data == nullptr || (b.tier == Tier::kGpu && l.lease_backend_cuda)) {
                Raise(
                    FailedPrecondition("gather reads host memory; this lease holds GPU-tier blocks of the cuda "
                                       "backend (read them on the GPU)"));
              }
            }
            Unlocked([&] {
              GatherBlocks(l.lease, p, first_layer, count, rows, static_cast<std::byte*>(info.ptr));
              return 0;
            });
          },
          py::arg("dst"), py::arg("first_layer") = 0, py::arg("layers") = py::none(), py::arg("capacity") = py::none(),
          "Copies layers [first_layer, first_layer + layers) (default: all) of every leased block into dst, a "
          "writable C-contiguous buffer laid out as [layers, 2, kv_heads, capacity, head_dim] (Hugging Face's "
          "layout per plane; capacity defaults to blocks * block_tokens, and a larger one leaves room after the "
          "prefix's rows untouched), in one pass")
      .def(
          "wait_on_stream",
          [](PyLease& l, uint64_t stream, double host_timeout) {
            Check(Unlocked([&] { return l.lease.WaitOnStream(Stream(stream), Ms(host_timeout)); }));
          },
          py::arg("stream"), py::arg("host_timeout") = 10.0,
          "Makes work queued on a CUDA stream (an int: torch's stream.cuda_stream) wait for promotions")
      .def(
          "release_after",
          [](PyLease& l, uint64_t stream) { Check(Unlocked([&] { return l.lease.ReleaseAfter(Stream(stream)); })); },
          py::arg("stream"), "Ends the lease once the work queued on the CUDA stream so far is done")
      .def("release", [](PyLease& l) { Check(Unlocked([&] { return l.lease.Release(); })); })
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](PyLease& l, py::object, py::object, py::object) {
        py::gil_scoped_release unlocked;
        (void)l.lease.Release();  // An error on the way out of a with block is not raised over the body's.
      });

  py::class_<PyWriteLease>(m, "WriteLease", "GPU-tier slots reserved for writing new blocks")
      .def_property_readonly("id", [](const PyWriteLease& l) { return l.lease.id(); })
      .def("__len__", [](const PyWriteLease& l) { return l.lease.size(); })
      .def_property_readonly("slots", [](const PyWriteLease& l) { return l.lease.slots(); })
      .def(
          "block",
          [](py::object self, size_t i) {
            PyWriteLease& l = self.cast<PyWriteLease&>();
            CheckHeld(l.lease.id(), "the write lease");
            if (i >= l.lease.size())
              throw py::index_error("slot " + std::to_string(i) + " of a write lease of " +
                                    std::to_string(l.lease.size()));
            return BlockArray(l.lease.data(i), l.profile, /*writable=*/true, self);
          },
          py::arg("i"), "Slot i as a writable numpy array [layers, 2, block_tokens, kv_heads, head_dim]")
      .def(
          "address",
          [](PyWriteLease& l, size_t i) {
            CheckHeld(l.lease.id(), "the write lease");
            if (i >= l.lease.size()) throw py::index_error("slot index out of range");
            return Address(l.lease.data(i));
          },
          py::arg("i"), "Address of slot i in this process (a device address on the cuda backend)")
      .def(
          "record_written",
          [](PyWriteLease& l, uint64_t stream) {
            Check(Unlocked([&] { return l.lease.RecordWritten(Stream(stream)); }));
          },
          py::arg("stream"), "Records, on a CUDA stream, the event the next commit sends (cuda backend)")
      .def(
          "release_after",
          [](PyWriteLease& l, uint64_t stream) {
            Check(Unlocked([&] { return l.lease.ReleaseAfter(Stream(stream)); }));
          },
          py::arg("stream"))
      .def("release", [](PyWriteLease& l) { Check(Unlocked([&] { return l.lease.Release(); })); })
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](PyWriteLease& l, py::object, py::object, py::object) {
        py::gil_scoped_release unlocked;
        (void)l.lease.Release();
      });

  py::class_<PyClient>(m, "Client", "A connection to kvtierd")
      .def(py::init([](const std::string& socket, const std::string& tenant, const std::string& profile,
                       const py::object& model_id, const std::string& client_name, double connect_timeout,
                       double request_timeout, bool open_gpu) {
             ClientOptions o;
             o.socket_path = socket;
             o.tenant = tenant;
             o.profile = profile;
             o.model = ModelFrom(model_id);
             o.client_name = client_name.empty() ? "python" : client_name;
             o.connect_timeout = Ms(connect_timeout);
             o.request_timeout = Ms(request_timeout);
             o.open_gpu = open_gpu;
             auto c = Unlocked([&] { return Client::Connect(o); });
             return std::make_unique<PyClient>(PyClient{Take(std::move(c))});
           }),
           py::arg("socket") = "/run/kvtier/kvtierd.sock", py::arg("tenant") = "", py::arg("profile") = "",
           py::arg("model_id") = py::none(), py::arg("client_name") = "", py::arg("connect_timeout") = 2.0,
           py::arg("request_timeout") = 10.0, py::arg("open_gpu") = true)
      .def_property_readonly("profile", [](const PyClient& c) { return ProfileDict(c.client->profile()); })
      .def_property_readonly("block_tokens", [](const PyClient& c) { return c.client->block_tokens(); })
      .def_property_readonly("backend", [](const PyClient& c) { return c.client->backend(); })
      .def_property_readonly("client_id", [](const PyClient& c) { return c.client->client_id(); })
      .def_property_readonly("instance_id", [](const PyClient& c) { return c.client->instance_id(); })
      .def_property_readonly("model_id",
                             [](const PyClient& c) -> py::object {
                               const ModelId& id = c.client->options().model;
                               return id.IsNull() ? py::object(py::none()) : py::object(py::str(id.ToHex()));
                             })
      .def(
          "keys",
          [](const PyClient& c, const std::vector<int64_t>& tokens, const std::optional<std::string>& parent) {
            std::vector<std::string> out;
            for (const BlockKey& k : c.client->Keys(Tokens(tokens), KeyFromHex(parent))) out.push_back(k.ToHex());
            return out;
          },
          py::arg("tokens"), py::arg("parent") = py::none(), "Keys (32 hex digits) of the full blocks of tokens")
      .def(
          "probe",
          [](const PyClient& c, const std::vector<int64_t>& tokens) { return c.client->Probe(Tokens(tokens)); },
          py::arg("tokens"), "Blocks of tokens cached now (reads the shared index; no round trip)")
      .def(
          "acquire",
          [](PyClient& c, const std::vector<int64_t>& tokens, const std::string& session, const py::object& promote) {
            const std::vector<TokenId> t = Tokens(tokens);
            const Promote how = PromoteFrom(promote);
            auto r = Unlocked([&] { return c.client->Acquire(session, t, how); });
            return std::make_unique<PyLease>(
                PyLease{Take(std::move(r)), c.client->profile(), c.client->backend() == "cuda"});
          },
          py::arg("tokens"), py::arg("session") = "", py::arg("promote") = true,
          "Leases the longest cached prefix of tokens' full blocks. promote: True (copy host-tier hits to "
          "the GPU tier now; wait() before reading them), False (read them where they lie), or 'after_read' "
          "(read them where they lie now; kvtierd promotes them once the lease is released)")
      .def(
          "allocate",
          [](PyClient& c, uint32_t blocks) {
            auto r = Unlocked([&] { return c.client->Allocate(blocks); });
            return std::make_unique<PyWriteLease>(PyWriteLease{Take(std::move(r)), c.client->profile()});
          },
          py::arg("blocks"))
      .def(
          "commit",
          [](PyClient& c, PyWriteLease& lease, const std::string& session, const std::vector<int64_t>& tokens,
             uint32_t start_block, const std::optional<std::string>& parent, const std::vector<uint32_t>& slots) {
            const std::vector<TokenId> t = Tokens(tokens);
            const BlockKey p = KeyFromHex(parent);
            auto r = Unlocked([&] { return c.client->Commit(lease.lease, session, p, start_block, t, slots); });
            const CommitResult done = Take(std::move(r));
            return py::make_tuple(done.stored, done.duplicates);
          },
          py::arg("lease"), py::arg("session"), py::arg("tokens"), py::arg("start_block") = 0,
          py::arg("parent") = py::none(), py::arg("slots") = std::vector<uint32_t>{},
          "Publishes the blocks written into the lease's slots; returns (stored, duplicates)")
      .def(
          "demote",
          [](PyClient& c, const std::string& session) {
            auto r = Unlocked([&] { return c.client->Demote(session); });
            return Take(std::move(r));
          },
          py::arg("session"))
      .def(
          "prefetch",
          [](PyClient& c, const std::string& session) {
            auto r = Unlocked([&] { return c.client->Prefetch(session); });
            return Take(std::move(r));
          },
          py::arg("session"))
      .def(
          "evict",
          [](PyClient& c, const std::string& session, const std::string& tenant) {
            auto r = Unlocked([&] { return c.client->Evict(session, tenant); });
            return Take(std::move(r));
          },
          py::arg("session"), py::arg("tenant") = "")
      .def(
          "set_priority",
          [](PyClient& c, const std::string& session, int priority, double ttl) {
            Check(Unlocked([&] { return c.client->SetPriority(session, priority, Ms(ttl)); }));
          },
          py::arg("session"), py::arg("priority"), py::arg("ttl") = 0.0)
      .def(
          "sessions",
          [](PyClient& c, const std::string& tenant) {
            auto r = Unlocked([&] { return c.client->ListSessions(tenant); });
            py::list out;
            for (const SessionSummary& s : Take(std::move(r))) out.append(SummaryDict(s));
            return out;
          },
          py::arg("tenant") = "")
      .def(
          "session",
          [](PyClient& c, const std::string& id) {
            auto r = Unlocked([&] { return c.client->GetSession(id); });
            const SessionInfo info = Take(std::move(r));
            py::dict d = SummaryDict(info.summary);
            // Past the session's own blocks: those dropped into the stores, named as the stats name them.
            std::vector<std::string> stores;
            if (info.chain.size() > info.summary.blocks) {
              auto stats = Unlocked([&] { return c.client->Stats(); });
              if (stats.ok()) stores = StoreNames(*stats);
            }
            py::list chain;
            for (size_t i = 0; i < info.chain.size(); ++i) {
              const uint8_t t = i < info.tiers.size() ? info.tiers[i] : kPlaceUnknown;
              chain.append(py::make_tuple(info.chain[i].ToHex(), PlaceName(t, stores)));
            }
            d["chain"] = chain;
            d["dropped_blocks"] = info.chain.size() - std::min<size_t>(info.chain.size(), info.summary.blocks);
            return d;
          },
          py::arg("id"))
      .def("stats",
           [](PyClient& c) {
             auto r = Unlocked([&] { return c.client->Stats(); });
             py::dict out;
             for (const auto& [k, v] : Take(std::move(r))) out[py::str(k)] = v;
             return out;
           })
      .def("ping", [](PyClient& c) {
        auto r = Unlocked([&] { return c.client->Ping(); });
        return std::chrono::duration<double>(Take(std::move(r))).count();
      });
}
