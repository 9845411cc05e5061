// ember._C bindings of the detection ops: DLPack objects in, one core call with the GIL released; nms's kept
// indices come back as a DLPack capsule that owns them.
#include "vision_binding.h"

#include <string>
#include <utility>
#include <vector>

#include "dlpack_arg.h"
#include "dlpack_owned.h"
#include "ember/vision.h"

namespace py = pybind11;

namespace ember::binding {

void bind_vision(py::module_& m) {
  m.def("nms_implementation", []() { return std::string(isa_name(vision::nms_implementation())); });
  m.def(
      "nms",
      [](py::handle boxes, py::handle scores, double iou_threshold) {
        const DLPackArg b(boxes.ptr(), "nms", "boxes"), s(scores.ptr(), "nms", "scores");
        std::vector<int64_t> keep;
        {
          py::gil_scoped_release release;
          keep = vision::nms(b, s, iou_threshold);
        }
        const auto n = static_cast<int64_t>(keep.size());
        return owned_dlpack(std::move(keep), {n});
      },
      py::arg("boxes"), py::arg("scores"), py::arg("iou_threshold"),
      "The kept indices, in decreasing score, as a DLPack capsule of int64.");
}

}  // namespace ember::binding
