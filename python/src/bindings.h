// The pieces of kvtier._native (module.cc) that its binding files share:
// errors raised as kvtier.<Code>Error, conversions from Python values, numpy
// views of blocks, and the Python-side objects that hold a client and its leases.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kvtier/client.h"
#include "kvtier/model_identity.h"

namespace kvtier::python {

namespace py = pybind11;

// Seconds from Python as a timeout (ValueError if negative).
std::chrono::milliseconds Ms(double seconds);
// Raises the status as kvtier.<Code>Error. REQUIRES: the GIL held, !st.ok().
[[noreturn]] void Raise(const Status& st);
void Check(const Status& st);
template <typename T>
T Take(Result<T>&& r) {
  if (!r.ok()) Raise(r.status());
  return std::move(r).value();
}
// Runs `f` (a libkvtier call that may block) with the GIL released.
template <typename F>
auto Unlocked(F&& f) {
  py::gil_scoped_release unlocked;
  return f();
}

// acquire's promote: True, False or "after_read".
Promote PromoteFrom(const py::object& promote);
// Token ids (ValueError for one that is no uint32).
std::vector<TokenId> Tokens(const std::vector<int64_t>& tokens);
// A block key of 32 hex digits (None or "": the null key).
BlockKey KeyFromHex(const std::optional<std::string>& hex);
// A model identity: None, 32 hex digits, or 16+ bytes of a digest.
ModelId ModelFrom(const py::object& model);
py::dict ProfileDict(const ModelProfile& p);
py::dict SummaryDict(const SessionSummary& s);
// A block as a numpy array [layers, 2 (K, V), block_tokens, kv_heads, head_dim]
// over the mapped pool, keeping `owner` alive.
py::array BlockArray(std::byte* data, const ModelProfile& p, bool writable, py::handle owner);
// Ends a lease's use from Python: a view asked for after it is an error (the
// arrays already made stay valid memory, mapped while the client lives, but
// may show another block by then).
void CheckHeld(uint64_t id, const char* what);
uint64_t Address(std::byte* p);
// A cudaStream_t / CUstream passed from Python as an int (torch: stream.cuda_stream).
void* Stream(uint64_t s);

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


// The bindings, one file per concept.
void BindIdentity(py::module_& m);  // identity.cc: ModelIdentity.
void BindLeases(py::module_& m);    // leases.cc: Lease, WriteLease.
void BindClient(py::module_& m);    // client.cc: Client.

}  // namespace kvtier::python
