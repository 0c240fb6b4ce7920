// Everything that looks inside MXNet's NDArray (C++ API): layout checks,
// memory aliasing, plain data pointers, resizing outputs.
#ifndef MXNET_MPI_NDARRAY_GLUE_H_
#define MXNET_MPI_NDARRAY_GLUE_H_

#include <mxnet/c_api.h>

#include <cstdint>
#include <memory>
#include <string>

namespace mxnet_mpi {

// "" if `h` is a dense host array of `dtype` with the given shape (ndim -1:
// any shape with `count` elements; kAnyShape: any), else a message starting
// with `what`.
constexpr int kAnyShape = -2;
std::string CheckArray(NDArrayHandle h, int dtype, const int64_t* shape, int ndim,
                       int64_t count, const std::string& what);

// MXNet's name of a dtype code ("float32", ...).
const char* DTypeName(int dtype);
// The engine variable of an array (views share their base array's).
const void* VarOf(NDArrayHandle h);
// [first, last) byte range of an array within its storage.
void ByteRange(NDArrayHandle h, int64_t* first, int64_t* last);

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

// Elements of an array.
int64_t SizeOf(NDArrayHandle h);

}  // namespace mxnet_mpi

#endif  // MXNET_MPI_NDARRAY_GLUE_H_
