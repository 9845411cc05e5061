// The tile matmul's AMX body. x is the A operand, read where it lies: an A tile is 16 rows of x by 32 bf16 of k at
// x's row stride, so x is never copied (only the last, partial k step of a row pair goes through a zero-padded
// buffer, so that nothing past a row is read). The weight is oneDNN's packed copy, whose steps are B tiles as they
// lie. Each unit keeps a 2x2 block of C tiles (32 rows by 32 columns), the most that eight tiles allow with two A and
// two B tiles a step: four tile loads feed four tile multiplies.
//
// The prefetch: in a forward's order a layer's weights are in the last-level cache, not in L2. Each thread walks its
// units panel by panel; while it multiplies the units of one panel it spreads prefetches of its next panel over
// their k steps, so the panel is in the core's caches when the thread turns to it. On the Xeon BERT's 48 GEMMs at
// 128 rows took 1.35x their hot time in a forward's order this way, oneDNN's matmul 1.45x
// (benchmarks/results/tile_matmul-*.md).
//
// Products are exact in fp32 and summed in fp32 in k order; the tile multiply treats denormal inputs and results as
// zero, like vdpbf16ps. Compiled with the AVX-512 flags plus -mavx512bf16 -mamx-tile -mamx-bf16.
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "tile_matmul/tile_matmul_kernels.h"

namespace ember::tile_matmul::kernels {
namespace {

// clang-format off
#include "simd/amx_tiles.inl"
// clang-format on

constexpr int64_t kTile = 16;  // rows of an A or C tile, columns of a B or C tile
constexpr int64_t kStep = 32;  // k of one tile multiply (16 pairs)

// Tiles 0-3: C, rows 0-15 x columns 0-15, rows 0-15 x 16-31, rows 16-31 x 0-15, rows 16-31 x 16-31 of the unit;
// 4 and 5: A, rows 0-15 and 16-31 at one k step; 6 and 7: B, columns 0-15 and 16-31 at that step. A unit with
// fewer rows shortens the A and C tiles of its blocks (rows1 = 0: the second block's tiles are unused).
TileConfig config_for(int64_t rows0, int64_t rows1) {
  TileConfig c;
  const auto set = [&c](int tile, int64_t rows) {
    c.rows[tile] = static_cast<uint8_t>(rows);
    c.colsb[tile] = static_cast<uint16_t>(rows > 0 ? 64 : 0);
  };
  for (int tile : {0, 1, 4}) set(tile, rows0);
  for (int tile : {2, 3, 5}) set(tile, rows1);
  for (int tile : {6, 7}) set(tile, kTile);
  return c;
}

// Where a panel's two B tiles lie in the packed weight (with blocks of 16 or 48 columns the two may be in different
// blocks). A tile wholly past the last column reads the first one again, so that no load leaves the copy; its sums
// are never stored.
struct Panel {
  const uint16_t* tiles[2];  // columns 0-15 and 16-31 at k step 0
  int64_t step;              // elements from one k step to the next
  int64_t row_bytes;         // bytes from one row of k pairs to the next
};

Panel panel_at(const uint16_t* packed, const PackedLayout& layout, int64_t panel) {
  const int64_t width = layout.block_cols, steps = layout.steps();
  const auto tile = [&](int64_t col) {
    return packed + (col / width) * steps * kStep * width + ((col % width) / kTile) * 2 * kTile;
  };
  const int64_t col0 = panel * kPanelCols;
  const uint16_t* first = tile(col0);
  return {{first, col0 + kTile < layout.n ? tile(col0 + kTile) : first}, kStep * width, width * 4};
}

// Prefetches of a panel, a share of its lines per k step: line l is row of k pairs (l % 32) / 2 of tile l % 2 at
// step l / 32.
struct Prefetch {
  Panel panel{{nullptr, nullptr}, 0, 0};
  int64_t begin = 0, end = 0, per_step = 0;

