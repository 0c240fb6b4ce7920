// The data phase of a collective: blocking MPI calls on raw buffers, once
// every rank has agreed (lane.h) on what runs. The only place that moves data.
#ifndef MXNET_MPI_MPI_OPS_H_
#define MXNET_MPI_MPI_OPS_H_

#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

#include "request.h"

namespace mxnet_mpi {

// What all ranks agreed to run: `members` are this rank's requests (several
// for a fused allreduce; none on a rank that has joined and only stands in).
struct Unit {
  std::vector<Request*> members;
  OpKind op = OpKind::kAllreduce;
  int dtype = kFloat32;
  int root = 0;
  int flags = 0;
  int64_t total = 0;     // elements over members (as agreed)
  int64_t row = 1;       // elements per first-dimension row
  int active = 0;        // ranks that have not joined (the divisor of averages)
  bool joined = false;   // this rank stands in (contributes nothing, keeps nothing)
};

// Reusable scratch memory of one lane (fusion buffer, stand-in buffers).
struct Scratch {
  std::vector<char> a, b, c, d;
  char* Get(std::vector<char>* v, size_t bytes) {
    if (v->size() < bytes) v->resize(bytes);
    return v->data();
  }
};

// Runs the data phase of `u` over `comm`; "" or an error. Large arrays move in
// chunks of `chunk_bytes` (blocking calls, one chunk after another).
std::string RunUnit(MPI_Comm comm, Unit* u, Scratch* scratch, int64_t chunk_bytes);

MPI_Datatype MpiType(int dtype);
std::string MpiError(const char* what, int code, const std::string& name);

}  // namespace mxnet_mpi

#endif  // MXNET_MPI_MPI_OPS_H_
