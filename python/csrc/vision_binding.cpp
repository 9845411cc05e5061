// ember._C bindings of the detection ops: DLPack objects in, one core call with the GIL released; nms's kept
// indices come back as a DLPack capsule that owns them.
#include "vision_binding.h"

#include <string>
#include <utility>
#include <vector>

#include "dlpack_arg.h"
#include "dlpack_owned.h"
#include "ember/vision.h"
#include "tensor_args.h"

namespace py = pybind11;

namespace ember::binding {

void bind_vision(py::module_& m) {
  m.def("nms_implementation", []() { return std::string(isa_name(vision::nms_implementation())); });
  m.def(
      "nms",
      [](const TensorArg& boxes, const TensorArg& scores, double iou_threshold) {
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

  m.def("roi_align_implementation", []() { return std::string(isa_name(vision::roi_align_implementation())); });
  auto options = [](double spatial_scale, int64_t pooled_height, int64_t pooled_width, int64_t sampling_ratio,
                    bool aligned) {
    vision::RoiAlignOptions o;
    o.spatial_scale = spatial_scale;
    o.pooled_height = pooled_height;
    o.pooled_width = pooled_width;
    o.sampling_ratio = sampling_ratio;
    o.aligned = aligned;
    return o;
  };
  m.def(
      "roi_align_forward",
      [options](const TensorArg& input, const TensorArg& rois, const TensorArg& out, double spatial_scale,
                int64_t pooled_height, int64_t pooled_width, int64_t sampling_ratio, bool aligned) {
        const DLPackArg in(input.ptr(), "roi_align", "input"), r(rois.ptr(), "roi_align", "rois"),
            o(out.ptr(), "roi_align", "out");
        const auto opts = options(spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned);
        py::gil_scoped_release release;
        vision::roi_align_forward(in, r, opts, o);
      },
      py::arg("input"), py::arg("rois"), py::arg("out"), py::kw_only(), py::arg("spatial_scale"),
      py::arg("pooled_height"), py::arg("pooled_width"), py::arg("sampling_ratio"), py::arg("aligned"));
  m.def(
      "roi_align_backward",
      [options](const TensorArg& grad_out, const TensorArg& rois, const TensorArg& grad_input, double spatial_scale,
                int64_t pooled_height, int64_t pooled_width, int64_t sampling_ratio, bool aligned) {
        const DLPackArg g(grad_out.ptr(), "roi_align", "grad_out"), r(rois.ptr(), "roi_align", "rois"),
            o(grad_input.ptr(), "roi_align", "grad_input");
        const auto opts = options(spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned);
        py::gil_scoped_release release;
        vision::roi_align_backward(g, r, opts, o);
      },
      py::arg("grad_out"), py::arg("rois"), py::arg("grad_input"), py::kw_only(), py::arg("spatial_scale"),
      py::arg("pooled_height"), py::arg("pooled_width"), py::arg("sampling_ratio"), py::arg("aligned"));
}

}  // namespace ember::binding
