#include "ember/tensor_view.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

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

bool TensorView::is_dense() const noexcept {
  if (numel_ == 0) return true;
  std::array<std::pair<int64_t, int64_t>, kMaxDims> dims{};  // (stride, size) of the dimensions of size > 1
  int count = 0;
  for (int d = 0; d < ndim_; ++d) {
    if (sizes_[d] != 1) dims[count++] = {strides_[d], sizes_[d]};
  }
  // Insertion sort by stride: at most kMaxDims entries (std::sort on the partial array trips GCC 12's
  // -Warray-bounds at -O3).
  for (int k = 1; k < count; ++k) {
    for (int j = k; j > 0 && dims[j] < dims[j - 1]; --j) std::swap(dims[j], dims[j - 1]);
  }
  int64_t expected = 1;
  for (int k = 0; k < count; ++k) {
    if (dims[k].first != expected) return false;
    expected *= dims[k].second;
  }
  return true;
}

bool TensorView::same_layout(const TensorView& other) const noexcept {
  if (ndim_ != other.ndim_) return false;
  for (int d = 0; d < ndim_; ++d) {
    if (sizes_[d] != other.sizes_[d]) return false;
    if (sizes_[d] != 1 && strides_[d] != other.strides_[d]) return false;
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

std::optional<TensorView> TensorView::as_matrix() const {
  if (ndim_ < 2) return std::nullopt;
  const int last = ndim_ - 1;
  int64_t rows = 1;
  for (int d = 0; d < last; ++d) rows *= sizes_[d];
  // The innermost leading dimension of size > 1 sets the row stride; each one further out must step over all of
  // those inside it. Size-1 dimensions address nothing and may have any stride.
  // A zero stride is a real stride (an expanded view), so "not found yet" is its own flag: taking 0 for "unset"
  // once read an expanded [M, K] input at row stride K, past the end of its one row.
  bool found = false;
  int64_t row_stride = 0, span = 0;
  for (int d = last - 1; d >= 0; --d) {
    if (sizes_[d] == 1) continue;
    if (!found) {
      found = true;
      row_stride = strides_[d];
      span = strides_[d] * sizes_[d];
    } else if (strides_[d] != span) {
      return std::nullopt;
    } else {
      span *= sizes_[d];
    }
  }
  if (!found) row_stride = std::max<int64_t>(sizes_[last], 1);  // one row (or none): any stride will do
  const int64_t sizes[2] = {rows, sizes_[last]}, strides[2] = {row_stride, strides_[last]};
  return TensorView(data_, dtype_, sizes, strides, 2);
}

bool TensorView::overlaps(const TensorView& other) const noexcept {
  if (numel_ == 0 || other.numel_ == 0) return false;
  const auto [a0, a1] = byte_span(*this);
  const auto [b0, b1] = byte_span(other);
  return a0 < b1 && b0 < a1;
}

int64_t TensorView::byte_extent() const noexcept {
  if (numel_ == 0) return 0;
  int64_t last = 0;
  for (int d = 0; d < ndim_; ++d) {
    if (strides_[d] < 0 && sizes_[d] > 1) return -1;
    last += (sizes_[d] - 1) * strides_[d];
  }
  return (last + 1) * static_cast<int64_t>(dtype_size(dtype_));
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

std::string Name::str() const {
  std::string out(list_);
  if (index_ >= 0) out.append("[").append(std::to_string(index_)).append("]");
  return out;
}

void finite_at_least(std::string_view op, std::string_view arg, double value, double low) {
  EMBER_CHECK(std::isfinite(value), ValueError, op, ": ", arg, " must be finite, got ", value);
  EMBER_CHECK(value >= low, ValueError, op, ": ", arg, " must be >= ", low, ", got ", value);
}

void dtype(std::string_view op, const Name& arg, const TensorView& t, DType expected) {
  EMBER_CHECK(t.dtype() == expected, TypeError, op, ": ", arg, " must have dtype ", dtype_name(expected), ", got ",
              dtype_name(t.dtype()));
}

void contiguous(std::string_view op, const Name& arg, const TensorView& t) {
  EMBER_CHECK(t.is_contiguous(), ValueError, op, ": ", arg, " must be contiguous, got a ", t.describe(),
              " view with other strides");
}

void same_shape(std::string_view op, const Name& arg, const TensorView& t, const Name& ref_arg, const TensorView& ref) {
  bool same = t.ndim() == ref.ndim();
  for (int d = 0; same && d < t.ndim(); ++d) same = t.size(d) == ref.size(d);
  EMBER_CHECK(same, ValueError, op, ": ", arg, " must have the shape of ", ref_arg, " (", ref.describe(), "), got ",
              t.describe());
}

void no_overlap(std::string_view op, const Name& out_arg, const TensorView& out, const Name& other_arg,
                const TensorView& other) {
  EMBER_CHECK(!out.overlaps(other), ValueError, op, ": ", out_arg, " must not share memory with ", other_arg);
}

}  // namespace check
}  // namespace ember

namespace ember::check {

void no_overlaps(std::string_view op, const std::vector<ListItem>& items) {
  struct Range {
    uintptr_t first, last;
    const ListItem* item;
  };
  std::vector<Range> ranges;
  ranges.reserve(items.size());
  for (const ListItem& item : items) {
    const TensorView& t = *item.view;
    if (t.numel() == 0) continue;
    const auto [first, last] = byte_span(t);
    ranges.push_back({first, last, &item});
  }
  std::sort(ranges.begin(), ranges.end(), [](const Range& a, const Range& b) { return a.first < b.first; });
  // Sweep: keep the written range reaching furthest and the range (any kind) reaching furthest so far.
  const Range* furthest = nullptr;
  const Range* furthest_written = nullptr;
  for (const Range& r : ranges) {
    const Range* clash = nullptr;
    if (r.item->written && furthest != nullptr && furthest->last > r.first) clash = furthest;
    if (!r.item->written && furthest_written != nullptr && furthest_written->last > r.first) clash = furthest_written;
    if (clash != nullptr) {
      const ListItem& a = *clash->item;
      const ListItem& b = *r.item;
      throw ValueError(detail::concat(op, ": ", item_name(a.list, a.index), " and ", item_name(b.list, b.index),
                                      " share memory; every tensor the call writes must be its own"));
    }
    if (furthest == nullptr || r.last > furthest->last) furthest = &r;
    if (r.item->written && (furthest_written == nullptr || r.last > furthest_written->last)) furthest_written = &r;
  }
}

}  // namespace ember::check
