// ember._C binding of the rotary position embedding: DLPack objects in, one core call with the GIL released.
#include "rope_binding.h"

#include <string>

#include "dlpack_arg.h"
#include "ember/rope.h"
#include "tensor_args.h"

namespace py = pybind11;

namespace ember::binding {

void bind_rope(py::module_& m) {
  m.def("rotary_embedding_implementation", []() { return std::string(isa_name(rope::implementation())); });
  m.def(
      "rotary_embedding",
      [](const TensorArg& x, const TensorArg& cos, const TensorArg& sin, const TensorArg& out) {
        constexpr const char* op = "rotary_embedding";
        const DLPackArg xa(x.ptr(), op, "x"), ca(cos.ptr(), op, "cos"), sa(sin.ptr(), op, "sin"),
            oa(out.ptr(), op, "out");
        py::gil_scoped_release release;
        rope::rotate_half(xa, ca, sa, oa);
      },
      py::arg("x"), py::arg("cos"), py::arg("sin"), py::arg("out"),
      "out = x * cos + rotate_half(x) * sin over [batch, heads, length, features] x (features even), cos and sin "
      "broadcasting to it; float32 or bfloat16. See ember/rope.h.");
}

}  // namespace ember::binding
