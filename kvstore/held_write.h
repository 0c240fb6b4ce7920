// A write into an array that the engine holds open until the data exists: the
// ops that read the array can be pushed before the op that computes its value
// (SyncBatchNorm's devices of one rank meet this way, each in its own time).
#ifndef MXNET_MPI_HELD_WRITE_H_
#define MXNET_MPI_HELD_WRITE_H_

#include <mxnet/c_api.h>

#include <cstdint>
#include <string>

namespace mxnet_mpi {

// Push an engine op that holds `out` (a host array) as written and does not
// finish; `desc` names it in stall warnings. Returns "" or why not.
std::string HoldWrite(NDArrayHandle out, const std::string& desc, int64_t* ticket);
// Push an op that reads `src` (same bytes as `out`), copies it into `out` and
// finishes the held op.
std::string ReleaseWrite(int64_t ticket, NDArrayHandle src);

}  // namespace mxnet_mpi

#endif  // MXNET_MPI_HELD_WRITE_H_
