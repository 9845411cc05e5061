#include "dlpack_owned.h"

#include <dlpack/dlpack.h>

#include <utility>

namespace py = pybind11;

namespace ember::binding {
namespace {

template <typename T>
struct Owner {
  std::vector<T> values;
  std::vector<int64_t> shape;
  // NOLINTNEXTLINE(bugprone-invalid-enum-default-initialization): make_capsule sets every field, device first
  DLManagedTensor managed{};
};

template <typename T>
DLDataType dl_type() {
  if constexpr (std::is_same_v<T, float>) {
    return {kDLFloat, 32, 1};
  } else if constexpr (std::is_same_v<T, double>) {
    return {kDLFloat, 64, 1};
  } else {
    return {kDLInt, 64, 1};
  }
}

template <typename T>
py::capsule make_capsule(std::vector<T>&& values, std::vector<int64_t> shape) {
  if (values.empty()) values.reserve(1);  // a non-null data pointer even for an empty tensor
  // NOLINTNEXTLINE(bugprone-invalid-enum-default-initialization): the fields are set below
  auto* owner = new Owner<T>{std::move(values), std::move(shape), {}};
  DLTensor& t = owner->managed.dl_tensor;
  t.data = owner->values.data();
  t.device = {kDLCPU, 0};
  t.ndim = static_cast<int32_t>(owner->shape.size());
  t.dtype = dl_type<T>();
  t.shape = owner->shape.data();
  t.strides = nullptr;  // contiguous
  t.byte_offset = 0;
  owner->managed.manager_ctx = owner;
  owner->managed.deleter = [](DLManagedTensor* self) { delete static_cast<Owner<T>*>(self->manager_ctx); };
  // A consumer renames the capsule "used_dltensor" and takes over the deleter; otherwise it is ours to call.
  return py::capsule(&owner->managed, "dltensor", [](PyObject* capsule) {
    if (PyCapsule_IsValid(capsule, "dltensor")) {
      auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, "dltensor"));
      managed->deleter(managed);
    }
  });
}

}  // namespace

py::capsule owned_dlpack(std::vector<int64_t>&& values, std::vector<int64_t> shape) {
  return make_capsule(std::move(values), std::move(shape));
}
py::capsule owned_dlpack(std::vector<float>&& values, std::vector<int64_t> shape) {
  return make_capsule(std::move(values), std::move(shape));
}
py::capsule owned_dlpack(std::vector<double>&& values, std::vector<int64_t> shape) {
  return make_capsule(std::move(values), std::move(shape));
}

}  // namespace ember::binding
