// ember._C binding of max pooling: DLPack objects in, the window as (height, width) pairs, one core call with the GIL
// released.
#include "pool_binding.h"

#include <pybind11/stl.h>

#include <array>
#include <string>

#include "dlpack_arg.h"
#include "ember/pool.h"
#include "tensor_args.h"

namespace py = pybind11;

namespace ember::binding {

void bind_pool(py::module_& m) {
  using Pair = std::array<int64_t, 2>;
  m.def("max_pool2d_implementation", []() { return std::string(isa_name(pool::implementation())); });
  m.def(
      "max_pool2d_output_size",
      [](int64_t input, int64_t kernel, int64_t stride, int64_t padding, int64_t dilation, bool ceil_mode) {
        return pool::output_size(input, kernel, stride, padding, dilation, ceil_mode);
      },
      py::arg("input"), py::arg("kernel"), py::arg("stride"), py::arg("padding"), py::arg("dilation"),
      py::arg("ceil_mode"), "torch's output size of max_pool2d along one spatial dimension. See ember/pool.h.");
  m.def(
      "max_pool2d",
      [](const TensorArg& x, const Pair& kernel, const Pair& stride, const Pair& padding, const Pair& dilation,
         bool ceil_mode, bool relu, const TensorArg& out) {
        constexpr const char* op = "max_pool2d";
        const DLPackArg xa(x.ptr(), op, "x"), oa(out.ptr(), op, "out");
        pool::Window2d window;
        for (int d = 0; d < 2; ++d) {
          window.kernel[d] = kernel[d];
          window.stride[d] = stride[d];
          window.padding[d] = padding[d];
          window.dilation[d] = dilation[d];
        }
        window.ceil_mode = ceil_mode;
        py::gil_scoped_release release;
        pool::max_pool2d(xa, window, relu, oa);
      },
      py::arg("x"), py::arg("kernel"), py::arg("stride"), py::arg("padding"), py::arg("dilation"), py::arg("ceil_mode"),
      py::arg("relu"), py::arg("out"),
      "out = max_pool2d(x) over a channels-last [N, C, H, W] x (channels of stride 1), then max(out, 0) with relu "
      "(NaN kept); float32 or bfloat16. See ember/pool.h.");
}

}  // namespace ember::binding
