// ember._C.TensorMarks: the check a graph-mode forward makes at its start, that every fused layer's tensors are
// still those its kernel was built from (python/ember/_optimize/graph/fast_calls.py, GraphGuard), made in one call.
//
// Why in C++: the check reads each tensor where it lives (its module's parameter or buffer registry) and compares it
// with the layer's mark (the tensor weakly referenced, its version counter, its data pointer). A ResNet-50 with its
// BatchNorms folded has 320 such tensors, MobileNetV3-L 312, and after a forward every object the check touches has
// left the caches: in Python it took 0.45-0.5 ms of ResNet-50's batch-1 forward on the 2-core Zen 5 (torch 1.13),
// here 0.28 ms (bound by those cache misses, not by the calls). Attribute names are interned once and the tensor's
// own methods called without a bound-method object; the registries are held (nn.Module makes each once, in its
// __init__, and never replaces it).
//
// The marks are what CachedKernel recorded (state.py's _marks); this object copies them when it is made and also
// keeps the tuple it copied them from: a layer whose cache has marked anything else since (its `_marks` is no
// longer that very tuple), or whose tensors differ from the copy, is reported, and Python's own comparison decides
// for it (and drops its kernel where the tensors changed). So this check can only send a layer to the slower,
// authoritative path; it never lets one through that the Python comparison would stop.
#include "tensor_marks_binding.h"

#include <pybind11/stl.h>

#include <cstdint>
#include <utility>
#include <vector>

namespace py = pybind11;

namespace ember::binding {
namespace {

/// Where one tensor of a layer lives, and what it was when the layer's kernel was built. A slot without a source
/// holds no tensor (a layer without a bias).
struct Slot {
  bool present = false;
  py::object parameters, buffers;  // the module's registries (nn.Module makes each once, in its __init__)
  py::str name;                    // the tensor's attribute name
  py::object ref;  // TensorRef: asked where the name is in neither registry (a property, a plain attribute)
  py::object weak = py::none();  // weakref.ref to the tensor marked (None: the slot was marked as holding none)
  int64_t version = 0;           // -1: an inference tensor, which has no version counter
  int64_t data_ptr = 0;
};

struct Layer {
  py::object cache;     // the layer's CachedKernel
  py::object marks;     // the tuple its `_marks` held when this was made
  bool aligned = true;  // one source per mark (else never taken as unchanged, as Python's comparison says)
  std::vector<Slot> slots;
};

class TensorMarks {
 public:
  /// Adds a layer: its CachedKernel and, aligned with the cache's marks, where each tensor lives: a TensorRef (its
  /// `owner` module and attribute `name`), or None for no tensor.
  void add(const py::object& cache, const std::vector<py::object>& refs) {
    Layer layer;
    layer.cache = cache;
    layer.marks = cache.attr("_marks");
    const auto marks = layer.marks.cast<py::tuple>();
    layer.aligned = marks.size() == refs.size();
    for (size_t i = 0; layer.aligned && i < marks.size(); ++i) {
      Slot slot;
      const py::handle source = refs[i], mark = marks[i];
      if (!source.is_none()) {
        const py::object owner = source.attr("owner");
        slot.present = true;
        slot.parameters = owner.attr("_parameters");
        slot.buffers = owner.attr("_buffers");
        slot.name = source.attr("name");
        slot.ref = py::reinterpret_borrow<py::object>(source);
      }
      if (!mark.is_none()) {
        const auto fields = py::cast<py::tuple>(mark);
        slot.weak = fields[0];
        slot.version = fields[1].cast<int64_t>();
        slot.data_ptr = fields[2].cast<int64_t>();
      }
      layer.slots.push_back(std::move(slot));
    }
    layers_.push_back(std::move(layer));
  }

  /// The indices of the layers whose tensors may have changed (Python's comparison decides for them); every other
  /// layer's cache gets `checked = epoch`.
  std::vector<int64_t> check(int64_t epoch) {
    std::vector<int64_t> changed;
    const py::int_ stamp(epoch);
    for (size_t i = 0; i < layers_.size(); ++i) {
      const Layer& layer = layers_[i];
      bool same = false;
      try {
        same = unchanged(layer);
      } catch (const py::error_already_set&) {
        same = false;  // whatever failed, the Python comparison meets it again and says what it is
      }
      if (same && PyObject_SetAttr(layer.cache.ptr(), names().checked, stamp.ptr()) != 0) {
        PyErr_Clear();
        same = false;
      }
      if (!same) {
        changed.push_back(static_cast<int64_t>(i));
      }
    }
    return changed;
  }

  size_t size() const { return layers_.size(); }

