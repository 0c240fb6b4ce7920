// Plain (row-major) data pointers for a collective's arrays, also when MXNet
// holds them in a oneDNN layout (e.g. conv weights after an inference forward).
#ifndef MXNET_MPI_ONEDNN_H_
#define MXNET_MPI_ONEDNN_H_

#include <mxnet/c_api.h>

#include <memory>
#include <string>

namespace mxnet_mpi {

struct PlainData {
  void* in = nullptr;
  void* out = nullptr;
  std::shared_ptr<void> keep;  // a plain copy of `in`, alive until MPI is done
  std::string error;
};

// Called inside the engine op, which holds `in` (read) and `out` (write).
// MXNDArrayGetData would reorder a oneDNN array through the engine and wait
// on the variable this op holds: a deadlock. Reorder synchronously instead.
PlainData GetPlainData(NDArrayHandle in, NDArrayHandle out, size_t bytes);

}  // namespace mxnet_mpi

#endif  // MXNET_MPI_ONEDNN_H_
