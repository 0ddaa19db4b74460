// kvtier._native: ModelIdentity, the identity of kvtier/model_identity.h.
#include "bindings.h"

namespace kvtier::python {

void BindIdentity(py::module_& m) {
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
}

}  // namespace kvtier::python
