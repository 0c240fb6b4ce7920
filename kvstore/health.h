// Failing fast instead of hanging: per-collective signature checks across
// ranks, and a health thread that reports and aborts stalled collectives.
#ifndef MXNET_MPI_HEALTH_H_
#define MXNET_MPI_HEALTH_H_

#include <atomic>
#include <cstdint>
#include <string>

#include "request.h"

namespace mxnet_mpi {

struct HealthOptions {
  bool check_signatures = true;
  double warn_s = 60;      // warn when a collective waits longer than this
  double abort_s = 600;    // MPI_Abort when it waits longer than this
  double interval_s = 1;   // period of the health rounds
};

HealthOptions& Options();

// Blocking, on r.comm: all ranks must be running a collective with the same
// description (verb, key, shape, dtype). Returns "" or an error naming every
// rank's collective (also printed to stderr at once).
std::string CheckSignature(const Request& r);

// In-flight bookkeeping: a collective is "waiting" from the moment its engine
// op ran (the array is ready locally) until it completes.
uint64_t FlightBegin(const std::string& name);
void FlightEnd(uint64_t id);

// Starts the health thread over `comm` (a private duplicate of the world).
void HealthStart(MPI_Comm comm, int world_rank);
// Ends it; every rank leaves in the same round, so this waits for all ranks.
void HealthStop();

}  // namespace mxnet_mpi

#endif  // MXNET_MPI_HEALTH_H_
