// Eight doubles at a time without a branch, through GCC's vector extensions (one AVX-512 register with
// -march=native on this project's machines, two or four narrower ones elsewhere): for the scans over whole
// traces (the comparison's statistics, the divergence map, the reference scales), where a scalar loop of
// selects and maxima ran one element per several cycles. A maximum or minimum over lanes is the same value as
// over the elements in order; each select keeps std::max's and std::min's NaN rule (a NaN candidate is ignored).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>

namespace ddpcheck::core::lanes {

using V8d = double __attribute__((vector_size(64)));
using V8l = int64_t __attribute__((vector_size(64)));
using V8ul = uint64_t __attribute__((vector_size(64)));
using V8f = float __attribute__((vector_size(32)));
using V8i = int32_t __attribute__((vector_size(32)));

inline V8d Load(const double* p) {
  V8d v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
// The first `count` (< 8) values, the other lanes 0: a scan's last, partial group (a 0 against a 0 adds nothing
// to any of its maxima, minima or counts).
inline V8d LoadPartial(const double* p, size_t count) {
  V8d v = {};
  std::memcpy(&v, p, count * sizeof(double));
  return v;
}
// Lanes [i, i + 8) of p[0, n), zero-padded past n.
inline V8d LoadAt(const double* p, size_t i, size_t n) { return i + 8 <= n ? Load(p + i) : LoadPartial(p + i, n - i); }
inline V8d Splat(double x) { return V8d{} + x; }
inline V8d Select(V8l mask, V8d a, V8d b) { return mask ? a : b; }
inline V8d Abs(V8d v) {
  V8l bits;
  std::memcpy(&bits, &v, sizeof bits);
  bits &= std::numeric_limits<int64_t>::max();
  std::memcpy(&v, &bits, sizeof v);
  return v;
}
// std::max(m, x) and std::min(m, x), lane by lane.
inline V8d Max(V8d m, V8d x) { return Select(m < x, x, m); }
inline V8d Min(V8d m, V8d x) { return Select(x < m, x, m); }
inline double MaxOf(V8d v, double m) {
  for (int l = 0; l < 8; ++l) m = m < v[l] ? v[l] : m;
  return m;
}
inline double MinOf(V8d v, double m) {
  for (int l = 0; l < 8; ++l) m = v[l] < m ? v[l] : m;
  return m;
}
inline int64_t SumOf(V8l v) {
  int64_t s = 0;
  for (int l = 0; l < 8; ++l) s += v[l];
  return s;
}

}  // namespace ddpcheck::core::lanes
