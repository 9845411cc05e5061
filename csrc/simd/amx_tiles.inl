// What the AMX kernels share: the tile configuration ldtilecfg reads and its load (the 16x16 transpose that packs
// operands into tile layouts is Avx512F::transpose, simd_avx512.inl). Included inside the anonymous namespace of each
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
