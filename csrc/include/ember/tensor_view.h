// TensorView: how a tensor crosses into the ember core. It borrows memory owned by someone else (a torch tensor,
// a numpy array, a C++ caller's buffer) for the duration of one call and never frees it. The core knows no torch:
// the Python binding builds views from DLPack, a C++ program builds them directly.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace ember {

/// Element types a view can hold. Kernels take a few of them; the rest exist so that a wrong argument is reported
/// by its real name ("got float64") rather than as unknown.
enum class DType : uint8_t { f32, bf16, f16, f64, i8, u8, i16, i32, i64, boolean };

/// Size of one element in bytes.
size_t dtype_size(DType dtype) noexcept;
/// Short name as torch spells it: "float32", "bfloat16", ...
std::string_view dtype_name(DType dtype) noexcept;

/// The type a kernel computes in for storage T of with_float_storage: double for float64, float for float32 and
/// for bfloat16 bits (widened exactly). Per-element side tensors (per-sample weights, gradients, sums) hold it too.
template <typename T>
using Arithmetic = std::conditional_t<std::is_same_v<T, double>, double, float>;

/// The dtype of Arithmetic for a storage dtype: float64 for float64, float32 for float32 and bfloat16.
constexpr DType arithmetic_dtype(DType storage) noexcept { return storage == DType::f64 ? DType::f64 : DType::f32; }

/// float32 or bfloat16: the activations most kernel families take (computing in float32).
constexpr bool is_f32_or_bf16(DType dtype) noexcept { return dtype == DType::f32 || dtype == DType::bf16; }

/// Calls f(T{}) with the storage type of a floating dtype a kernel family takes: float for float32, uint16_t (the
/// bit patterns) for bfloat16, double for float64. The caller has refused every other dtype before.
template <typename F>
void with_float_storage(DType dtype, F&& f) {
  if (dtype == DType::bf16) {
    f(uint16_t{});
  } else if (dtype == DType::f64) {
    f(double{});
  } else {
    f(float{});
  }
}

/// The number of dimensions a view can describe. torch allows more, but no ember kernel needs them.
inline constexpr int kMaxDims = 8;

class TensorView {
 public:
  TensorView() = default;
  /// A view of `data` with the given sizes and strides (in elements). Throws ValueError for a negative size,
  /// more than kMaxDims dimensions, or sizes and strides of different lengths.
  TensorView(void* data, DType dtype, const int64_t* sizes, const int64_t* strides, int ndim);
  /// A contiguous (row-major) view of `data`.
  TensorView(void* data, DType dtype, std::initializer_list<int64_t> sizes);

  void* data() const noexcept { return data_; }
  template <typename T>
  T* data_as() const noexcept {
    return static_cast<T*>(data_);
  }
  DType dtype() const noexcept { return dtype_; }
  int ndim() const noexcept { return ndim_; }
  int64_t size(int dim) const noexcept { return sizes_[dim]; }
  int64_t stride(int dim) const noexcept { return strides_[dim]; }
  const int64_t* sizes() const noexcept { return sizes_.data(); }
  const int64_t* strides() const noexcept { return strides_.data(); }
  int64_t numel() const noexcept { return numel_; }
  size_t nbytes() const noexcept { return static_cast<size_t>(numel_) * dtype_size(dtype_); }

  /// True when the elements are laid out row-major with no gaps (size-1 dimensions may have any stride).
  bool is_contiguous() const noexcept;
  /// True when the elements fill [data, data + numel) exactly once, in some order of the dimensions (row-major,
  /// channels-last, any permutation; size-1 dimensions may have any stride). Elementwise kernels can then run over
  /// the memory as a flat array, provided every tensor of the call has the same strides.
  bool is_dense() const noexcept;
  /// Same sizes and the same strides in every dimension of size > 1.
  bool same_layout(const TensorView& other) const noexcept;
  /// This view as a matrix [product of the leading dimensions, last dimension], when the leading dimensions step
  /// through memory as one (rows at one stride, as a row-major [..., K] tensor's do); nullopt otherwise, and for a
  /// view of fewer than two dimensions. Matmuls take a transformer's [batch, sequence, hidden] activations this way,
  /// with no reshape on the caller's side.
  std::optional<TensorView> as_matrix() const;
  /// True when the byte ranges spanned by the two views intersect.
  bool overlaps(const TensorView& other) const noexcept;
  /// The bytes from data() to one past the last element the view reaches: 0 for no elements, -1 where a stride is
  /// negative (the view reaches below data()).
  int64_t byte_extent() const noexcept;
  /// The same view of other memory: sizes, strides and dtype kept, data() replaced (a recorded call replayed on the
  /// buffers of another, python/csrc/replay_binding.cpp).
  TensorView with_data(void* data) const noexcept {
    TensorView moved = *this;
    moved.data_ = data;
    return moved;
  }
  /// "bfloat16[2, 3]" — for error messages.
  std::string describe() const;

 private:
  void* data_ = nullptr;
  DType dtype_ = DType::f32;
  int ndim_ = 0;
  int64_t numel_ = 1;
  std::array<int64_t, kMaxDims> sizes_{};
  std::array<int64_t, kMaxDims> strides_{};
};

// The input checks every kernel entry point uses, in one place so that every message has the same form:
// "<op>: <arg> must be <expected>, got <actual>". Each throws the ember exception that fits.
namespace check {
/// How a message names a tensor argument: a plain name ("grad") or an item of a list argument ("exp_avgs[3]").
/// It keeps the parts and is spelled out only into a message, so a call whose checks pass builds no string
/// (a merged lookup of 26 tables makes some 180 checks a call). It borrows its text: a Name lives no longer than
/// the check it is passed to.
class Name {
 public:
  Name(std::string_view arg) noexcept : list_(arg) {}  // NOLINT(google-explicit-constructor)
  Name(const char* arg) noexcept : list_(arg) {}       // NOLINT(google-explicit-constructor)
  Name(std::string_view list, size_t index) noexcept : list_(list), index_(static_cast<int64_t>(index)) {}
  /// "exp_avgs[3]", or the plain name.
  std::string str() const;

 private:
  std::string_view list_;
  int64_t index_ = -1;
};
/// Message parts take a Name as they take a string (ember::detail::concat finds this by argument lookup).
inline void append(std::string& out, const Name& name) { out.append(name.str()); }

/// A finite number >= low: learning rates, epsilons, decays. ValueError otherwise, naming op and arg.
void finite_at_least(std::string_view op, std::string_view arg, double value, double low);
void dtype(std::string_view op, const Name& arg, const TensorView& t, DType expected);
void contiguous(std::string_view op, const Name& arg, const TensorView& t);
void same_shape(std::string_view op, const Name& arg, const TensorView& t, const Name& ref_arg, const TensorView& ref);
/// Output `out` must not share memory with `other` (an input, or another output).
void no_overlap(std::string_view op, const Name& out_arg, const TensorView& out, const Name& other_arg,
                const TensorView& other);

/// How messages name a tensor of a list argument: ("exp_avgs", 3) -> "exp_avgs[3]".
inline Name item_name(std::string_view list, size_t index) noexcept { return Name(list, index); }

/// A tensor of a list argument, named for messages as item_name(list, index).
struct ListItem {
  std::string_view list;
  size_t index;
  const TensorView* view;
  bool written;
};
/// No written item may share memory with any other item (read-only items may share with each other). Sorts the
/// byte ranges once: O(n log n) for the hundreds of tensors of an optimizer group.
void no_overlaps(std::string_view op, const std::vector<ListItem>& items);
}  // namespace check

}  // namespace ember
