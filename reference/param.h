// Storage shared by the reference layers: the row-major Matrix, a parameter with torch's grad semantics,
// a buffer, and the portable uniform draw used for initialisation and dropout masks.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <random>
#include <utility>
#include <vector>

#include <Eigen/Dense>

#include "core/check.h"
#include "core/tensor.h"
#include "reference/blas.h"

namespace ddpcheck::ref {

// Activations are (B, features), row-major like torch's contiguous tensors.
template <class T>
using Matrix = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class T>
using RowVector = Eigen::Matrix<T, 1, Eigen::Dynamic>;

// Called by a layer's Backward with the layer-local slot of a parameter whose gradient just became final.
// Storage that Eigen maps: aligned to Eigen's packet alignment, so the vectorized kernels (reductions, small
// products) peel the same leading elements in every process and run: with AVX (-march=native) a plain
// std::vector would be 16-byte aligned or not by chance, and their summation order (the last bits) with it.
template <class T>
using AlignedVector = std::vector<T, Eigen::aligned_allocator<T>>;

// May be empty.
using SlotReadyFn = std::function<void(int slot)>;

// A leaf tensor that requires grad. `grad` always has storage (numel values); `grad_defined` is torch's
// `param.grad is not None`.
template <class T>
struct Param {
  std::vector<int64_t> shape;
  AlignedVector<T> value;
  AlignedVector<T> grad;
  bool grad_defined = false;
  // The grad holds +0 everywhere since zero_grad (set_to_none=False) and nothing has written it since (a
  // writer through Model::grad_data clears it): accumulating is then 0 + g, computed in place.
  bool grad_zeroed = false;
  // zero_grad without writing a model's size of zeros (ZeroLazily): the grad is +0 everywhere (grad_zeroed) while
  // its storage still holds older values, until the first reader asks for it (grad_ptr writes the zeros then) or
  // a weight gradient's product is written over it as 0 + the product (AccumulateGemm, never reading them).
  // Atomic, and filled under a lock: const readers of one parameter may run on several threads.
  mutable std::atomic<bool> zero_pending{false};

  Param() = default;
  explicit Param(std::vector<int64_t> s)
      : shape(std::move(s)),
        value(static_cast<size_t>(core::NumelOf(shape)), T(0)),
        grad(static_cast<size_t>(core::NumelOf(shape)), T(0)) {}

  // The grad's storage lives elsewhere while set (a CPU world's DDP bucket slot: Replica::ShareGradStorage),
  // so the reducer neither copies the grad into its bucket nor the reduced bucket back. A copy of the
  // parameter owns its grad again (the values copied): two models never share one grad.
  T* grad_view = nullptr;

  Param(const Param& o) { *this = o; }
  Param& operator=(const Param& o) {
    if (this == &o) return *this;
    shape = o.shape;
    value = o.value;
    grad.assign(o.grad_ptr(), o.grad_ptr() + o.grad.size());
    grad_view = nullptr;
    grad_defined = o.grad_defined;
    grad_zeroed = o.grad_zeroed;
    zero_pending.store(false);
    return *this;
  }
  Param(Param&& o) noexcept { *this = std::move(o); }
  Param& operator=(Param&& o) noexcept {
    if (this == &o) return *this;
    shape = std::move(o.shape);
    value = std::move(o.value);
    grad = std::move(o.grad);
    grad_view = o.grad_view;
    grad_defined = o.grad_defined;
    grad_zeroed = o.grad_zeroed;
    zero_pending.store(o.zero_pending.load());
    return *this;
  }

  int64_t numel() const { return static_cast<int64_t>(value.size()); }
  // The grad's storage, its pending zeros written first.
  T* grad_ptr() {
    WritePendingZeros();
    return grad_storage();
  }
  const T* grad_ptr() const {
    WritePendingZeros();
    return grad_storage();
  }
  // zero_grad(set_to_none=False) of a defined grad: +0 everywhere, written by the first reader (see zero_pending).
  void ZeroLazily() {
    grad_zeroed = true;
    zero_pending.store(true, std::memory_order_release);
  }
  // Moves the grad's storage to `storage` (numel values, its current values copied there) or, with nullptr,
  // back into the parameter's own.
  void SetGradStorage(T* storage) {
    if (storage == grad_ptr()) return;
    std::copy(grad_ptr(), grad_ptr() + grad.size(), storage ? storage : grad.data());
    grad_view = storage;
  }
  // The value viewed as (rows, cols); rows * cols must equal numel.
  Eigen::Map<const Matrix<T>> Value(int64_t rows, int64_t cols) const {
    DDPCHECK_CHECK_EQ(rows * cols, numel());
    return Eigen::Map<const Matrix<T>>(value.data(), rows, cols);
  }
  Eigen::Map<const RowVector<T>> ValueRow() const { return {value.data(), numel()}; }

