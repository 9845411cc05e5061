// ember::copy: dimensions merged where both tensors allow, then the elements, in row-major order, split over the
// threads; each run along the innermost dimension a memcpy where both walk it with unit stride, else an element loop
// of the element's width.
#include "ember/copy.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>

#include "ember/errors.h"
#include "ember/parallel.h"
#include "ember/trace.h"

namespace ember {
namespace {

constexpr std::string_view kOp = "copy";
// Below this many elements moved a fork/join costs more than the other threads save (a 64 KiB row block).
constexpr int64_t kParallelElements = 1 << 15;
constexpr int64_t kChunkElements = 1 << 13;

/// The copy's loop nest: dimensions of size > 1 in their order, adjacent ones merged where both tensors step
/// through them as one (stride of the outer = size x stride of the inner, for src and dst alike).
struct Nest {
  int dims = 0;
  std::array<int64_t, kMaxDims> sizes{};
  std::array<int64_t, kMaxDims> src{};  // strides, in elements
  std::array<int64_t, kMaxDims> dst{};
};

Nest nest_of(const TensorView& src, const TensorView& dst) {
  Nest n;
  for (int d = 0; d < src.ndim(); ++d) {
    if (src.size(d) == 1) continue;
    if (n.dims > 0) {
      const int last = n.dims - 1;
      if (n.src[last] == src.size(d) * src.stride(d) && n.dst[last] == src.size(d) * dst.stride(d)) {
        n.sizes[last] *= src.size(d);
        n.src[last] = src.stride(d);
        n.dst[last] = dst.stride(d);
        continue;
      }
    }
    n.sizes[n.dims] = src.size(d);
    n.src[n.dims] = src.stride(d);
    n.dst[n.dims] = dst.stride(d);
    ++n.dims;
  }
  if (n.dims == 0) {  // one element
    n.dims = 1;
    n.sizes[0] = 1;
    n.src[0] = n.dst[0] = 1;
  }
  return n;
}

template <typename Element>
void copy_row(const char* src, char* dst, int64_t count, int64_t src_stride, int64_t dst_stride) {
  const auto* s = reinterpret_cast<const Element*>(src);
  auto* d = reinterpret_cast<Element*>(dst);
  for (int64_t i = 0; i < count; ++i) d[i * dst_stride] = s[i * src_stride];
}

}  // namespace

void copy(const TensorView& src, const TensorView& dst) {
  check::dtype(kOp, "dst", dst, src.dtype());
  check::same_shape(kOp, "dst", dst, "src", src);
  EMBER_CHECK(src.byte_extent() >= 0, ValueError, kOp, ": src must have no negative strides, got ", src.describe());
  EMBER_CHECK(dst.is_dense(), ValueError, kOp, ": dst must hold each of its elements once (dense), got ",
              dst.describe());
  check::no_overlap(kOp, "dst", dst, "src", src);
  if (src.numel() == 0) return;

  const Nest n = nest_of(src, dst);
  const int inner = n.dims - 1;
  const int64_t width = n.sizes[inner];
  const int64_t element = static_cast<int64_t>(dtype_size(src.dtype()));
  const bool unit_rows = n.src[inner] == 1 && n.dst[inner] == 1;
  const KernelTrace trace(kOp, Isa::ref, [&] { return src.describe(); });
  const char* src_base = static_cast<const char*>(src.data());
  char* dst_base = static_cast<char*>(dst.data());
  const int64_t total = src.numel();
  // Chunks of elements in the tensors' row-major order (a row may be split: a contiguous tensor is one row), each
  // starting from its first element's index in every dimension and walking on like an odometer.
  const int64_t grain = total < kParallelElements ? total : kChunkElements;
  parallel_for(total, grain, 64, [&](int64_t, int64_t begin, int64_t end) {
    std::array<int64_t, kMaxDims> index{};
    int64_t rest = begin;
    for (int d = inner; d >= 0; --d) {
      index[d] = rest % n.sizes[d];
      rest /= n.sizes[d];
    }
    for (int64_t at = begin; at < end;) {
      int64_t s = 0, t = 0;
      for (int d = 0; d <= inner; ++d) {
        s += index[d] * n.src[d];
        t += index[d] * n.dst[d];
      }
      const int64_t count = std::min(width - index[inner], end - at);
      const char* from = src_base + s * element;
      char* to = dst_base + t * element;
      if (unit_rows) {
        std::memcpy(to, from, static_cast<size_t>(count * element));
      } else {
        switch (element) {
          case 1: copy_row<uint8_t>(from, to, count, n.src[inner], n.dst[inner]); break;
          case 2: copy_row<uint16_t>(from, to, count, n.src[inner], n.dst[inner]); break;
          case 4: copy_row<uint32_t>(from, to, count, n.src[inner], n.dst[inner]); break;
          default: copy_row<uint64_t>(from, to, count, n.src[inner], n.dst[inner]); break;
        }
      }
      at += count;
      index[inner] += count;
      for (int d = inner; d > 0 && index[d] == n.sizes[d]; --d) {
        index[d] = 0;
        ++index[d - 1];
      }
    }
  });
}

}  // namespace ember
