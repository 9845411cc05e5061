// Magnitudes over a tensor: the largest (read from the bit patterns) and the sum. Together they bound every sum of a
// matmul or convolution, the guard of a fast path whose arithmetic differs from ember's definitions only where a sum
// is not finite (onednn::fuses_gelu's fused GELU).
#pragma once

#include "ember/tensor_view.h"

namespace ember {

/// The largest |element| of `t` (float32, bfloat16 or float16) as a float: +inf where an element is infinite, NaN
/// where one is NaN (the bit patterns of magnitudes order as their values do, and NaN's above inf's), 0 for no
/// elements. Reads dense views and views of rows (2-D, unit stride along a row) in parallel; any other view, or
/// another dtype, gives NaN, as if it held a NaN: callers take their general path then.
float max_magnitude(const TensorView& t);

/// The sum of |element| over a dense view (float32 or bfloat16), in double: +inf where an element is infinite, NaN
/// where one is NaN; NaN for any other view or dtype. Parallel; the order of the partial sums depends on the thread
/// count, which moves the result by rounding only (callers use it as a bound, with margin).
double magnitude_sum(const TensorView& t);

}  // namespace ember
