// The one vocabulary for numbers that cross module boundaries.
//   DType   element types ddpcheck knows (the ones DDP buckets are keyed by, plus index types).
//   Tensor  a host-side value for traces, reports and files: shape + values held as double. Every float16,
//           bfloat16, float32 and int32 value (and int64 up to 2^53) is exact in a double, so a Tensor is a
//           lossless carrier; `dtype` says what precision the values were computed in.
//   Span    a typed, non-owning view of memory on some device (host for CPU, device memory for CUDA): what
//           communicators and replicas exchange.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace ddpcheck::core {

enum class DType { kFloat16, kBFloat16, kFloat32, kFloat64, kInt32, kInt64 };

// Bytes per element: 2, 2, 4, 8, 4, 8.
int64_t ElementSize(DType dtype);
// Torch spelling: "float16", "bfloat16", "float32", "float64", "int32", "int64".
std::string DTypeName(DType dtype);
// Accepts the torch spelling and the short one ("fp16", "bf16", "fp32", "fp64", "f32", "f64", "i32", "i64").
bool ParseDType(const std::string& name, DType* out);
// Unit roundoff u = 2^-p for floating types (2^-11, 2^-8, 2^-24, 2^-53); 0 for integers.
double UnitRoundoff(DType dtype);
bool IsFloating(DType dtype);

int64_t NumelOf(const std::vector<int64_t>& shape);
// For shapes read from input: true, with *numel set, when every size is >= 0 and the product is at most
// `max_numel` (checked without overflow); false otherwise.
bool CheckedNumel(const std::vector<int64_t>& shape, int64_t max_numel, int64_t* numel);
std::string ShapeString(const std::vector<int64_t>& shape);  // "(16, 8)", "()" for a scalar

struct Tensor {
  DType dtype = DType::kFloat64;
  std::vector<int64_t> shape;
  std::vector<double> data;  // C order

  Tensor() = default;
  Tensor(DType d, std::vector<int64_t> s, std::vector<double> v) : dtype(d), shape(std::move(s)), data(std::move(v)) {}
  static Tensor Scalar(double v, DType d = DType::kFloat64) { return Tensor(d, {}, {v}); }
  static Tensor Zeros(DType d, std::vector<int64_t> s) {
    std::vector<double> v(static_cast<size_t>(NumelOf(s)), 0.0);
    return Tensor(d, std::move(s), std::move(v));
  }
  int64_t numel() const { return static_cast<int64_t>(data.size()); }
};

// True when dtype, shape and every value's bits are equal (NaN equals NaN with the same bits).
bool BitwiseEqual(const Tensor& a, const Tensor& b);

// A recorded value (core/trace.h's records), held compactly where it can be: float32 values as floats, half a
// double's memory, widened into a Tensor only when first read as one (once, thread-safe; the floats are then
// released, so a widened value costs what a Tensor does). A 10M-parameter world's trace holds every rank's
// float32 gradients for the check (gigabytes as doubles: bench/README.md); a check whose world agrees with its
// reference never reads them as doubles. Not copyable: held by shared_ptr.
class RecordValue {
 public:
  explicit RecordValue(Tensor t) : t_(std::move(t)), numel_(t_.numel()) {}
  // float32 values held as floats; values.size() == NumelOf(shape).
  RecordValue(std::vector<int64_t> shape, std::vector<float> values);
  RecordValue(const RecordValue&) = delete;
  RecordValue& operator=(const RecordValue&) = delete;

  DType dtype() const { return t_.dtype; }
  const std::vector<int64_t>& shape() const { return t_.shape; }
  int64_t numel() const { return numel_; }
  using Floats = std::shared_ptr<const std::vector<float>>;
  // The values as floats while held compactly, else nullptr (also once widened). The pointer keeps them alive
  // for its holder while another thread widens the value.
  Floats floats() const {
    std::lock_guard<std::mutex> lock(mu_);
    return floats_;
  }
  // The value as a Tensor (widened on first use when compact).
  const Tensor& tensor() const;
  // True once a compact value has been widened.
  bool widened() const { return widened_flag_.load(std::memory_order_acquire); }

 private:
  mutable Tensor t_;  // dtype and shape always; data unless compact and not yet widened (then written once)
  mutable std::mutex mu_;
  mutable Floats floats_;
  int64_t numel_ = 0;
  mutable std::once_flag widened_;
  mutable std::atomic<bool> widened_flag_{false};
};

// BitwiseEqual over records, reading compact values as they are held (no widening).
bool BitwiseEqual(const RecordValue& a, const RecordValue& b);
bool BitwiseEqual(const RecordValue& a, const Tensor& b);

// True when each of the n values at p, widened to a double, is bitwise equal to host's (n == host.size()).
template <typename T>
bool WidenedBitwiseEqual(const T* p, const std::vector<double>& host) {
  bool same = true;
  for (size_t i = 0; i < host.size(); ++i) {
    const double d = static_cast<double>(p[i]);
    uint64_t a, b;
    std::memcpy(&a, &d, sizeof a);
    std::memcpy(&b, &host[i], sizeof b);
    same &= a == b;
    if ((i & 4095) == 4095 && !same) return false;  // blocks of 4096 stay branch-free (vectorised)
  }
  return same;
}

struct Span {
  void* data = nullptr;
  int64_t numel = 0;
  DType dtype = DType::kFloat32;
  int64_t bytes() const { return numel * ElementSize(dtype); }
};
struct ConstSpan {
  const void* data = nullptr;
  int64_t numel = 0;
  DType dtype = DType::kFloat32;
  ConstSpan() = default;
  ConstSpan(const void* d, int64_t n, DType t) : data(d), numel(n), dtype(t) {}
  ConstSpan(const Span& s) : data(s.data), numel(s.numel), dtype(s.dtype) {}  // NOLINT: implicit by design
  int64_t bytes() const { return numel * ElementSize(dtype); }
};

template <typename T> constexpr DType DTypeOf();
template <> constexpr DType DTypeOf<float>() { return DType::kFloat32; }
template <> constexpr DType DTypeOf<double>() { return DType::kFloat64; }
template <> constexpr DType DTypeOf<int32_t>() { return DType::kInt32; }
template <> constexpr DType DTypeOf<int64_t>() { return DType::kInt64; }

}  // namespace ddpcheck::core
