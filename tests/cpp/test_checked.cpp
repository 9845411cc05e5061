// ember/checked.h: size arithmetic from user input overflows into a ValueError, never into a wrapped size.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>

#include "ember/checked.h"
#include "ember/errors.h"

namespace ember {
namespace {

constexpr int64_t kMax = std::numeric_limits<int64_t>::max();

TEST(Checked, MultipliesWhatFits) {
  EXPECT_EQ(checked::mul("op", "n", 3, 4), 12);
  EXPECT_EQ(checked::mul("op", "n", 2, 3, 4, 5), 120);
  EXPECT_EQ(checked::mul("op", "n", 0, kMax), 0);
  EXPECT_EQ(checked::mul("op", "n", 1, kMax), kMax);
  EXPECT_EQ(checked::add("op", "n", kMax - 1, 1), kMax);
}

TEST(Checked, RefusesOverflowAndNegativeFactorsNamingTheQuantity) {
  EXPECT_THROW(checked::mul("op", "n", kMax, 2), ValueError);
  EXPECT_THROW(checked::mul("op", "n", int64_t{1} << 31, int64_t{1} << 31, 4), ValueError);
  EXPECT_THROW(checked::mul("op", "n", -1, 2), ValueError);
  EXPECT_THROW(checked::add("op", "n", kMax, 1), ValueError);
  try {
    checked::mul("roi_align", "the sample taps of a box", kMax, kMax);
    FAIL() << "no exception";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("roi_align: the sample taps of a box overflows int64"), std::string::npos)
        << e.what();
  }
}

TEST(Checked, ArrayCountsMustBeAllocatable) {
  EXPECT_EQ(checked::array_count("op", "n", 1000, 8), 1000);
  EXPECT_THROW(checked::array_count("op", "n", kMax / 4, 8), ValueError);
}

TEST(Checked, FloatToIntegerRefusesWhatTheCastCannotHold) {
  EXPECT_EQ(checked::to_int64("op", "n", 12.0), 12);
  EXPECT_EQ(checked::to_int64("op", "n", -3.0), -3);
  EXPECT_THROW(checked::to_int64("op", "n", 1e19), ValueError);
  EXPECT_THROW(checked::to_int64("op", "n", -1e19), ValueError);
  EXPECT_THROW(checked::to_int64("op", "n", std::numeric_limits<double>::infinity()), ValueError);
  EXPECT_THROW(checked::to_int64("op", "n", std::numeric_limits<double>::quiet_NaN()), ValueError);
}

}  // namespace
}  // namespace ember
