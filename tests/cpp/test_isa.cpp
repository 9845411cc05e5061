#include <gtest/gtest.h>

#include "ember/cpu_features.h"
#include "ember/isa.h"
#include "isa_test_util.h"

namespace ember {
namespace {

TEST(Isa, NamesRoundTrip) {
  for (Isa isa : kAllIsas) {
    auto parsed = parse_isa(isa_name(isa));
    ASSERT_TRUE(parsed.has_value());
    EXPECT_EQ(*parsed, isa);
  }
  EXPECT_EQ(parse_isa("AVX512_BF16"), Isa::avx512_bf16);
  EXPECT_EQ(parse_isa("native"), Isa::amx);
  EXPECT_FALSE(parse_isa("sse9").has_value());
  EXPECT_FALSE(parse_isa("").has_value());
}

TEST(Isa, DetectedLevelMatchesFeatures) {
  const CpuFeatures& f = cpu_features();
  const Isa level = detected_isa();
  EXPECT_EQ(level >= Isa::avx2, f.avx2 && f.fma && f.f16c);
  EXPECT_EQ(level >= Isa::avx512, f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq);
  EXPECT_EQ(level >= Isa::avx512_bf16, level >= Isa::avx512 && f.avx512_bf16);
  EXPECT_EQ(level == Isa::amx, level >= Isa::avx512_bf16 && f.amx_tile && f.amx_bf16 && f.amx_int8 && f.amx_permitted);
  // AVX-512 sub-features need AVX-512F; AMX permission needs AMX.
  if (!f.avx512f) {
    EXPECT_FALSE(f.avx512bw || f.avx512vl || f.avx512_bf16 || f.avx512_fp16);
  }
  if (!f.amx_tile) {
    EXPECT_FALSE(f.amx_permitted);
  }
  EXPECT_FALSE(f.vendor.empty());
}

TEST(Isa, CapLowersActiveLevelOnly) {
  for (Isa cap : kAllIsas) {
    testing::ScopedIsaCap scoped(cap);
    const Isa expected = static_cast<int>(cap) < static_cast<int>(detected_isa()) ? cap : detected_isa();
    EXPECT_EQ(active_isa(), expected) << isa_name(cap);
  }
}

TEST(Isa, SelectImplTakesHighestAllowed) {
  using Fn = int (*)();
  constexpr IsaImpl<Fn> impls[] = {
      {Isa::avx512, [] { return 3; }}, {Isa::avx2, [] { return 2; }}, {Isa::ref, [] { return 1; }}};
  EXPECT_EQ(select_impl(impls, Isa::amx).fn(), 3);
  EXPECT_EQ(select_impl(impls, Isa::avx512_bf16).fn(), 3);
  EXPECT_EQ(select_impl(impls, Isa::avx512).fn(), 3);
  EXPECT_EQ(select_impl(impls, Isa::avx2).fn(), 2);
  EXPECT_EQ(select_impl(impls, Isa::ref).fn(), 1);
}

}  // namespace
}  // namespace ember
