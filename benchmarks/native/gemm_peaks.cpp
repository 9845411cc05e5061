// The machine's compute peaks beside oneDNN's matmul at a transformer's shapes: what "the GEMM ceiling" of the
// Python benchmarks (torch.mm at 2048^3) stands for, measured from below and from above.
//
// - peak: the instruction's rate with every operand in registers (AMX tile multiplies; AVX-512 or AVX2 FMAs on
//   twelve independent accumulators), on one thread, on every thread and on each count the oneDNN runs use: no
//   kernel on as many threads can pass it. `amx_bf16_l1` is
//   the tile multiply with its two A and two B tiles loaded from L1 before every four multiplies (the 2x2 blocking
//   that the eight tiles allow): what a kernel streaming both operands from L1 can hope for.
// - gemm: oneDNN's matmul on a packed weight (format any), M x K times K x N, each shape alone in a loop ("hot":
//   its weight in the cores' caches), at BERT-base's four shapes.
// - sweep: the 48 GEMMs of a 12-layer BERT-base, each layer its own weights, in the forward's order ("cold": the
//   weights do not stay in L2), against the sum of the hot times.
//
// Built and run by benchmarks/bench_gemm_peaks.py (g++ -O3 -fopenmp against the oneDNN ember builds with); prints
// one whitespace-separated record per line: `peak <what> <threads> <GFLOP/s>`,
// `gemm <dtype> <threads> <m> <k> <n> <us> <GFLOP/s>`, `sweep <dtype> <threads> <m> <cold ms> <hot-sum ms> <GFLOP/s>`.
// Arguments: the thread counts of the oneDNN runs (default: all, then half).
#include <cpuid.h>
#include <immintrin.h>
#include <omp.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "oneapi/dnnl/dnnl.hpp"