  /// Visits every Python object held (the garbage collector's tp_traverse).
  int traverse(visitproc visit, void* arg) const {
    for (const Layer& layer : layers_) {
      Py_VISIT(layer.cache.ptr());
      Py_VISIT(layer.marks.ptr());
      for (const Slot& slot : layer.slots) {
        for (const py::object* held : {&slot.parameters, &slot.buffers, &slot.ref, &slot.weak}) Py_VISIT(held->ptr());
      }
    }
    return 0;
  }

  /// Drops every layer (the garbage collector's tp_clear, breaking a cycle through this object).
  void clear() { layers_.clear(); }

 private:
  static bool unchanged(const Layer& layer) {
    if (!layer.aligned) return false;
    const auto marks = py::reinterpret_steal<py::object>(PyObject_GetAttr(layer.cache.ptr(), names().marks));
    if (!marks) throw py::error_already_set();
    if (!marks.is(layer.marks)) return false;
    for (const Slot& slot : layer.slots) {
      const py::object tensor = current(slot);
      if (slot.weak.is_none() || tensor.is_none()) {
        if (!slot.weak.is_none() || !tensor.is_none()) return false;
        continue;
      }
      const auto marked = py::reinterpret_steal<py::object>(PyObject_CallNoArgs(slot.weak.ptr()));  // the weakref's
      if (!marked) throw py::error_already_set();
      if (!marked.is(tensor)) return false;
      if (integer(PyObject_CallMethodNoArgs(tensor.ptr(), names().data_ptr)) != slot.data_ptr) return false;
      if (slot.version >= 0 && integer(PyObject_GetAttr(tensor.ptr(), names().version)) != slot.version) {
        return false;
      }
    }
    return true;
  }

  // A new reference to a Python int (null: the call before it failed) as an integer.
  static int64_t integer(PyObject* value) {
    if (value == nullptr) throw py::error_already_set();
    return py::reinterpret_steal<py::object>(value).cast<int64_t>();
  }

  // The attribute names as interned strings (a lookup then compares names by address), made once and never freed:
  // a static Python object would be released after the interpreter has finalized.
  struct Names {
    PyObject* marks = PyUnicode_InternFromString("_marks");
    PyObject* checked = PyUnicode_InternFromString("checked");
    PyObject* data_ptr = PyUnicode_InternFromString("data_ptr");
    PyObject* version = PyUnicode_InternFromString("_version");
  };
  static const Names& names() {
    static const Names* made = new Names();
    return *made;
  }

  // The tensor as common.py's parameter() reads it: the parameter registry, the buffer registry, else the ref.
  static py::object current(const Slot& slot) {
    if (!slot.present) return py::none();
    for (const py::object* entries : {&slot.parameters, &slot.buffers}) {
      PyObject* found = PyDict_GetItemWithError(entries->ptr(), slot.name.ptr());  // borrowed
      if (found != nullptr) return py::reinterpret_borrow<py::object>(found);
      if (PyErr_Occurred() != nullptr) throw py::error_already_set();
    }
    return slot.ref.attr("get")();
  }

  std::vector<Layer> layers_;
};

}  // namespace

void bind_tensor_marks(py::module_& m) {
  // The object holds the layers' caches and their tensors' sources, which can lead back to the model that holds it
  // (a parameter of the root module itself): the cyclic garbage collector must see those references, or a model
  // deleted with its graph would never be freed.
  const auto gc_aware = py::custom_type_setup([](PyHeapTypeObject* heap_type) {
    auto* type = &heap_type->ht_type;
    type->tp_flags |= Py_TPFLAGS_HAVE_GC;
    type->tp_traverse = [](PyObject* self, visitproc visit, void* arg) {
      Py_VISIT(Py_TYPE(self));
      if (py::detail::is_holder_constructed(self)) {
        return py::cast<TensorMarks&>(py::handle(self)).traverse(visit, arg);
      }
      return 0;
    };
    type->tp_clear = [](PyObject* self) {
      if (py::detail::is_holder_constructed(self)) py::cast<TensorMarks&>(py::handle(self)).clear();
      return 0;
    };
  });
  py::class_<TensorMarks>(m, "TensorMarks",
                          "The tensors every fused layer of a graph was built from, checked in one call "
                          "(GraphGuard): add(cache, refs) per layer, then check(epoch) on each forward.",
                          gc_aware)
      .def(py::init<>())
      .def("add", &TensorMarks::add, py::arg("cache"), py::arg("refs"))
      .def("check", &TensorMarks::check, py::arg("epoch"))
      .def("__len__", &TensorMarks::size);
}

}  // namespace ember::binding
