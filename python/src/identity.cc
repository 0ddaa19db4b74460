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
  m.def(
      "model_settings_text",
      [](std::string model_type, std::string hidden_act, std::optional<double> rms_norm_eps,
         std::optional<double> layer_norm_eps, std::optional<double> rope_theta, std::optional<std::string> rope_type,
         std::optional<int64_t> sliding_window) {
        return ModelSettingsText({.model_type = std::move(model_type),
                                  .hidden_act = std::move(hidden_act),
                                  .rms_norm_eps = rms_norm_eps,
                                  .layer_norm_eps = layer_norm_eps,
                                  .rope_theta = rope_theta,
                                  .rope_type = std::move(rope_type),
                                  .sliding_window = sliding_window});
      },
      py::arg("model_type"), py::kw_only(), py::arg("hidden_act") = "silu", py::arg("rms_norm_eps") = py::none(),
      py::arg("layer_norm_eps") = py::none(), py::arg("rope_theta") = py::none(), py::arg("rope_type") = py::none(),
      py::arg("sliding_window") = py::none(),
      "The architecture settings of a model identity as add_config takes them (kvtier/model_identity.h, "
      "ModelSettingsText, which kvtier-worker calls too): a None field is a setting the model does not have");
}

}  // namespace kvtier::python
