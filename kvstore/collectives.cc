// Blocking MPI collectives on raw buffers: the only place that calls
// MPI_Allreduce / MPI_Bcast. Executors decide when and on which thread.
#include <cstring>
#include <limits>
#include <mutex>

#include "health.h"
#include "request.h"
#include "timeline.h"

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

void Complete(const Request& r, const std::string& err) {
  FlightEnd(r.flight);
  TimelineRecord(r, err.empty());
  if (err.empty()) {
    r.on_complete();
  } else {
    dmlc::Error e(err);
    r.on_complete(&e);
  }
  if (r.done) r.done->set_value();
}

namespace {

// Calls issue(offset_bytes, count) for each MPI-count-sized chunk of `r`,
// after the root's local copy for an out-of-place broadcast.
template <typename Issue>
std::string ForEachChunk(const Request& r, Issue issue) {
  if (!r.error.empty()) return r.error;
  if (r.count == 0) return "";
  if (MpiType(r.dtype) == MPI_DATATYPE_NULL)
    return "mxnet_mpi: unsupported dtype code " + std::to_string(r.dtype);
  const int esize = DTypeSize(r.dtype);
  if (r.op == OpKind::kBroadcast && r.in != r.out) {
    int rank = 0;
    MPI_Comm_rank(r.comm, &rank);
    if (rank == r.root) std::memcpy(r.out, r.in, r.count * esize);
  }
  const int64_t kChunk = std::numeric_limits<int>::max() / 8;
  for (int64_t off = 0; off < r.count; off += kChunk) {
    const int n = static_cast<int>(std::min(kChunk, r.count - off));
    std::string err = issue(off * esize, n);
    if (!err.empty()) return err;
  }
  return "";
}

const void* SendBuf(const Request& r, int64_t byte_off) {
  return r.in == r.out ? MPI_IN_PLACE : static_cast<const char*>(r.in) + byte_off;
}

MPI_Op SumOp(int dtype) { return dtype == kFloat16 ? HalfSumOp() : MPI_SUM; }

}  // namespace

std::string RunBlocking(const Request& r) {
  return ForEachChunk(r, [&r](int64_t off, int n) -> std::string {
    void* o = static_cast<char*>(r.out) + off;
    int rc = r.op == OpKind::kAllreduce
                 ? MPI_Allreduce(SendBuf(r, off), o, n, MpiType(r.dtype), SumOp(r.dtype), r.comm)
                 : MPI_Bcast(o, n, MpiType(r.dtype), r.root, r.comm);
    return rc == MPI_SUCCESS ? "" : MpiError(r.op == OpKind::kAllreduce ? "MPI_Allreduce"
                                                                        : "MPI_Bcast", rc, r.name);
  });
}

std::string StartNonBlocking(const Request& r, std::vector<MPI_Request>* reqs) {
  return ForEachChunk(r, [&r, reqs](int64_t off, int n) -> std::string {
    void* o = static_cast<char*>(r.out) + off;
    MPI_Request q;
    int rc = r.op == OpKind::kAllreduce
                 ? MPI_Iallreduce(SendBuf(r, off), o, n, MpiType(r.dtype), SumOp(r.dtype),
                                  r.comm, &q)
                 : MPI_Ibcast(o, n, MpiType(r.dtype), r.root, r.comm, &q);
    if (rc != MPI_SUCCESS)
      return MpiError(r.op == OpKind::kAllreduce ? "MPI_Iallreduce" : "MPI_Ibcast", rc, r.name);
    reqs->push_back(q);
    return "";
  });
}

}  // namespace mxnet_mpi
