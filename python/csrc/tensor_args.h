// The Python types of the binding's tensor arguments, for its signatures: each is any Python object as far as
// pybind11's conversion goes (DLPackArg checks what it really is and names the argument when it is not a tensor),
// but carries the name that pybind11-stubgen writes into ember/_C.pyi, so the stubs type tensors as tensors:
// ember._tensor.DLPackTensor, a torch.Tensor or its DLPack capsule (what ember._tensor.dlpack returns).
#pragma once

#include <Python.h>
#include <pybind11/pybind11.h>

namespace ember::binding {

inline bool is_any_object(PyObject* /*obj*/) { return true; }
inline bool is_sequence(PyObject* obj) { return PySequence_Check(obj) != 0; }

/// One tensor argument.
class TensorArg : public pybind11::object {
 public:
  PYBIND11_OBJECT_DEFAULT(TensorArg, pybind11::object, is_any_object)
};

/// A tensor argument that may be None.
class OptionalTensorArg : public pybind11::object {
 public:
  PYBIND11_OBJECT_DEFAULT(OptionalTensorArg, pybind11::object, is_any_object)
};

/// A list of tensors.
class TensorListArg : public pybind11::sequence {
 public:
  PYBIND11_OBJECT_DEFAULT(TensorListArg, pybind11::sequence, is_sequence)
};

/// A list of tensors whose entries may be None.
class OptionalTensorListArg : public pybind11::sequence {
 public:
  PYBIND11_OBJECT_DEFAULT(OptionalTensorListArg, pybind11::sequence, is_sequence)
};

}  // namespace ember::binding

namespace pybind11::detail {

template <>
struct handle_type_name<ember::binding::TensorArg> {
  static constexpr auto name = const_name("ember._tensor.DLPackTensor");
};
template <>
struct handle_type_name<ember::binding::OptionalTensorArg> {
  static constexpr auto name = const_name("ember._tensor.DLPackTensor | None");
};
template <>
struct handle_type_name<ember::binding::TensorListArg> {
  static constexpr auto name = const_name("collections.abc.Sequence[ember._tensor.DLPackTensor]");
};
template <>
struct handle_type_name<ember::binding::OptionalTensorListArg> {
  static constexpr auto name = const_name("collections.abc.Sequence[ember._tensor.DLPackTensor | None]");
};

}  // namespace pybind11::detail
