#include "ember/tensor_view.h"

#include <algorithm>

#include "ember/errors.h"

namespace ember {

size_t dtype_size(DType dtype) noexcept {
  switch (dtype) {
    case DType::f32:
    case DType::i32: return 4;
    case DType::bf16:
    case DType::f16:
    case DType::i16: return 2;
    case DType::i8:
    case DType::u8: return 1;
    case DType::i64:
    case DType::f64: return 8;
    case DType::boolean: return 1;
  }
  return 0;
}

std::string_view dtype_name(DType dtype) noexcept {
  switch (dtype) {
    case DType::f32: return "float32";
    case DType::bf16: return "bfloat16";
    case DType::f16: return "float16";
    case DType::i8: return "int8";
    case DType::u8: return "uint8";
    case DType::i16: return "int16";
    case DType::i32: return "int32";
    case DType::i64: return "int64";
    case DType::f64: return "float64";
    case DType::boolean: return "bool";
  }
  return "?";
}

TensorView::TensorView(void* data, DType dtype, const int64_t* sizes, const int64_t* strides, int ndim)
    : data_(data), dtype_(dtype), ndim_(ndim) {
  EMBER_CHECK(ndim >= 0 && ndim <= kMaxDims, ValueError, "TensorView: ndim must be in [0, ", kMaxDims, "], got ", ndim);
  for (int d = 0; d < ndim; ++d) {
    EMBER_CHECK(sizes[d] >= 0, ValueError, "TensorView: size of dimension ", d, " must be >= 0, got ", sizes[d]);
    sizes_[d] = sizes[d];
    strides_[d] = strides[d];
    numel_ *= sizes[d];
  }
}

TensorView::TensorView(void* data, DType dtype, std::initializer_list<int64_t> sizes) : data_(data), dtype_(dtype) {
  EMBER_CHECK(sizes.size() <= static_cast<size_t>(kMaxDims), ValueError, "TensorView: at most ", kMaxDims,
              " dimensions, got ", sizes.size());
  ndim_ = static_cast<int>(sizes.size());
  std::copy(sizes.begin(), sizes.end(), sizes_.begin());
  int64_t stride = 1;
  for (int d = ndim_ - 1; d >= 0; --d) {
    EMBER_CHECK(sizes_[d] >= 0, ValueError, "TensorView: size of dimension ", d, " must be >= 0, got ", sizes_[d]);
    strides_[d] = stride;
    stride *= sizes_[d];
  }
  numel_ = stride;
}

bool TensorView::is_contiguous() const noexcept {
  if (numel_ == 0) return true;
  int64_t expected = 1;
  for (int d = ndim_ - 1; d >= 0; --d) {
    if (sizes_[d] == 1) continue;
    if (strides_[d] != expected) return false;
    expected *= sizes_[d];
  }
  return true;
}

namespace {
// Byte range [first, last) that a view can touch.
std::pair<uintptr_t, uintptr_t> byte_span(const TensorView& t) {
  const auto base = reinterpret_cast<uintptr_t>(t.data());
  const auto elem = static_cast<int64_t>(dtype_size(t.dtype()));
  int64_t lo = 0, hi = 0;
  for (int d = 0; d < t.ndim(); ++d) {
    const int64_t extent = (t.size(d) - 1) * t.stride(d);
    (extent < 0 ? lo : hi) += extent;
  }
  return {base + lo * elem, base + hi * elem + elem};
}
}  // namespace

bool TensorView::overlaps(const TensorView& other) const noexcept {
  if (numel_ == 0 || other.numel_ == 0) return false;
  const auto [a0, a1] = byte_span(*this);
  const auto [b0, b1] = byte_span(other);
  return a0 < b1 && b0 < a1;
}

std::string TensorView::describe() const {
  std::string out(dtype_name(dtype_));
  out += '[';
  for (int d = 0; d < ndim_; ++d) {
    if (d) out += ", ";
    out += std::to_string(sizes_[d]);
  }
  out += ']';
  return out;
}

namespace check {

void dtype(std::string_view op, std::string_view arg, const TensorView& t, DType expected) {
  EMBER_CHECK(t.dtype() == expected, TypeError, op, ": ", arg, " must have dtype ", dtype_name(expected), ", got ",
              dtype_name(t.dtype()));
}

void contiguous(std::string_view op, std::string_view arg, const TensorView& t) {
  EMBER_CHECK(t.is_contiguous(), ValueError, op, ": ", arg, " must be contiguous, got a ", t.describe(),
              " view with other strides");
}

void same_shape(std::string_view op, std::string_view arg, const TensorView& t, std::string_view ref_arg,
                const TensorView& ref) {
  bool same = t.ndim() == ref.ndim();
  for (int d = 0; same && d < t.ndim(); ++d) same = t.size(d) == ref.size(d);
  EMBER_CHECK(same, ValueError, op, ": ", arg, " must have the shape of ", ref_arg, " (", ref.describe(), "), got ",
              t.describe());
}

void no_overlap(std::string_view op, std::string_view out_arg, const TensorView& out, std::string_view other_arg,
                const TensorView& other) {
  EMBER_CHECK(!out.overlaps(other), ValueError, op, ": ", out_arg, " must not share memory with ", other_arg);
}

}  // namespace check
}  // namespace ember
