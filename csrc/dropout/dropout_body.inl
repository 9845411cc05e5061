// Philox4x32-10 over a vector of blocks, and the dropout loop, written once for a float vector type V
// (simd/simd_*.inl) and a 32-bit lane type R of the same width. Included inside the anonymous namespace of
// dropout_kernels.cpp (once per ISA), after both.
//
// R provides: `Words` (V::kWidth 32-bit lanes); `broadcast(uint32_t)`; `counters(first, lo, hi)`, the low and high
// words of the block numbers first .. first + kWidth - 1; `mulhilo(a, m, hi, lo)`, the halves of the 64-bit
// products; `xor3(a, b, c)`; `factor(word, threshold, scale)`, scale in the lanes whose word is >= threshold and 0
// elsewhere; `lanes(word, out)`, the words as an array, for the tail.

// The key of each round, broadcast once a call.
template <typename R>
struct PhiloxKeys {
  typename R::Words k0[philox::kRounds], k1[philox::kRounds];
};

template <typename R>
PhiloxKeys<R> philox_keys(uint32_t k0, uint32_t k1) {
  PhiloxKeys<R> keys{};
  for (int round = 0; round < philox::kRounds; ++round) {
    keys.k0[round] = R::broadcast(k0);
    keys.k1[round] = R::broadcast(k1);
    k0 += philox::kW0;
    k1 += philox::kW1;
  }
  return keys;
}

// The four words of the blocks first .. first + kWidth - 1 (ember::philox::block_words, a block per lane).
template <typename R>
void philox_blocks(uint64_t first, const PhiloxKeys<R>& keys, typename R::Words out[4]) {
  using Words = typename R::Words;
  Words c0, c1;
  R::counters(first, c0, c1);
  Words c2 = R::broadcast(0), c3 = R::broadcast(0);
  const Words m0 = R::broadcast(philox::kM0), m1 = R::broadcast(philox::kM1);
  for (int round = 0; round < philox::kRounds; ++round) {
    Words hi0, lo0, hi1, lo1;
    R::mulhilo(c0, m0, hi0, lo0);
    R::mulhilo(c2, m1, hi1, lo1);
    c0 = R::xor3(hi1, c1, keys.k0[round]);
    c1 = lo1;
    c2 = R::xor3(hi0, c3, keys.k1[round]);
    c3 = lo0;
  }
  out[0] = c0;
  out[1] = c1;
  out[2] = c2;
  out[3] = c3;
}

template <typename V, typename R, typename S>
void dropout_range(const S* x, S* y, int64_t begin, int64_t end, uint64_t seed, uint32_t threshold, float scale) {
  constexpr int kWidth = V::kWidth;
  static_assert(16 % kWidth == 0, "a tile's 16 blocks must split into whole vectors");
  const auto threshold_v = R::broadcast(threshold);
  const auto scale_v = V::set1(scale);
  const auto keys = philox_keys<R>(static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
  for (int64_t tile = begin / 64; tile * 64 < end; ++tile) {
    for (int j = 0; j < 16; j += kWidth) {  // lanes j .. j + kWidth - 1 of the tile's 16 blocks
      typename R::Words words[4];
      philox_blocks<R>(static_cast<uint64_t>(16 * tile + j), keys, words);
      for (int w = 0; w < 4; ++w) {
        const int64_t i = 64 * tile + int64_t{16} * w + j;  // the element that lane 0 of word w belongs to
        if (i + kWidth <= end) {
          V::store(y + i, V::mul(V::load(x + i), R::factor(words[w], threshold_v, scale_v)));
        } else if (i < end) {
          uint32_t lane_words[kWidth];
          R::lanes(words[w], lane_words);
          for (int64_t l = 0; i + l < end; ++l) {
            const float factor = lane_words[l] >= threshold ? scale : 0.0f;
            ScalarF::store(y + i + l, ScalarF::mul(ScalarF::load(x + i + l), factor));
          }
        }
      }
    }
  }
}
