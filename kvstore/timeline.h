// Chrome-trace timeline of collectives (MXNET_MPI_TIMELINE): for each one,
// when it was pushed, when its inputs were ready, and when MPI ran it.
#ifndef MXNET_MPI_TIMELINE_H_
#define MXNET_MPI_TIMELINE_H_

#include <atomic>
#include <string>

#include "request.h"

namespace mxnet_mpi {

extern std::atomic<bool> g_timeline_on;

// Microseconds since the epoch: the clock of MXNet's own profiler, so both
// traces can be merged.
int64_t NowUs();

// Records a finished request (called from Complete()).
void TimelineRecord(const Request& r, bool ok);

// Writes the recorded events as Chrome-trace JSON; returns "" or an error.
std::string TimelineDump(const std::string& path, int rank);

// Stops recording and forgets the events recorded so far.
void TimelineStop();

}  // namespace mxnet_mpi

#endif  // MXNET_MPI_TIMELINE_H_
