// kvtier._native: Lease (a read lease: views of its blocks, their addresses, a
// gather into Hugging Face's layout, waits and releases on CUDA streams) and
// WriteLease (slots to write, committed by Client.commit).
#include <algorithm>
#include <cstring>

#include "bindings.h"

namespace kvtier::python {
namespace {

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

}  // namespace

void BindLeases(py::module_& m) {
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
            // capacity comes from the caller: every product is checked (2**51 + n rows once wrapped the size
            // to a small number that matched a small buffer, and the copy wrote past it).
            size_t want = 2 * size_t{count};
            for (const size_t f : {rows, size_t{p.kv_heads}, size_t{p.head_dim}, DTypeSize(p.dtype)}) {
              if (__builtin_mul_overflow(want, f, &want)) {
                throw py::value_error("gather: a capacity of " + std::to_string(rows) +
                                      " rows makes a buffer larger than memory can hold");
              }
            }
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
      .def_property_readonly(
          "fresh", [](const PyWriteLease& l) { return l.lease.fresh(); },
          "Whether its slots may still be written (a lease a save granted again: for half "
          "the lease timeout)")
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
}

}  // namespace kvtier::python
