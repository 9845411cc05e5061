// ember._C binding of scaled dot-product attention: DLPack objects in, one core call with the GIL released.
#include "attention_binding.h"

#include <string>

#include "dlpack_arg.h"
#include "ember/attention.h"
#include "tensor_args.h"

namespace py = pybind11;

namespace ember::binding {

void bind_attention(py::module_& m) {
  m.def("attention_implementation", []() { return std::string(isa_name(attention::implementation())); });
  m.def(
      "scaled_dot_product_attention",
      [](const TensorArg& q, const TensorArg& k, const TensorArg& v, const OptionalTensorArg& mask, bool causal,
         double scale, const TensorArg& out, double softcap) {
        constexpr const char* op = "scaled_dot_product_attention";
        const DLPackArg qa(q.ptr(), op, "q"), ka(k.ptr(), op, "k"), va(v.ptr(), op, "v"), oa(out.ptr(), op, "out");
        const auto ma = optional_arg(mask.ptr(), op, "mask");
        py::gil_scoped_release release;
        attention::scaled_dot_product(qa, ka, va, view_or_null(ma), causal, scale, oa, softcap);
      },
      py::arg("q"), py::arg("k"), py::arg("v"), py::arg("mask"), py::arg("causal"), py::arg("scale"), py::arg("out"),
      py::arg("softcap") = 0.0,
      "out = softmax(scale * q @ k^T + mask) @ v over [batch, heads, length, features] operands, float32 or bfloat16; "
      "softcap > 0 caps each scaled score at softcap * tanh(score / softcap) before the mask; "
      "mask float (added) or bool (True keeps), broadcasting; causal masks keys after each query; key/value heads "
      "shared by groups of query heads. See ember/attention.h.");
}

}  // namespace ember::binding
