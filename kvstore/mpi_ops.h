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
  // A pre-emptible allreduce (one array) runs elements [from, to) only; the
  // pieces' bounds are fixed multiples of the piece size, so the MPI calls on
  // each element are the same whichever units run in between.
  int64_t from = 0;
  int64_t to = -1;       // -1: to the end
};

// Reusable scratch memory of one lane (fusion buffer, stand-in buffers).
struct Scratch {
  std::vector<char> a, b, c, d;
  char* Get(std::vector<char>* v, size_t bytes) {
    if (v->size() < bytes) v->resize(bytes);
    return v->data();
  }
};

// How a lane moves large arrays (the policy is the Python side's).
struct Transfer {
  int64_t chunk_bytes = 1 << 20;  // one chunk after another, at most this big
  // Allreduce chunks of at least this many bytes take our allreduce over
  // point-to-point messages (waits that sleep) instead of MPI_Allreduce; 0: never.
  int64_t p2p_bytes = 0;
};

// Runs the data phase of `u` over `comm`; "" or an error. Large arrays move in
// chunks (blocking calls, or point-to-point, one chunk after another).
std::string RunUnit(MPI_Comm comm, Unit* u, Scratch* scratch, const Transfer& t);

// Waits for `n` non-blocking requests without holding a core: tests, then
// sleeps between tests (10 us, doubling up to 200 us), so that a wait on the
// network leaves the core to compute. Longer naps idle the link for little
// CPU: capped at 1 ms, the default store's allreduce of resnet18_v1's
// gradients between two emulated hosts took 1.22x the wire time instead of
// 1.13x at 1 Gbit/s (15-19% less CPU time), 1.45x instead of 1.23x at
// 3.8 Gbit/s (no less CPU time).
int WaitAllSleeping(int n, MPI_Request* reqs);

// Makes the calling thread's sleeps end on time (timer slack 1 us instead of
// Linux's 50 us), once per thread; the waits above call it. A wait's short
// naps otherwise overshoot by up to 50 us each, which the ranks' agreement
// rounds and the point-to-point phases pay in sequence: at 2 hosts and
// 6 Gbit/s, the default store's allreduce of resnet18_v1's gradients took
// 1.26x the wire time with the default slack and 1.10x with 1 us, at the same
// CPU time.
void PreciseSleeps();

MPI_Datatype MpiType(int dtype);
std::string MpiError(const char* what, int code, const std::string& name);

}  // namespace mxnet_mpi

#endif  // MXNET_MPI_MPI_OPS_H_
