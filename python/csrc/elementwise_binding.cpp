// ember._C binding of the elementwise product: DLPack objects in, one core call with the GIL released.
#include "elementwise_binding.h"

#include "dlpack_arg.h"
#include "ember/epilogue.h"
#include "tensor_args.h"

namespace py = pybind11;

namespace ember::binding {

void bind_elementwise(py::module_& m) {
  m.def(
      "multiply",
      [](const TensorArg& x, const TensorArg& factor, const TensorArg& out) {
        constexpr const char* op = "multiply";
        const DLPackArg xa(x.ptr(), op, "x"), fa(factor.ptr(), op, "factor"), oa(out.ptr(), op, "out");
        py::gil_scoped_release release;
        ember::multiply(xa, fa, oa);
      },
      py::arg("x"), py::arg("factor"), py::arg("out"),
      "out = x * factor elementwise, factor of x's sizes at any strides (a broadcast view); float32 or bfloat16, "
      "each product rounded once. See ember/epilogue.h.");
}

}  // namespace ember::binding
