// The dropout loop, written once for a float vector type V (simd/simd_*.inl) and a generator R of the same width
// that computes V::kWidth Philox blocks at once. Included inside an anonymous namespace of each
// dropout_<isa>.cpp, after both.
//
// R provides: `Words` (V::kWidth 32-bit lanes); `broadcast(uint32_t)`; `Keys`, the key of every round, made once
// a call by `keys(k0, k1)`; `blocks(first, keys, out)`, the four words of blocks first .. first + kWidth - 1; `factor(word, threshold, scale)`, scale in the lanes whose word is
// >= threshold and 0 elsewhere; `lanes(word, out)`, the words as an array for the tail.
template <typename V, typename R, typename S>
void dropout_range(const S* x, S* y, int64_t begin, int64_t end, uint64_t seed, uint32_t threshold, float scale) {
  constexpr int kWidth = V::kWidth;
  static_assert(16 % kWidth == 0, "a tile's 16 blocks must split into whole vectors");
  const auto threshold_v = R::broadcast(threshold);
  const auto scale_v = V::set1(scale);
  const typename R::Keys keys = R::keys(static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
  for (int64_t tile = begin / 64; tile * 64 < end; ++tile) {
    for (int j = 0; j < 16; j += kWidth) {  // lanes j .. j + kWidth - 1 of the tile's 16 blocks
      typename R::Words words[4];
      R::blocks(static_cast<uint64_t>(16 * tile + j), keys, words);
      for (int w = 0; w < 4; ++w) {
        const int64_t i = 64 * tile + 16 * w + j;  // the element that lane 0 of word w belongs to
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
