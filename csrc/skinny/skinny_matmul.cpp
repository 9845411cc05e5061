// Dispatch and parallel split of the skinny matmul. The dot products are skinny_kernels.cpp (compiled once per ISA)
// and skinny_amx.cpp; each thread finishes its slice of the output (bias, post-ops, store) in csrc/epilogue/ while
// the sums are in cache.
#include "skinny/skinny_matmul.h"

#include <algorithm>
#include <string>

#include "ember/parallel.h"
#include "ember/trace.h"
#include "epilogue/epilogue_rows.h"
#include "skinny/skinny_kernels.h"

namespace ember::skinny {
namespace {

using namespace kernels;

constexpr IsaImpl<DotRowsFn<float>> kF32[] = {
    {Isa::avx512, dot_rows_avx512<float>}, {Isa::avx2, dot_rows_avx2<float>}, {Isa::ref, dot_rows_ref<float>}};
constexpr IsaImpl<DotRowsFn<uint16_t>> kBf16[] = {{Isa::avx512_bf16, dot_rows_avx512_bf16},
                                                  {Isa::avx512, dot_rows_avx512<uint16_t>},
                                                  {Isa::avx2, dot_rows_avx2<uint16_t>},
                                                  {Isa::ref, dot_rows_ref<uint16_t>}};

// A chunk reads at least 64 KiB of weight (a thread's fork/join costs a few microseconds: about what streaming that
// much takes one core), in whole 16-row groups so that outputs are stored in full cache lines.
constexpr int64_t kChunkBytes = int64_t{64} * 1024;
constexpr int64_t kAlignRows = 16;

KernelTrace trace_call(Isa isa, int64_t m, int64_t n, int64_t k, DType dtype) {
  return {"skinny_matmul", isa, [&] {
            return "m=" + std::to_string(m) + ",n=" + std::to_string(n) + ",k=" + std::to_string(k) + "," +
                   std::string(dtype_name(dtype));
          }};
}

// Splits w's rows into chunks of at least 64 KiB, in whole 16-row groups; body(n0, n1, sums) fills sums [m, n1 -
// n0] for rows [n0, n1), which are then finished into out.
template <typename Body>
void for_each_slice(int64_t m, int64_t n, int64_t row_bytes, const std::vector<float>& bias, const Epilogue& epilogue,
                    const TensorView* residual, const TensorView& out, Body&& body) {
  const int64_t grain = std::max<int64_t>(kAlignRows, kChunkBytes / std::max<int64_t>(1, row_bytes));
  parallel_for(n, grain, kAlignRows, [&](int64_t, int64_t n0, int64_t n1) {
    thread_local std::vector<float> sums;
    sums.resize(static_cast<size_t>(m * (n1 - n0)));
    body(n0, n1, sums.data());
    epilogue::finish_rows(sums.data(), n1 - n0, m, n0, n1, bias.empty() ? nullptr : bias.data(), epilogue, residual,
                          out);
  });
}

template <typename S, size_t N>
void run(const IsaImpl<DotRowsFn<S>> (&impls)[N], const TensorView& x, const TensorView& w,
         const std::vector<float>& bias, const TensorView& out, const Epilogue& epilogue, const TensorView* residual) {
  const auto& impl = select_impl(impls, active_isa());
  const int64_t m = x.size(0), n = w.size(0), k = w.size(1);
  const KernelTrace trace = trace_call(impl.isa, m, n, k, w.dtype());
  const S* xs = x.data_as<const S>();
  const S* ws = w.data_as<const S>();
  for_each_slice(m, n, k * static_cast<int64_t>(sizeof(S)), bias, epilogue, residual, out,
                 [&](int64_t n0, int64_t n1, float* sums) {
                   impl.fn(xs, x.stride(0), m, ws, w.stride(0), k, n0, n1, sums, n1 - n0);
                 });
}

bool runs_on_amx(int64_t m, int64_t k) { return active_isa() >= Isa::amx && m >= kMinAmxRows && k >= kAmxStep; }

// Each thread re-lays x as AMX B tiles itself, into its own buffer, and reads them from its own caches. Packed once
// by the caller instead, every thread pulled the same freshly written lines out of the caller's core: 16 rows of
// BERT's 768x3072 took 52 µs on the Xeon that way, 24.5 µs this way (benchmarks/results/linear-intel-*.md).
void run_amx(const TensorView& x, const TensorView& w, const std::vector<float>& bias, const TensorView& out,
             const Epilogue& epilogue, const TensorView* residual) {
  const int64_t m = x.size(0), n = w.size(0), k = w.size(1), k32 = k - k % kAmxStep;
  const KernelTrace trace = trace_call(Isa::amx, m, n, k, w.dtype());
  const uint16_t* xs = x.data_as<const uint16_t>();
  const uint16_t* ws = w.data_as<const uint16_t>();
  for_each_slice(m, n, k * 2, bias, epilogue, residual, out, [&](int64_t n0, int64_t n1, float* sums) {
    thread_local std::vector<uint32_t> packed;
    packed.resize(static_cast<size_t>(k32 / 2 * m));
    pack_rows_for_amx(xs, x.stride(0), m, k32, packed.data());
    dot_rows_amx(xs, x.stride(0), packed.data(), m, ws, w.stride(0), k, n0, n1, sums, n1 - n0);
  });
}

}  // namespace

int64_t max_rows(DType dtype) noexcept {
  return dtype == DType::bf16 && active_isa() >= Isa::amx ? kMaxAmxRows : kMaxRows;
}

bool takes(const TensorView& x, const TensorView& w) noexcept {
  return x.ndim() == 2 && w.ndim() == 2 && (x.dtype() == DType::f32 || x.dtype() == DType::bf16) &&
         x.dtype() == w.dtype() && x.size(0) >= 1 && x.size(0) <= max_rows(x.dtype()) &&
         (w.stride(1) == 1 || w.size(1) == 1) && (x.stride(1) == 1 || x.size(1) == 1);
}

void matmul(const TensorView& x, const TensorView& w, const std::vector<float>& bias, const TensorView& out,
            const Epilogue& epilogue, const TensorView* residual) {
  if (x.dtype() == DType::f32) {
    run(kF32, x, w, bias, out, epilogue, residual);
  } else if (runs_on_amx(x.size(0), w.size(1))) {
    run_amx(x, w, bias, out, epilogue, residual);
  } else {
    run(kBf16, x, w, bias, out, epilogue, residual);
  }
}

Isa implementation(DType dtype, int64_t m, int64_t k) {
  if (dtype == DType::bf16 && runs_on_amx(m, k)) return Isa::amx;
  return dtype == DType::bf16 ? select_impl(kBf16, active_isa()).isa : select_impl(kF32, active_isa()).isa;
}

}  // namespace ember::skinny
