// kvtier._native: libkvtier for Python (pybind11). The package kvtier
// (python/kvtier/__init__.py) re-exports it with its exception classes.
//
// Every call that may block (a round trip to kvtierd, a fence wait) runs with
// the GIL released, so one Client serves several Python threads (libkvtier's
// Client is thread-safe). Errors raise kvtier.<Code>Error with kvtierd's message.
// Block views are numpy arrays over the mapped pools, valid while the lease's
// connection lives; they keep the lease object (and so the mapping) alive.
//
// The bindings are grouped by concept: identity.cc, leases.cc, client.cc, and
// the pieces they share in bindings.h (convert.cc). _native.pyi (beside the
// package's Python files) is its type stub: a binding added here is added there.
#include "bindings.h"

PYBIND11_MODULE(_native, m) {
  m.doc() = "libkvtier bindings; import kvtier instead";
  m.attr("PROTOCOL_VERSION") = kvtier::ProtocolVersion();
  // The CMake project's version: kvtier.__version__ where no installed package metadata says it.
  m.attr("__version__") = KVTIER_VERSION;
  kvtier::python::BindIdentity(m);
  kvtier::python::BindLeases(m);
  kvtier::python::BindClient(m);
}
