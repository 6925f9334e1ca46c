#include "core/tensor.h"

#include <cstring>

namespace ddpcheck::core {

int64_t ElementSize(DType dtype) {
  switch (dtype) {
    case DType::kFloat16:
    case DType::kBFloat16: return 2;
    case DType::kFloat32:
    case DType::kInt32: return 4;
    case DType::kFloat64:
    case DType::kInt64: return 8;
  }
  return 0;
}

std::string DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kFloat16: return "float16";
    case DType::kBFloat16: return "bfloat16";
    case DType::kFloat32: return "float32";
    case DType::kFloat64: return "float64";
    case DType::kInt32: return "int32";
    case DType::kInt64: return "int64";
  }
  return "?";
}

bool ParseDType(const std::string& name, DType* out) {
  struct Alias { const char* name; DType dtype; };
  static const Alias kAliases[] = {
      {"float16", DType::kFloat16}, {"fp16", DType::kFloat16},   {"half", DType::kFloat16},
      {"bfloat16", DType::kBFloat16}, {"bf16", DType::kBFloat16},
      {"float32", DType::kFloat32}, {"fp32", DType::kFloat32},   {"f32", DType::kFloat32}, {"float", DType::kFloat32},
      {"float64", DType::kFloat64}, {"fp64", DType::kFloat64},   {"f64", DType::kFloat64}, {"double", DType::kFloat64},
      {"int32", DType::kInt32},     {"i32", DType::kInt32},
      {"int64", DType::kInt64},     {"i64", DType::kInt64},
  };
  for (const auto& a : kAliases) {
    if (name == a.name) { *out = a.dtype; return true; }
  }
  return false;
}

double UnitRoundoff(DType dtype) {
  switch (dtype) {
    case DType::kFloat16: return 0x1p-11;
    case DType::kBFloat16: return 0x1p-8;
    case DType::kFloat32: return 0x1p-24;
    case DType::kFloat64: return 0x1p-53;
    default: return 0.0;
  }
}

bool IsFloating(DType dtype) { return dtype != DType::kInt32 && dtype != DType::kInt64; }

int64_t NumelOf(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

bool CheckedNumel(const std::vector<int64_t>& shape, int64_t max_numel, int64_t* numel) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) return false;
    if (d == 0) n = 0;
  }
  for (int64_t d : shape) {
    if (n == 0) break;
    if (d > max_numel / n) return false;
    n *= d;
  }
  if (n > max_numel) return false;
  *numel = n;
  return true;
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + ")";
}

bool BitwiseEqual(const Tensor& a, const Tensor& b) {
  if (&a == &b) return true;
  if (a.dtype != b.dtype || a.shape != b.shape || a.data.size() != b.data.size()) return false;
  return a.data.empty() || std::memcmp(a.data.data(), b.data.data(), a.data.size() * sizeof(double)) == 0;
}

RecordValue::RecordValue(std::vector<int64_t> shape, std::vector<float> values)
    : t_(DType::kFloat32, std::move(shape), {}),
      floats_(std::make_shared<const std::vector<float>>(std::move(values))),
      numel_(static_cast<int64_t>(floats_->size())) {}

const Tensor& RecordValue::tensor() const {
  if (widened_flag_.load(std::memory_order_acquire)) return t_;
  std::call_once(widened_, [&] {
    const Floats f = floats();
    if (!f) return;  // held as a Tensor from the start
    t_.data.assign(f->begin(), f->end());
    {
      std::lock_guard<std::mutex> lock(mu_);
      floats_.reset();  // (freed once no reader holds them)
    }
    widened_flag_.store(true, std::memory_order_release);
  });
  return t_;
}

bool BitwiseEqual(const RecordValue& a, const RecordValue& b) {
  if (&a == &b) return true;
  if (a.dtype() != b.dtype() || a.shape() != b.shape() || a.numel() != b.numel()) return false;
  const RecordValue::Floats fa = a.floats(), fb = b.floats();
  if (fa && fb) {
    return a.numel() == 0 || std::memcmp(fa->data(), fb->data(), static_cast<size_t>(a.numel()) * sizeof(float)) == 0;
  }
  return fa ? BitwiseEqual(a, b.tensor()) : BitwiseEqual(b, a.tensor());  // one held as floats at most
}

bool BitwiseEqual(const RecordValue& a, const Tensor& b) {
  if (a.dtype() != b.dtype || a.shape() != b.shape || a.numel() != b.numel()) return false;
  if (const RecordValue::Floats f = a.floats()) return WidenedBitwiseEqual(f->data(), b.data);
  return BitwiseEqual(a.tensor(), b);
}

}  // namespace ddpcheck::core
