// ember._C binding of max and average pooling: DLPack objects in, the window as (height, width) pairs, one core call
// with the GIL released.
#include "pool_binding.h"

#include <pybind11/stl.h>

#include <array>
#include <string>

#include "dlpack_arg.h"
#include "ember/pool.h"
#include "tensor_args.h"

namespace py = pybind11;

namespace ember::binding {

using Pair = std::array<int64_t, 2>;

pool::Window2d pool_window(const Pair& kernel, const Pair& stride, const Pair& padding, const Pair& dilation,
                           bool ceil_mode) {
  pool::Window2d window;
  for (size_t d = 0; d < 2; ++d) {
    window.kernel[d] = kernel[d];
    window.stride[d] = stride[d];
    window.padding[d] = padding[d];
    window.dilation[d] = dilation[d];
  }
  window.ceil_mode = ceil_mode;
  return window;
}

void bind_pool(py::module_& m) {
  m.def("max_pool2d_implementation", []() { return std::string(isa_name(pool::implementation())); });
  m.def(
      "max_pool2d",
      [](const TensorArg& x, const Pair& kernel, const Pair& stride, const Pair& padding, const Pair& dilation,
         bool ceil_mode, bool relu, const TensorArg& out) {
        constexpr const char* op = "max_pool2d";
        const DLPackArg xa(x.ptr(), op, "x"), oa(out.ptr(), op, "out");
        const pool::Window2d window = pool_window(kernel, stride, padding, dilation, ceil_mode);
        py::gil_scoped_release release;
        pool::max_pool2d(xa, window, relu, oa);
      },
      py::arg("x"), py::arg("kernel"), py::arg("stride"), py::arg("padding"), py::arg("dilation"), py::arg("ceil_mode"),
      py::arg("relu"), py::arg("out"),
      "out = max_pool2d(x) over a channels-last [N, C, H, W] x (channels of stride 1), then max(out, 0) with relu "
      "(NaN kept); float32 or bfloat16. See ember/pool.h.");
  m.def(
      "avg_pool2d",
      [](const TensorArg& x, const Pair& kernel, const Pair& stride, const Pair& padding, bool ceil_mode,
         bool count_include_pad, int64_t divisor_override, const TensorArg& out) {
        constexpr const char* op = "avg_pool2d";
        const DLPackArg xa(x.ptr(), op, "x"), oa(out.ptr(), op, "out");
        const pool::Window2d window = pool_window(kernel, stride, padding, {1, 1}, ceil_mode);
        py::gil_scoped_release release;
        pool::avg_pool2d(xa, window, count_include_pad, divisor_override, oa);
      },
      py::arg("x"), py::arg("kernel"), py::arg("stride"), py::arg("padding"), py::arg("ceil_mode"),
      py::arg("count_include_pad"), py::arg("divisor_override"), py::arg("out"),
      "out = avg_pool2d(x) over a channels-last [N, C, H, W] x (channels of stride 1), torch's divisors "
      "(divisor_override 0 for none); float32 or bfloat16. See ember/pool.h.");
}

}  // namespace ember::binding