  void at_step(int64_t s) const {
    if (panel.tiles[0] == nullptr) return;
    const int64_t first = begin + s * per_step, last = std::min(end, first + per_step);
    for (int64_t l = first; l < last; ++l) {
      const char* step = reinterpret_cast<const char*>(panel.tiles[l % 2] + (l / 32) * panel.step);
      _mm_prefetch(step + ((l % 32) / 2) * panel.row_bytes, _MM_HINT_T0);
    }
  }
};

// The unit's sums over every k step: `full` steps of x where it lies (row stride ldx), then, when k has a tail, one
// step of x_tail (32 rows of 32 bf16), stored at `sums` (row stride ld). Blocks: 1 or 2 blocks of 16 rows.
template <int Blocks>
void multiply(const uint16_t* x, int64_t ldx, const uint16_t* x_tail, const Panel& w, int64_t full,
              const Prefetch& prefetch, float* sums, int64_t ld) {
  _tile_zero(0);
  _tile_zero(1);
  if constexpr (Blocks == 2) {
    _tile_zero(2);
    _tile_zero(3);
  }
  const int64_t x_bytes = ldx * 2;
  for (int64_t s = 0; s < full; ++s) {
    _tile_loadd(6, w.tiles[0] + s * w.step, w.row_bytes);
    _tile_loadd(7, w.tiles[1] + s * w.step, w.row_bytes);
    _tile_loadd(4, x + s * kStep, x_bytes);
    if constexpr (Blocks == 2) _tile_loadd(5, x + kTile * ldx + s * kStep, x_bytes);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    if constexpr (Blocks == 2) {
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }
    prefetch.at_step(s);
  }
  if (x_tail != nullptr) {
    _tile_loadd(6, w.tiles[0] + full * w.step, w.row_bytes);
    _tile_loadd(7, w.tiles[1] + full * w.step, w.row_bytes);
    _tile_loadd(4, x_tail, kStep * 2);
    if constexpr (Blocks == 2) _tile_loadd(5, x_tail + kTile * kStep, kStep * 2);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    if constexpr (Blocks == 2) {
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }
  }
  const int64_t bytes = ld * static_cast<int64_t>(sizeof(float));
  _tile_stored(0, sums, bytes);
  _tile_stored(1, sums + kTile, bytes);
  if constexpr (Blocks == 2) {
    _tile_stored(2, sums + kTile * ld, bytes);
    _tile_stored(3, sums + kTile * ld + kTile, bytes);
  }
}

}  // namespace

void run_units_amx(const uint16_t* x, int64_t ldx, int64_t m, const uint16_t* packed, const PackedLayout& layout,
                   int64_t u0, int64_t u1, float* sums, int64_t ld, int64_t col0) {
  if (u0 >= u1) return;
  const int64_t pairs = (m + kPairRows - 1) / kPairRows, full = layout.k / kStep, tail = layout.k % kStep;
  const int64_t panel_lines = layout.steps() * 32, last_panel = (u1 - 1) / pairs;
  const int64_t prefetch_steps = std::max<int64_t>(full, 1);  // the steps that prefetch (the tail step does not)
  alignas(64) uint16_t x_tail[kPairRows][kStep];
  int64_t loaded0 = -1, loaded1 = -1;
  for (int64_t u = u0; u < u1; ++u) {
    const int64_t p = u / pairs, row0 = (u % pairs) * kPairRows;
    const int64_t rows0 = std::min(kTile, m - row0), rows1 = std::clamp<int64_t>(m - row0 - kTile, 0, kTile);
    if (rows0 != loaded0 || rows1 != loaded1) {
      load_config(config_for(rows0, rows1));
      loaded0 = rows0;
      loaded1 = rows1;
    }
    const uint16_t* xr = x + row0 * ldx;
    if (tail != 0) {
      std::memset(x_tail, 0, sizeof(x_tail));
      for (int64_t r = 0; r < rows0 + rows1; ++r) std::memcpy(x_tail[r], xr + r * ldx + full * kStep, tail * 2);
    }
    Prefetch prefetch;
    if (p < last_panel) {
      // This thread's units on panel p share the prefetch of panel p + 1, spread over their k steps.
      const int64_t first = std::max(u0, p * pairs), count = std::min(u1, (p + 1) * pairs) - first, i = u - first;
      prefetch.panel = panel_at(packed, layout, p + 1);
      prefetch.begin = panel_lines * i / count;
      prefetch.end = panel_lines * (i + 1) / count;
      prefetch.per_step = (prefetch.end - prefetch.begin + prefetch_steps - 1) / prefetch_steps;
    }
    const Panel w = panel_at(packed, layout, p);
    const uint16_t* xt = tail != 0 ? &x_tail[0][0] : nullptr;
    float* out = sums + row0 * ld + (p * kPanelCols - col0);
    rows1 > 0 ? multiply<2>(xr, ldx, xt, w, full, prefetch, out, ld)
              : multiply<1>(xr, ldx, xt, w, full, prefetch, out, ld);
  }
  _tile_release();  // the initial tile state, which a context switch's XSAVE then skips
}

}  // namespace ember::tile_matmul::kernels