  // Autograd's AccumulateGrad: an undefined grad becomes a copy of g (so -0.0 stays -0.0), a defined one
  // gets grad += g. g must have numel elements (any shape, read in row-major order). g (a product, say) is
  // evaluated straight into the grad when undefined, else into a scratch kept by the calling thread and then
  // added: the same values as evaluating it into a temporary (g never aliases the grad), without allocating
  // and faulting in a fresh temporary of the parameter's size on every backward.
  template <class Derived>
  void Accumulate(const Eigen::MatrixBase<Derived>& g) {
    DDPCHECK_CHECK_EQ(static_cast<int64_t>(g.size()), numel());
    Eigen::Map<Matrix<T>> dst(grad_ptr(), g.rows(), g.cols());
    if (grad_defined && grad_zeroed) {
      // 0 + g, element by element, as adding a temporary would (and +0 for a -0 of g, as it would).
      dst.noalias() += g;
      grad_zeroed = false;
    } else if (grad_defined) {
      Eigen::Map<Matrix<T>, Eigen::Aligned16> tmp(Scratch(), g.rows(), g.cols());
      tmp.noalias() = g;
      dst += tmp;
    } else {
      dst.noalias() = g;
      grad_defined = true;
    }
  }

  // Accumulate(op(A) op(B)) for row-major A, B (reference/blas.h's BlasGemm): the grad is the (m x n) product.
  // False, changing nothing, when the BLAS does not take it (the caller then calls Accumulate with Eigen's
  // product); the values are the BLAS's product added as Accumulate adds.
  bool AccumulateGemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const T* a, int64_t lda, const T* b,
                      int64_t ldb) {
    DDPCHECK_CHECK_EQ(m * n, numel());
    if (grad_defined && grad_zeroed && zero_pending.load(std::memory_order_acquire) &&
        BlasGemmOverZeros(trans_a, trans_b, m, n, k, a, lda, b, ldb, grad_storage())) {
      zero_pending.store(false, std::memory_order_release);  // 0 + the product, written over the stale values
      grad_zeroed = false;
      return true;
    }
    if (!grad_defined || grad_zeroed) {
      // Undefined: the product itself; zeroed: 0 + the product, which the BLAS adds into C (beta = 1).
      if (!BlasGemm(trans_a, trans_b, m, n, k, a, lda, b, ldb, grad_defined ? T(1) : T(0), grad_ptr())) return false;
    } else {
      T* scratch = Scratch();
      if (!BlasGemm(trans_a, trans_b, m, n, k, a, lda, b, ldb, T(0), scratch)) return false;
      Eigen::Map<Matrix<T>>(grad_ptr(), m, n) += Eigen::Map<const Matrix<T>>(scratch, m, n);
    }
    grad_defined = true;
    grad_zeroed = false;
    return true;
  }

 private:
  T* grad_storage() const { return const_cast<T*>(grad_view ? grad_view : grad.data()); }
  void WritePendingZeros() const {
    if (!zero_pending.load(std::memory_order_acquire)) return;
    static std::mutex mu;
    std::lock_guard<std::mutex> lock(mu);
    if (!zero_pending.load(std::memory_order_relaxed)) return;
    std::fill(grad_storage(), grad_storage() + grad.size(), T(0));
    zero_pending.store(false, std::memory_order_release);
  }
  // Room for one grad of this size, kept by the calling thread (a rank's) across backwards.
  T* Scratch() const {
    thread_local AlignedVector<T> scratch;
    if (scratch.size() < grad.size()) scratch.resize(grad.size());
    return scratch.data();
  }
};

// A tensor that is state but not a parameter (running_mean, running_var, num_batches_tracked).
template <class T>
struct Buffer {
  std::vector<int64_t> shape;
  AlignedVector<T> value;
  core::DType dtype = core::DTypeOf<T>();  // num_batches_tracked: kInt64 (the value is still held in T)

  Buffer() = default;
  Buffer(std::vector<int64_t> s, T fill, core::DType d = core::DTypeOf<T>())
      : shape(std::move(s)), value(static_cast<size_t>(core::NumelOf(shape)), fill), dtype(d) {}
  int64_t numel() const { return static_cast<int64_t>(value.size()); }
};

// A uniform double in [0, 1) from the top 53 bits of one 64-bit draw. Unlike
// std::uniform_real_distribution its result is the same on every standard library.
inline double PortableUniform(std::mt19937_64& rng) {
  return static_cast<double>(rng() >> 11) * (1.0 / 9007199254740992.0);  // 2^-53
}

}  // namespace ddpcheck::ref