namespace {

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// CPUID leaf 7: AMX-TILE and AMX-BF16 (EDX bits 24, 22), AVX512-BF16 (sub-leaf 1, EAX bit 5).
bool cpuid7(int subleaf, int reg, int bit) {
  unsigned r[4] = {};
  if (__get_cpuid_count(7, subleaf, &r[0], &r[1], &r[2], &r[3]) == 0) return false;
  return ((r[reg] >> bit) & 1U) != 0;
}
constexpr int kEax = 0, kEdx = 3;

// Linux hands out the tile data state on request (ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA); without it the first
// tile instruction faults.
bool amx_usable() {
  if (!cpuid7(0, kEdx, 24) || !cpuid7(0, kEdx, 22)) return false;
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
}

struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Four 16x16 fp32 C tiles (0-3) accumulate A tiles 4-5 times B tiles 6-7, 16384 flops a multiply. With `loads`,
// the four operand tiles are reloaded from L1 (eight 4 KiB sets in turn) before every four multiplies.
__attribute__((target("amx-tile,amx-bf16"))) float amx_loop(int64_t iters, bool loads, const char* l1) {
  TileConfig c;
  for (int t = 0; t < 8; ++t) {
    c.rows[t] = 16;
    c.colsb[t] = 64;
  }
  asm volatile("ldtilecfg %0" ::"m"(c));
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  _tile_loadd(4, l1, 64);
  _tile_loadd(5, l1 + 1024, 64);
  _tile_loadd(6, l1 + 2048, 64);
  _tile_loadd(7, l1 + 3072, 64);
  for (int64_t i = 0; i < iters; ++i) {
    if (loads) {
      const char* set = l1 + (i & 7) * 4096;
      _tile_loadd(4, set, 64);
      _tile_loadd(5, set + 1024, 64);
      _tile_loadd(6, set + 2048, 64);
      _tile_loadd(7, set + 3072, 64);
    }
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  alignas(64) float out[256];
  _tile_stored(0, out, 64);
  _tile_release();
  return out[0];
}

// Twelve independent FMA chains: more than the FMA latency times the ports, so the ports, not the chains, bound it.
// (Written out per ISA: a shared template would be compiled without the target and call each FMA out of line.)
__attribute__((target("avx512f"))) float fma_loop_avx512(int64_t iters) {
  __m512 a[12];
  for (int j = 0; j < 12; ++j) a[j] = _mm512_set1_ps(1.0f + static_cast<float>(j) * 1e-7f);
  const __m512 m = _mm512_set1_ps(0.9999999f), b = _mm512_set1_ps(1e-7f);
  for (int64_t i = 0; i < iters; ++i) {
    for (auto& acc : a) acc = _mm512_fmadd_ps(acc, m, b);
  }
  for (int j = 1; j < 12; ++j) a[0] = _mm512_add_ps(a[0], a[j]);
  alignas(64) float lane[16];
  _mm512_store_ps(lane, a[0]);
  return lane[0];
}

__attribute__((target("avx2,fma"))) float fma_loop_avx2(int64_t iters) {
  __m256 a[12];
  for (int j = 0; j < 12; ++j) a[j] = _mm256_set1_ps(1.0f + static_cast<float>(j) * 1e-7f);
  const __m256 m = _mm256_set1_ps(0.9999999f), b = _mm256_set1_ps(1e-7f);
  for (int64_t i = 0; i < iters; ++i) {
    for (auto& acc : a) acc = _mm256_fmadd_ps(acc, m, b);
  }
  for (int j = 1; j < 12; ++j) a[0] = _mm256_add_ps(a[0], a[j]);
  alignas(32) float lane[8];
  _mm256_store_ps(lane, a[0]);
  return lane[0];
}

// The best of five runs: a peak is what the machine can do, and on a shared host a single run can land in another
// tenant's burst (the 2-core EPYC once read 97 GFLOP/s on two threads against 180 a minute before).
template <class Body>
void peak(const char* what, int threads, double flops_per_thread, Body body) {
  float sink = 0;
  double best = 0;
  for (int run = 0; run < 5; ++run) {
    const double t0 = now();
#pragma omp parallel num_threads(threads) reduction(+ : sink)
    sink += body();
    best = std::max(best, threads * flops_per_thread / (now() - t0) / 1e9);
  }
  // (+ 0 * sink keeps the loops' results live: without -ffast-math the compiler cannot drop a float times zero)
  std::printf("peak %s %d %.1f\n", what, threads, best + 0 * sink);
}

void peaks(int threads, bool amx) {
  if (amx) {
    std::vector<char> l1(8 * 4096, 0);  // zeros: no denormals, no NaN
    const int64_t iters = 2000000;
    peak("amx_bf16", threads, iters * 4.0 * 16384, [&] { return amx_loop(iters, false, l1.data()); });
    peak("amx_bf16_l1", threads, iters * 4.0 * 16384, [&] { return amx_loop(iters, true, l1.data()); });
  }
  const int64_t iters = 20000000;
  if (__builtin_cpu_supports("avx512f")) {
    peak("fp32_fma_avx512", threads, iters * 12.0 * 32, [&] { return fma_loop_avx512(iters); });
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    peak("fp32_fma_avx2", threads, iters * 12.0 * 16, [&] { return fma_loop_avx2(iters); });
  }
}

using dnnl::memory;

struct Gemm {
  dnnl::matmul prim;
  memory src, weights, dst;
  void run(dnnl::stream& s) {
    prim.execute(s, {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, weights}, {DNNL_ARG_DST, dst}});
  }
};

Gemm make(dnnl::engine& eng, memory::data_type dt, int64_t m, int64_t k, int64_t n) {
  const memory::desc src({m, k}, dt, memory::format_tag::ab), dst({m, n}, dt, memory::format_tag::ab);
  const memory::desc plain({k, n}, dt, memory::format_tag::ba);
  const dnnl::matmul::primitive_desc pd(eng, src, memory::desc({k, n}, dt, memory::format_tag::any), dst);
  Gemm g{dnnl::matmul(pd), memory(src, eng), memory(pd.weights_desc(), eng), memory(dst, eng)};
  memory w(plain, eng);
  std::memset(w.get_data_handle(), 0x3c, plain.get_size());  // 0x3c3c: about 0.011 in bf16, 0.0115 in fp32
  std::memset(g.src.get_data_handle(), 0x3c, src.get_size());
  dnnl::stream s(eng);
  dnnl::reorder(w, g.weights).execute(s, w, g.weights);
  s.wait();
  return g;
}

void onednn(dnnl::engine& eng, memory::data_type dt, const char* name, int threads, int max_threads) {
  omp_set_num_threads(threads);
  dnnl::stream s(eng);
  const int64_t shapes[4][2] = {{768, 2304}, {768, 768}, {768, 3072}, {3072, 768}};  // QKV, out, up, down
  for (int64_t m : {128, 512, 2048}) {
    if ((m == 2048 && threads < max_threads) || (m == 512 && threads == 1)) continue;  // (minutes, no news)
    double hot_sum = 0, layer_flop = 0;
    for (const auto& kn : shapes) {
      Gemm g = make(eng, dt, m, kn[0], kn[1]);
      for (int i = 0; i < 5; ++i) g.run(s);
      std::vector<double> ts;
      for (int i = 0; i < (m <= 512 ? 200 : 40); ++i) {
        const double t0 = now();
        g.run(s);
        ts.push_back(now() - t0);
      }
      const double t = median(ts);
      hot_sum += 12 * t;
      layer_flop += 2.0 * m * kn[0] * kn[1];
      std::printf("gemm %s %d %ld %ld %ld %.1f %.1f\n", name, threads, static_cast<long>(m), static_cast<long>(kn[0]),
                  static_cast<long>(kn[1]), t * 1e6, 2.0 * m * kn[0] * kn[1] / t / 1e9);
    }
    std::vector<Gemm> layers;
    for (int l = 0; l < 12; ++l)
      for (const auto& kn : shapes) layers.push_back(make(eng, dt, m, kn[0], kn[1]));
    for (auto& g : layers) g.run(s);
    std::vector<double> ts;
    for (int r = 0; r < (m >= 2048 ? 5 : 12); ++r) {
      const double t0 = now();
      for (auto& g : layers) g.run(s);
      ts.push_back(now() - t0);
    }
    const double cold = median(ts);
    std::printf("sweep %s %d %ld %.3f %.3f %.1f\n", name, threads, static_cast<long>(m), cold * 1e3, hot_sum * 1e3,
                12 * layer_flop / cold / 1e9);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const int max_threads = omp_get_max_threads();
  std::vector<int> threads;
  for (int i = 1; i < argc; ++i) threads.push_back(std::atoi(argv[i]));
  if (threads.empty()) threads = {max_threads, std::max(1, max_threads / 2)};
  const bool amx = amx_usable();
  // At every thread count measured: a peak does not scale with threads where two of them share a core's units
  // (the 16-CPU Xeon VM's sixteen threads ran 8x one thread's FMA and tile rates).
  std::vector<int> peak_threads = {1, max_threads};
  for (int t : threads) {
    if (std::find(peak_threads.begin(), peak_threads.end(), t) == peak_threads.end()) peak_threads.push_back(t);
  }
  for (int t : peak_threads) peaks(t, amx);
  // bf16 only where the CPU multiplies bf16 (AVX512-BF16 or AMX): elsewhere oneDNN emulates it, minutes a shape.
  const bool bf16 = amx || cpuid7(1, kEax, 5);
  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  for (int t : threads) {
    if (bf16) onednn(eng, memory::data_type::bf16, "bf16", t, max_threads);
    onednn(eng, memory::data_type::f32, "f32", t, max_threads);
  }
  std::fflush(stdout);
  return 0;
}
