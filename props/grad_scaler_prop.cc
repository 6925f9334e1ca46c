// Properties of the GradScaler update and unscale. Replay a failure with RC_PARAMS="seed=N".
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>

#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include "core/grad_scaler.h"

namespace ddpcheck::core {
namespace {

RC_GTEST_PROP(GradScaler, WithoutInfsTheScaleDoublesEveryGrowthIntervalUntilItWouldOverflow, ()) {
  const int e0 = *rc::gen::inRange(-126, 128);  // initial scale 2^e0, a normal power of two
  const int interval = *rc::gen::inRange(1, 51);
  const int steps = *rc::gen::inRange(0, 600);
  GradScaler s;
  RC_ASSERT(GradScaler::Create({std::ldexp(1.0, e0), 2.0, 0.5, interval}, &s).ok());
  for (int i = 0; i < steps; ++i) s.Update(false);
  const int e = std::min(e0 + steps / interval, 127);  // 2^128 is inf in float32: growth refused from 2^127
  RC_ASSERT(static_cast<double>(s.scale()) == std::ldexp(1.0, e));
  RC_ASSERT(s.growth_tracker() == steps % interval);
}

RC_GTEST_PROP(GradScaler, PowerOfTwoScaleThenInvScaleGivesBackEveryNormalFloatExactly, ()) {
  // x = +-1.m * 2^ex (normal); the scale 2^e keeps x * 2^e normal and finite, so both products are exact.
  const auto mantissa = *rc::gen::inRange<uint32_t>(0, 1u << 23);
  const int ex = *rc::gen::inRange(-126, 128);
  const bool negative = *rc::gen::arbitrary<bool>();
  const float x = (negative ? -1.0f : 1.0f) * std::ldexp(1.0f + static_cast<float>(mantissa) * 0x1p-23f, ex);
  const int e = *rc::gen::inRange(std::max(-126, -126 - ex), std::min(127, 128 - ex));
  GradScaler s;
  RC_ASSERT(GradScaler::Create({std::ldexp(1.0, e), 2.0, 0.5, 2000}, &s).ok());
  const float scaled = x * s.scale();
  RC_ASSERT(std::isnormal(scaled));
  RC_ASSERT(std::bit_cast<uint32_t>(UnscaleValue(scaled, s.inv_scale())) == std::bit_cast<uint32_t>(x));
}

}  // namespace
}  // namespace ddpcheck::core
