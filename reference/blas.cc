#include "reference/blas.h"

#include "reference/gemm_small.h"

#include <dlfcn.h>

#include <climits>
#include <cstdlib>
#include <cstring>

#if DDPCHECK_HAVE_BLAS
extern "C" {
void sgemm_(const char* ta, const char* tb, const int* m, const int* n, const int* k, const float* alpha,
            const float* a, const int* lda, const float* b, const int* ldb, const float* beta, float* c, const int* ldc);
void dgemm_(const char* ta, const char* tb, const int* m, const int* n, const int* k, const double* alpha,
            const double* a, const int* lda, const double* b, const int* ldb, const double* beta, double* c,
            const int* ldc);
}
#endif

namespace ddpcheck::ref {

namespace {

struct Backend {
  bool use = false;
  std::string name;
};

const Backend& TheBackend() {
  static const Backend b = [] {
    Backend r;
#if DDPCHECK_HAVE_BLAS
    const char* env = std::getenv("DDPCHECK_BLAS");
    if (env && std::strcmp(env, "eigen") == 0) {
      r.name = "eigen (DDPCHECK_BLAS=eigen)";
      return r;
    }
    // OpenBLAS names itself; the netlib reference BLAS has neither symbol. Asked of the library sgemm_ was
    // bound to (and what it depends on), not of the process: an OpenBLAS loaded by something else must not
    // vouch for a netlib sgemm_.
    using SetThreads = void (*)(int);
    using GetConfig = char* (*)();
    SetThreads set_threads = nullptr;
    GetConfig get_config = nullptr;
    Dl_info info{};
    if (dladdr(reinterpret_cast<void*>(&sgemm_), &info) != 0 && info.dli_fname != nullptr) {
      if (void* lib = dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD)) {
        set_threads = reinterpret_cast<SetThreads>(dlsym(lib, "openblas_set_num_threads"));
        get_config = reinterpret_cast<GetConfig>(dlsym(lib, "openblas_get_config"));
      }
    }
    if (!set_threads || !get_config) {
      r.name = "eigen (libblas.so.3 is not OpenBLAS)";
      return r;
    }
    set_threads(1);
    r.use = true;
    r.name = std::string("openblas ") + get_config();
    if (SmallGemmAvailable()) r.name += "; batch-row products: ddpcheck avx512 (reference/gemm_small.h)";
#else
    r.name = "eigen (built without a BLAS)";
#endif
    return r;
  }();
  return b;
}

// The row-major product as the column-major BLAS sees it: C^T = op(B)^T op(A)^T, and a row-major X is the
// column-major X^T, so the operands swap and keep their flags.
template <typename T, typename Fn>
bool Gemm(Fn fn, bool ta, bool tb, int64_t m, int64_t n, int64_t k, const T* a, int64_t lda, const T* b, int64_t ldb,
          T beta, T* c) {
  if (!BlasTakes(m, n, k)) return false;
  for (int64_t v : {lda, ldb}) {
    if (v > INT_MAX) return false;
  }
  const char opb = tb ? 'T' : 'N', opa = ta ? 'T' : 'N';
  const int M = static_cast<int>(n), N = static_cast<int>(m), K = static_cast<int>(k);
  const int LDB = static_cast<int>(ldb), LDA = static_cast<int>(lda), LDC = static_cast<int>(n);
  const T one = 1;
  fn(&opb, &opa, &M, &N, &K, &one, b, &LDB, a, &LDA, &beta, c, &LDC);
  return true;
}

}  // namespace

const std::string& BlasBackend() { return TheBackend().name; }

bool BlasTakes(int64_t m, int64_t n, int64_t k) {
  if (m * n * k < (int64_t{1} << 18) || !TheBackend().use) return false;
  for (int64_t v : {m, n, k}) {
    if (v > INT_MAX) return false;
  }
  return true;
}

bool BlasGemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
              int64_t ldb, float beta, float* c) {
#if DDPCHECK_HAVE_BLAS
  if (BlasTakes(m, n, k) && SmallGemm(trans_a, trans_b, m, n, k, a, lda, b, ldb, beta, c)) return true;
  return Gemm<float>(sgemm_, trans_a, trans_b, m, n, k, a, lda, b, ldb, beta, c);
#else
  return false;
#endif
}

bool BlasGemmOverZeros(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
                       const float* b, int64_t ldb, float* c) {
#if DDPCHECK_HAVE_BLAS
  // Where BlasGemm(beta 1) runs SmallGemm's A^T B kernel, that kernel adds to +0 without reading C.
  return BlasTakes(m, n, k) && SmallGemmOverZeros(trans_a, trans_b, m, n, k, a, lda, b, ldb, c);
#else
  return false;
#endif
}

bool BlasGemmOverZeros(bool, bool, int64_t, int64_t, int64_t, const double*, int64_t, const double*, int64_t,
                       double*) {
  return false;
}

bool BlasGemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const double* a, int64_t lda,
              const double* b, int64_t ldb, double beta, double* c) {
#if DDPCHECK_HAVE_BLAS
  return Gemm<double>(dgemm_, trans_a, trans_b, m, n, k, a, lda, b, ldb, beta, c);
#else
  return false;
#endif
}

}  // namespace ddpcheck::ref
