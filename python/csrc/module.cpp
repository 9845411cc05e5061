// ember._C: the pybind11 binding of the ember core. It converts arguments (DLPack objects to TensorViews,
// strings to enums), releases the GIL around kernels, and translates exceptions. Nothing else: torch semantics
// (allocating outputs, autograd, dtype policy) live in python/ember.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <pybind11/typing.h>

#include <string>
#include <tuple>
#include <vector>

#include <oneapi/dnnl/dnnl.hpp>

#include "attention_binding.h"
#include "dlpack_arg.h"
#include "elementwise_binding.h"
#include "embedding_binding.h"
#include "ember/ember.h"
#include "errors.h"
#include "interaction_binding.h"
#include "kv_cache_binding.h"
#include "norm_binding.h"
#include "onednn_binding.h"
#include "optim_binding.h"
#include "pool_binding.h"
#include "replay_binding.h"
#include "rope_binding.h"
#include "tensor_args.h"
#include "tensor_marks_binding.h"
#include "vision_binding.h"

namespace py = pybind11;

namespace ember::binding {
namespace {

Isa isa_from_name(const std::string& name) {
  const auto isa = parse_isa(name);
  EMBER_CHECK(isa.has_value(), ValueError, "set_max_isa: isa must be one of ref, avx2, avx512, avx512_bf16, amx, ",
              "native; got '", name, "'");
  return *isa;
}

bf16::Op bf16_op_from_name(const std::string& name) {
  for (bf16::Op op : {bf16::Op::split, bf16::Op::join, bf16::Op::round}) {
    if (name == bf16::op_name(op)) return op;
  }
  throw ValueError("bf16_implementation: op must be 'split', 'join' or 'round', got '" + name + "'");
}

// Typed for the stubs: a dict of str keys (values str or bool), a tuple of shapes.
using StrDict = py::typing::Dict<py::str, py::object>;
using Shape = py::typing::Tuple<py::int_, py::ellipsis>;

StrDict cpu_features_dict() {
  const CpuFeatures& f = cpu_features();
  StrDict d;
  d["vendor"] = f.vendor;
  d["brand"] = f.brand;
  d["avx2"] = f.avx2;
  d["fma"] = f.fma;
  d["f16c"] = f.f16c;
  d["avx512f"] = f.avx512f;
  d["avx512bw"] = f.avx512bw;
  d["avx512vl"] = f.avx512vl;
  d["avx512dq"] = f.avx512dq;
  d["avx512_vnni"] = f.avx512_vnni;
  d["avx512_bf16"] = f.avx512_bf16;
  d["avx512_fp16"] = f.avx512_fp16;
  d["amx_tile"] = f.amx_tile;
  d["amx_bf16"] = f.amx_bf16;
  d["amx_int8"] = f.amx_int8;
  d["amx_permitted"] = f.amx_permitted;
  return d;
}

std::tuple<std::string, Shape, Shape, uintptr_t, bool> describe_tensor(const TensorArg& obj) {
  const DLPackArg arg(obj.ptr(), "describe_tensor", "obj");
  const TensorView& v = arg.view();
  Shape sizes(v.ndim()), strides(v.ndim());
  for (int d = 0; d < v.ndim(); ++d) {
    sizes[d] = v.size(d);
    strides[d] = v.stride(d);
  }
  return {std::string(dtype_name(v.dtype())), sizes, strides, reinterpret_cast<uintptr_t>(v.data()), v.is_contiguous()};
}

// Converts every argument and drops it: the cost of the DLPack boundary alone, for benchmarks/bench_dlpack.py.
size_t convert_tensors(const py::Args<TensorArg>& args) {
  for (py::handle obj : args) {
    const DLPackArg arg(obj.ptr(), "convert_tensors", "argument");
  }
  return args.size();
}

}  // namespace
}  // namespace ember::binding

