#include "dlpack_arg.h"

#include <dlpack/dlpack.h>

#include "ember/errors.h"

namespace ember::binding {
namespace {

constexpr const char* kCapsuleName = "dltensor";
// kDLBool, added in DLPack 0.8; spelled out so the older headers of Debian 12 (0.6) build too.
constexpr int kDLBoolCode = 6;

const char* device_name(int device_type) {
  switch (device_type) {
    case kDLCPU: return "cpu";
    case kDLCUDA: return "cuda";
    case kDLCUDAHost: return "cuda_host";
    case kDLOpenCL: return "opencl";
    case kDLVulkan: return "vulkan";
    case kDLMetal: return "metal";
    case kDLROCM: return "rocm";
    default: return "other";
  }
}

bool to_dtype(const DLDataType& t, DType* out) {
  if (t.lanes != 1) return false;
  switch (t.code) {
    case kDLFloat:
      if (t.bits == 32) {
        *out = DType::f32;
        return true;
      }
      if (t.bits == 16) {
        *out = DType::f16;
        return true;
      }
      if (t.bits == 64) {
        *out = DType::f64;
        return true;
      }
      return false;
    case kDLBfloat:
      if (t.bits == 16) {
        *out = DType::bf16;
        return true;
      }
      return false;
    case kDLInt:
      switch (t.bits) {
        case 8: *out = DType::i8; return true;
        case 16: *out = DType::i16; return true;
        case 32: *out = DType::i32; return true;
        case 64: *out = DType::i64; return true;
        default: return false;
      }
    case kDLUInt:
      if (t.bits == 8) {
        *out = DType::u8;
        return true;
      }
      return false;
    case kDLBoolCode:
      if (t.bits == 8) {
        *out = DType::boolean;
        return true;
      }
      return false;
    default: return false;
  }
}

std::string type_name(PyObject* obj) { return Py_TYPE(obj)->tp_name; }

// Clears the pending Python exception and returns its str().
std::string take_error_message() {
#if PY_VERSION_HEX >= 0x030C0000
  PyObject* error = PyErr_GetRaisedException();
#else
  PyObject *type, *error, *trace;
  PyErr_Fetch(&type, &error, &trace);
  Py_XDECREF(type);
  Py_XDECREF(trace);
#endif
  PyObject* text = error != nullptr ? PyObject_Str(error) : nullptr;
  const char* utf8 = text != nullptr ? PyUnicode_AsUTF8(text) : nullptr;
  std::string reason = utf8 != nullptr ? utf8 : "unknown reason";
  Py_XDECREF(text);
  Py_XDECREF(error);
  PyErr_Clear();
  return reason;
}

// Returns a new reference to a "dltensor" capsule for `obj`, or throws.
PyObject* capsule_of(PyObject* obj, std::string_view op, const std::string& arg) {
  if (PyCapsule_CheckExact(obj)) {
    EMBER_CHECK(PyCapsule_IsValid(obj, kCapsuleName), ValueError, op, ": ", arg,
                " is a capsule that is not an unconsumed DLPack 'dltensor' (was it used already?)");
    Py_INCREF(obj);
    return obj;
  }
  static PyObject* dlpack_method = PyUnicode_InternFromString("__dlpack__");
  PyObject* capsule = PyObject_CallMethodNoArgs(obj, dlpack_method);
  if (capsule == nullptr) {
    if (!PyErr_ExceptionMatches(PyExc_AttributeError)) {
      // The producer refused (e.g. torch: a tensor that requires grad). Keep its reason in the message.
      const std::string reason = take_error_message();
      throw ValueError(detail::concat(op, ": ", arg, " could not be exported through DLPack: ", reason));
    }
    PyErr_Clear();
    throw TypeError(
        detail::concat(op, ": ", arg, " must be a tensor (an object supporting DLPack), got ", type_name(obj)));
  }
  if (!PyCapsule_IsValid(capsule, kCapsuleName)) {
    Py_DECREF(capsule);
    throw TypeError(detail::concat(op, ": ", arg, ".__dlpack__() returned something other than a 'dltensor' capsule"));
  }
  return capsule;
}

std::string arg_name(std::string_view arg, long index) {
  std::string name(arg);
  if (index >= 0) name += "[" + std::to_string(index) + "]";
  return name;
}

}  // namespace

DLPackArg::DLPackArg(PyObject* obj, std::string_view op, std::string_view arg, long index) {
  if (PyCapsule_CheckExact(obj) && PyCapsule_IsValid(obj, kCapsuleName)) {
    // The common case (ember's Python layer passes capsules): no name is built unless a check fails.
    Py_INCREF(obj);
    capsule_ = obj;
  } else {
    capsule_ = capsule_of(obj, op, arg_name(arg, index));
  }
  try {
    view_ = describe(capsule_, op, arg, index);
  } catch (...) {
    Py_CLEAR(capsule_);
    throw;
  }
}

TensorView DLPackArg::describe(PyObject* capsule, std::string_view op, std::string_view list, long index) {
  const auto* managed = static_cast<const DLManagedTensor*>(PyCapsule_GetPointer(capsule, kCapsuleName));
  const DLTensor& t = managed->dl_tensor;
  EMBER_CHECK(t.device.device_type == kDLCPU, ValueError, op, ": ", arg_name(list, index),
              " must be a CPU tensor, got a ", device_name(t.device.device_type), " tensor");
  DType dtype{};
  EMBER_CHECK(to_dtype(t.dtype, &dtype), TypeError, op, ": ", arg_name(list, index),
              " has a dtype ember does not support (DLPack code ", static_cast<int>(t.dtype.code), ", ",
              static_cast<int>(t.dtype.bits), " bits, ", t.dtype.lanes,
              " lanes); expected float32, bfloat16, float16, float64, int8, uint8, int16, int32, int64 or bool");
  EMBER_CHECK(t.ndim >= 0 && t.ndim <= kMaxDims, ValueError, op, ": ", arg_name(list, index), " must have at most ",
              kMaxDims, " dimensions, got ", t.ndim);
  int64_t contiguous_strides[kMaxDims];
  const int64_t* strides = t.strides;
  if (strides == nullptr) {  // DLPack: NULL strides mean compact row-major
    int64_t stride = 1;
    for (int d = t.ndim - 1; d >= 0; --d) {
      contiguous_strides[d] = stride;
      stride *= t.shape[d];
    }
    strides = contiguous_strides;
  }
  void* data = static_cast<char*>(t.data) + t.byte_offset;
  return TensorView(data, dtype, t.shape, strides, t.ndim);
}

}  // namespace ember::binding
