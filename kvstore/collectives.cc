// Blocking MPI collectives on raw buffers: the only place that calls
// MPI_Allreduce / MPI_Bcast. Executors decide when and on which thread.
#include <cstring>
#include <limits>
#include <mutex>

#include "request.h"

namespace mxnet_mpi {
namespace {

// float16 has no MPI datatype: sum it as 2-byte words with a user op that
// adds in float32 and rounds once, which is what numpy does for float16.
void HalfSum(void* invec, void* inoutvec, int* len, MPI_Datatype*) {
  const _Float16* a = static_cast<const _Float16*>(invec);
  _Float16* b = static_cast<_Float16*>(inoutvec);
  for (int i = 0; i < *len; ++i) {
    b[i] = static_cast<_Float16>(static_cast<float>(a[i]) + static_cast<float>(b[i]));
  }
}

MPI_Op HalfSumOp() {
  static MPI_Op op = MPI_OP_NULL;
  static std::once_flag once;
  std::call_once(once, [] { MPI_Op_create(&HalfSum, /*commute=*/1, &op); });
  return op;
}

MPI_Datatype MpiType(int dtype) {
  switch (dtype) {
    case kFloat32: return MPI_FLOAT;
    case kFloat64: return MPI_DOUBLE;
    case kFloat16: return MPI_UINT16_T;
    case kUint8: return MPI_UINT8_T;
    case kInt32: return MPI_INT32_T;
    case kInt8: return MPI_INT8_T;
    case kInt64: return MPI_INT64_T;
    default: return MPI_DATATYPE_NULL;
  }
}

std::string MpiError(const char* what, int code, const std::string& name) {
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, msg, &len);
  return std::string("mxnet_mpi: ") + what + " failed for '" + name + "': " +
         std::string(msg, len);
}

}  // namespace

int DTypeSize(int dtype) {
  switch (dtype) {
    case kFloat32: case kInt32: return 4;
    case kFloat64: case kInt64: return 8;
    case kFloat16: return 2;
    case kUint8: case kInt8: return 1;
    default: return 0;
  }
}

std::string RunBlocking(const Request& r) {
  if (r.count == 0) return "";
  const MPI_Datatype type = MpiType(r.dtype);
  const int esize = DTypeSize(r.dtype);
  if (type == MPI_DATATYPE_NULL) return "mxnet_mpi: unsupported dtype code " + std::to_string(r.dtype);
  const MPI_Op op = r.dtype == kFloat16 ? HalfSumOp() : MPI_SUM;
  // MPI counts are int: split larger arrays into chunks.
  const int64_t kChunk = std::numeric_limits<int>::max() / 8;
  char* out = static_cast<char*>(r.out);
  const char* in = static_cast<const char*>(r.in);
  if (r.op == OpKind::kBroadcast) {
    int rank = 0;
    MPI_Comm_rank(r.comm, &rank);
    if (rank == r.root && in != out) std::memcpy(out, in, r.count * esize);
  }
  for (int64_t off = 0; off < r.count; off += kChunk) {
    const int n = static_cast<int>(std::min(kChunk, r.count - off));
    char* o = out + off * esize;
    int rc;
    if (r.op == OpKind::kAllreduce) {
      const void* src = in == out ? MPI_IN_PLACE : static_cast<const void*>(in + off * esize);
      rc = MPI_Allreduce(src, o, n, type, op, r.comm);
      if (rc != MPI_SUCCESS) return MpiError("MPI_Allreduce", rc, r.name);
    } else {
      rc = MPI_Bcast(o, n, type, r.root, r.comm);
      if (rc != MPI_SUCCESS) return MpiError("MPI_Bcast", rc, r.name);
    }
  }
  return "";
}

}  // namespace mxnet_mpi
