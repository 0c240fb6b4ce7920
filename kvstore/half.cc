// Without F16C, GCC converts _Float16 through library calls (one per element):
// fp16 compression of a 43 MB gradient then cost more than the bytes it saved.
#include "half.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define MXNET_MPI_X86 1
#endif

namespace mxnet_mpi {
namespace {

void FloatToHalfScalar(const float* s, _Float16* d, int64_t n) {
  for (int64_t i = 0; i < n; ++i) d[i] = static_cast<_Float16>(s[i]);
}

void HalfToFloatScalar(const _Float16* s, float* d, int64_t n) {
  for (int64_t i = 0; i < n; ++i) d[i] = static_cast<float>(s[i]);
}

void AddHalfScalar(const _Float16* a, _Float16* b, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    b[i] = static_cast<_Float16>(static_cast<float>(a[i]) + static_cast<float>(b[i]));
}

// Elements [from, n) of SumHalfBlocks (block r starts at blocks + r * n).
void SumHalfBlocksScalar(const _Float16* blocks, int p, int64_t n, int divide_by,
                         _Float16* out, int64_t from = 0) {
  for (int64_t i = from; i < n; ++i) {
    float acc = 0;
    for (int r = 0; r < p; ++r) acc += static_cast<float>(blocks[r * n + i]);
    if (divide_by > 1) acc /= static_cast<float>(divide_by);
    out[i] = static_cast<_Float16>(acc);
  }
}

#ifdef MXNET_MPI_X86
constexpr int kRound = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;

__attribute__((target("avx,f16c"))) __m256 Load8(const _Float16* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

__attribute__((target("avx,f16c"))) void Store8(_Float16* p, __m256 v) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(v, kRound));
}

__attribute__((target("avx,f16c"))) void FloatToHalfF16C(const float* s, _Float16* d,
                                                           int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) Store8(d + i, _mm256_loadu_ps(s + i));
  FloatToHalfScalar(s + i, d + i, n - i);
}

__attribute__((target("avx,f16c"))) void HalfToFloatF16C(const _Float16* s, float* d,
                                                           int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(d + i, Load8(s + i));
  HalfToFloatScalar(s + i, d + i, n - i);
}

__attribute__((target("avx,f16c"))) void AddHalfF16C(const _Float16* a, _Float16* b,
                                                       int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) Store8(b + i, _mm256_add_ps(Load8(a + i), Load8(b + i)));
  AddHalfScalar(a + i, b + i, n - i);
}

__attribute__((target("avx,f16c"))) void SumHalfBlocksF16C(const _Float16* blocks, int p,
                                                             int64_t n, int divide_by,
                                                             _Float16* out) {
  const __m256 by = _mm256_set1_ps(static_cast<float>(divide_by));
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 acc = _mm256_setzero_ps();
    for (int r = 0; r < p; ++r) acc = _mm256_add_ps(acc, Load8(blocks + r * n + i));
    if (divide_by > 1) acc = _mm256_div_ps(acc, by);
    Store8(out + i, acc);
  }
  SumHalfBlocksScalar(blocks, p, n, divide_by, out, i);   // the last n % 8
}

bool HasF16C() {
  static const bool yes = __builtin_cpu_supports("avx") && __builtin_cpu_supports("f16c");
  return yes;
}
#endif

}  // namespace

void FloatToHalf(const float* src, _Float16* dst, int64_t n) {
#ifdef MXNET_MPI_X86
  if (HasF16C()) return FloatToHalfF16C(src, dst, n);
#endif
  FloatToHalfScalar(src, dst, n);
}

void HalfToFloat(const _Float16* src, float* dst, int64_t n) {
#ifdef MXNET_MPI_X86
  if (HasF16C()) return HalfToFloatF16C(src, dst, n);
#endif
  HalfToFloatScalar(src, dst, n);
}

void DoubleToHalf(const double* src, _Float16* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<_Float16>(src[i]);
}

void HalfToDouble(const _Float16* src, double* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<double>(src[i]);
}

void AddHalf(const _Float16* in, _Float16* inout, int64_t n) {
#ifdef MXNET_MPI_X86
  if (HasF16C()) return AddHalfF16C(in, inout, n);
#endif
  AddHalfScalar(in, inout, n);
}

void SumHalfBlocks(const _Float16* blocks, int p, int64_t n, int divide_by, _Float16* out) {
#ifdef MXNET_MPI_X86
  if (HasF16C()) return SumHalfBlocksF16C(blocks, p, n, divide_by, out);
#endif
  SumHalfBlocksScalar(blocks, p, n, divide_by, out);
}

}  // namespace mxnet_mpi