PYBIND11_MODULE(_C, m) {
  using namespace ember;
  using namespace ember::binding;
  m.doc() = "ember._C: the pybind11 binding of ember's C++ core (stubs: ember/_C.pyi, made by scripts/stubs.sh)";
  register_exception_translators();

  // --- bf16 conversion. Outputs are allocated by the caller (python/ember/bf16.py).
  m.def(
      "bf16_split",
      [](const TensorArg& x, const TensorArg& top, const TensorArg& bottom) {
        const DLPackArg s(x.ptr(), "bf16.split", "x"), t(top.ptr(), "bf16.split", "top"),
            b(bottom.ptr(), "bf16.split", "bottom");
        py::gil_scoped_release release;
        bf16::split(s, t, b);
      },
      py::arg("x"), py::arg("top"), py::arg("bottom"));
  m.def(
      "bf16_join",
      [](const TensorArg& top, const TensorArg& bottom, const TensorArg& out) {
        const DLPackArg t(top.ptr(), "bf16.join", "top"), b(bottom.ptr(), "bf16.join", "bottom"),
            d(out.ptr(), "bf16.join", "out");
        py::gil_scoped_release release;
        bf16::join(t, b, d);
      },
      py::arg("top"), py::arg("bottom"), py::arg("out"));
  m.def(
      "bf16_round",
      [](const TensorArg& x, const TensorArg& out) {
        const DLPackArg s(x.ptr(), "bf16.round", "x"), d(out.ptr(), "bf16.round", "out");
        py::gil_scoped_release release;
        bf16::round(s, d);
      },
      py::arg("x"), py::arg("out"));
  m.def(
      "bf16_implementation",
      [](const std::string& op) { return std::string(isa_name(bf16::implementation(bf16_op_from_name(op)))); },
      py::arg("op"));

  // --- dropout (python/ember/nn/dropout.py). `out` is allocated by the caller, or is `x` itself (in place).
  m.def(
      "dropout",
      [](const TensorArg& x, const TensorArg& out, double p, uint64_t seed) {
        const DLPackArg s(x.ptr(), "dropout", "x"), d(out.ptr(), "dropout", "out");
        py::gil_scoped_release release;
        dropout::apply(s, d, p, seed);
      },
      py::arg("x"), py::arg("out"), py::arg("p"), py::arg("seed"));
  m.def("dropout_implementation", [] { return std::string(isa_name(dropout::implementation())); });

  // --- exception translation, for tests: raises the C++ exception named by `kind` from inside the binding.
  m.def(
      "_raise_error",
      [](const std::string& kind, const std::string& message) {
        if (kind == "type") throw ember::TypeError(message);
        if (kind == "value") throw ember::ValueError(message);
        if (kind == "index") throw ember::IndexError(message);
        if (kind == "runtime") throw ember::RuntimeError(message);
        // dnnl::error keeps the pointer it is given, not a copy: oneDNN passes literals, and so does this.
        if (kind == "dnnl") throw dnnl::error(dnnl_invalid_arguments, "could not create a primitive descriptor");
        throw ember::ValueError("_raise_error: kind must be type, value, index, runtime or dnnl, got '" + kind + "'");
      },
      py::arg("kind"), py::arg("message"));

  // --- fused optimizer steps (python/ember/optim)
  bind_optim(m);

  // --- oneDNN layers (python/ember/_optimize/inference)
  bind_onednn(m);

  // --- merged embedding bags (python/ember/nn/embedding_bag.py)
  bind_embedding_bag(m);

  // --- DLRM's dot interaction (python/ember/nn/interaction.py)
  bind_interaction(m);

  // --- fixed-statistics normalisation (python/ember/nn/frozen_batch_norm.py)
  bind_norm(m);

  // --- scaled dot-product attention (python/ember/_optimize/graph/attention_node.py)
  bind_attention(m);

  // --- the paged key/value cache of text generation and the attention over it (python/ember/llm/)
  bind_kv_cache(m);

  // --- rotary position embedding (python/ember/_optimize/graph/rope_node.py)
  bind_rope(m);
  // --- max pooling (python/ember/nn/pooling.py, python/ember/_optimize/graph/pool_node.py)
  bind_pool(m);

  // --- the elementwise product of two tensors (python/ember/_optimize/graph/product_node.py)
  bind_elementwise(m);

  // --- kernel calls recorded and replayed (python/ember/_optimize/graph/replay.py)
  bind_replay(m);

  // --- the graph guard's check of every fused layer's tensors (python/ember/_optimize/graph/fast_calls.py)
  bind_tensor_marks(m);

  // --- detection ops (python/ember/nn/vision.py)
  bind_vision(m);

  // --- the DLPack boundary itself
  m.def("describe_tensor", &describe_tensor, py::arg("obj"));
  m.def("convert_tensors", &convert_tensors);

  // --- CPU features and ISA dispatch
  m.def("cpu_features", &cpu_features_dict);
  m.def("detected_isa", [] { return std::string(isa_name(detected_isa())); });
  m.def("active_isa", [] { return std::string(isa_name(active_isa())); });
  m.def("max_isa", [] { return std::string(isa_name(max_isa())); });
  m.def("set_max_isa", [](const std::string& name) { set_max_isa(isa_from_name(name)); }, py::arg("isa"));
  m.def("isa_levels", [] {
    std::vector<std::string> names;
    for (Isa isa : kAllIsas) names.emplace_back(isa_name(isa));
    return names;
  });
  m.def("verbose", &verbose);
  m.def("set_verbose", &set_verbose, py::arg("on"));

  // --- threading
  m.def("num_threads", &num_threads);
  m.def("set_num_threads", &set_num_threads, py::arg("n"));
  m.def("threading_backend", [] { return std::string(threading_backend_name(threading_backend())); });
  m.def(
      "set_threading_backend",
      [](const std::string& name) {
        EMBER_CHECK(name == "tbb" || name == "openmp", ValueError,
                    "set_threading_backend: backend must be 'tbb' or 'openmp', got '", name, "'");
        set_threading_backend(name == "tbb" ? ThreadingBackend::tbb : ThreadingBackend::openmp);
      },
      py::arg("backend"));
  m.def("openmp_available", &openmp_available);

  // --- thread placement (the runtime's CPU pools)
  py::class_<ThreadPin>(m, "ThreadPin").def_property_readonly("cpus", &ThreadPin::cpus);
  m.def("thread_affinity", &thread_affinity);
  m.def("process_cpus", &process_cpus);
  m.def("set_thread_affinity", &set_thread_affinity, py::arg("cpus"));
  // These keep the GIL (they take microseconds): a daemon thread that re-acquires the GIL after the interpreter
  // began to shut down is ended by pthread_exit, whose unwinding through gil_scoped_release's noexcept destructor
  // would abort the process.
  m.def("team_affinity", &team_affinity, py::arg("threads"));
  m.def("pin_thread", &pin_thread, py::arg("cpus"));
  m.def("unpin_thread", &unpin_thread, py::arg("pin"));
  m.def("pinned_cpus", &pinned_cpus);

  // --- streaming stores
  m.def("last_level_cache_bytes", &last_level_cache_bytes);
  m.def("stream_threshold_bytes", &stream_threshold_bytes);
  m.def("set_stream_threshold_bytes", &set_stream_threshold_bytes, py::arg("bytes"));

  // --- configuration
  m.def("build_info", [] {
    const BuildInfo b = build_info();
    StrDict d;
    d["version"] = b.version;
    d["build_type"] = b.build_type;
    d["compiler"] = b.compiler;
    d["openmp"] = b.openmp;
    return d;
  });
  m.def("onednn_info", [] {
    const OneDnnInfo o = onednn_info();
    StrDict d;
    d["version"] = std::to_string(o.major) + "." + std::to_string(o.minor) + "." + std::to_string(o.patch);
    d["commit"] = o.commit;
    d["cpu_runtime"] = o.cpu_runtime;
    d["cpu_isa"] = o.cpu_isa;
    return d;
  });
  m.def("tbb_version", &tbb_version);
}
