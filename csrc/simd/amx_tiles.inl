// What the AMX kernels share: the tile configuration ldtilecfg reads, its load, and the 16x16 transpose of 32-bit
// words in AVX-512 registers that packs operands into tile layouts. Included inside the anonymous namespace of each
// AMX translation unit (compiled with the AMX flags), so every one has its own copy, as with the other simd/ files;
// inline, so that a unit using only some of them compiles without unused-function warnings.

// The 64-byte operand of ldtilecfg (palette 1): rows and bytes per row of each of the 8 tiles.
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};
static_assert(sizeof(TileConfig) == 64, "ldtilecfg reads 64 bytes");

// Written out rather than _tile_loadconfig(): GCC 12's intrinsic tells the compiler it reads 8 bytes, which would
// let it drop the stores that fill the rest of the configuration.
inline void load_config(const TileConfig& config) { asm volatile("ldtilecfg %0" ::"m"(config)); }

// Transposes a 16x16 block of floats held as 16 rows. Stage 1 and 2 interleave within 128-bit lanes, so that
// rows[4g + c] holds, in its lane L, column 4L + c of rows 4g..4g+3; stage 3 and 4 then gather, for each (L, c),
// lane L of the four groups into row 4L + c. 64 shuffles against the 256 scalar moves of an element-wise copy.
inline void transpose16x16(__m512 (&rows)[16]) {
  __m512 t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_ps(rows[i], rows[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(rows[i], rows[i + 1]);
  }
  const auto pd = [](__m512 v) { return _mm512_castps_pd(v); };
  for (int i = 0; i < 16; i += 4) {
    rows[i] = _mm512_castpd_ps(_mm512_unpacklo_pd(pd(t[i]), pd(t[i + 2])));
    rows[i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(pd(t[i]), pd(t[i + 2])));
    rows[i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(pd(t[i + 1]), pd(t[i + 3])));
    rows[i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(pd(t[i + 1]), pd(t[i + 3])));
  }
  for (int c = 0; c < 4; ++c) {
    // 0x88 picks 128-bit lanes 0 and 2 of each operand, 0xdd lanes 1 and 3.
    const __m512 u0 = _mm512_shuffle_f32x4(rows[c], rows[4 + c], 0x88);
    const __m512 u1 = _mm512_shuffle_f32x4(rows[c], rows[4 + c], 0xdd);
    const __m512 u2 = _mm512_shuffle_f32x4(rows[8 + c], rows[12 + c], 0x88);
    const __m512 u3 = _mm512_shuffle_f32x4(rows[8 + c], rows[12 + c], 0xdd);
    t[c] = _mm512_shuffle_f32x4(u0, u2, 0x88);       // lane L = 0
    t[4 + c] = _mm512_shuffle_f32x4(u1, u3, 0x88);   // L = 1
    t[8 + c] = _mm512_shuffle_f32x4(u0, u2, 0xdd);   // L = 2
    t[12 + c] = _mm512_shuffle_f32x4(u1, u3, 0xdd);  // L = 3
  }
  for (int i = 0; i < 16; ++i) rows[i] = t[i];
}
