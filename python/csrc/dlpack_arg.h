// Turning a Python object into a core TensorView through DLPack: the one place where ember checks what a tensor
// argument is (a DLPack capsule, or an object with __dlpack__, on the CPU, of a dtype the core knows).
#pragma once

#include <Python.h>

#include <optional>
#include <string_view>

#include "ember/tensor_view.h"

namespace ember::binding {

/// A borrowed view of one tensor argument. Holds a reference to the DLPack capsule, so the producer keeps the
/// memory alive until this object dies; create and destroy it with the GIL held.
class DLPackArg {
 public:
  /// Accepts a "dltensor" PyCapsule (e.g. torch.utils.dlpack.to_dlpack(t)) or any object with __dlpack__
  /// (torch tensors, numpy arrays). Throws ember::TypeError / ValueError naming `op` and `arg` when the object
  /// is not a CPU tensor of a supported dtype.
  DLPackArg(PyObject* obj, std::string_view op, std::string_view arg) : DLPackArg(obj, op, arg, -1) {}
  /// The same for element `index` of a list argument: messages name it "arg[index]".
  DLPackArg(PyObject* obj, std::string_view op, std::string_view arg, long index);
  ~DLPackArg() { Py_XDECREF(capsule_); }
  DLPackArg(const DLPackArg&) = delete;
  DLPackArg& operator=(const DLPackArg&) = delete;
  DLPackArg(DLPackArg&& other) noexcept : capsule_(other.capsule_), view_(other.view_) { other.capsule_ = nullptr; }

  const TensorView& view() const noexcept { return view_; }
  operator const TensorView&() const noexcept { return view_; }  // NOLINT(google-explicit-constructor)

 private:
  static TensorView describe(PyObject* capsule, std::string_view op, std::string_view list, long index);

  PyObject* capsule_ = nullptr;
  TensorView view_;
};

/// An argument that may be None: nullopt for None, else the DLPackArg of the object.
inline std::optional<DLPackArg> optional_arg(PyObject* obj, std::string_view op, std::string_view arg) {
  std::optional<DLPackArg> out;
  if (obj != Py_None) out.emplace(obj, op, arg);
  return out;
}

/// The view of an optional argument, or null: the core's spelling of "absent".
inline const TensorView* view_or_null(const std::optional<DLPackArg>& arg) { return arg ? &arg->view() : nullptr; }

}  // namespace ember::binding
