// float16 conversions and sums for fp16 compression and float16 arrays: the
// CPU's F16C instructions where it has them (runtime check), else scalar code.
// Both round to nearest even, so every rank gets the same bits either way.
#ifndef MXNET_MPI_HALF_H_
#define MXNET_MPI_HALF_H_

#include <cstdint>

namespace mxnet_mpi {

void FloatToHalf(const float* src, _Float16* dst, int64_t n);
void HalfToFloat(const _Float16* src, float* dst, int64_t n);
// float64 goes to float16 directly (through float32 it could round twice); scalar.
void DoubleToHalf(const double* src, _Float16* dst, int64_t n);
void HalfToDouble(const _Float16* src, double* dst, int64_t n);
// inout[i] = half(float(in[i]) + float(inout[i]))
void AddHalf(const _Float16* in, _Float16* inout, int64_t n);
// out[i] = half((float(blocks[0][i]) + ... + float(blocks[p-1][i])) / divide_by),
// summed in rank order; block r starts at blocks + r * n.
void SumHalfBlocks(const _Float16* blocks, int p, int64_t n, int divide_by, _Float16* out);

}  // namespace mxnet_mpi

#endif  // MXNET_MPI_HALF_H_
