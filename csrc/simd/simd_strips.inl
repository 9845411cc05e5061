// Walking a row in strips of up to 8 vectors of V, so that a kernel can keep a strip's running values in
// registers (NV is a compile-time count). Included inside an anonymous namespace of a kernel file, after the vector
// types; the file includes <type_traits> (std::integral_constant) before opening that namespace.
//
// Every loop over a strip's NV registers carries `#pragma GCC unroll 8`. Without it GCC 12 unrolls those loops too
// late to keep the array in registers: it zeroed the sums with a memset (rep stos, 512 bytes a strip) and stored and
// reloaded them through the stack around every row, which doubled the merged lookup's time at 1 index a bag on a
// table in cache (Zen 5, 53248 bags into preallocated outputs, 2 threads: 849 us, 434 with the pragma).

// Calls f(std::integral_constant<int, NV>{}, column) for strips of NV vectors covering the columns [0, dim') that
// whole vectors fill, and returns dim' (the first column left to a scalar loop).
template <typename V, typename F>
inline int64_t for_each_strip(int64_t dim, F&& f) {
  constexpr int64_t kStrip = 8 * V::kWidth;
  int64_t c = 0;
  for (; c + kStrip <= dim; c += kStrip) f(std::integral_constant<int, 8>{}, c);
  switch ((dim - c) / V::kWidth) {
    case 7: f(std::integral_constant<int, 7>{}, c); break;
    case 6: f(std::integral_constant<int, 6>{}, c); break;
    case 5: f(std::integral_constant<int, 5>{}, c); break;
    case 4: f(std::integral_constant<int, 4>{}, c); break;
    case 3: f(std::integral_constant<int, 3>{}, c); break;
    case 2: f(std::integral_constant<int, 2>{}, c); break;
    case 1: f(std::integral_constant<int, 1>{}, c); break;
    default: break;
  }
  return c + (dim - c) / V::kWidth * V::kWidth;
}
