// The watchdog: ranks tell each other, point to point and without waiting for
// anyone, what they are doing (heartbeats), so that a live rank can name a
// peer that stopped answering, finished its program, or waits elsewhere, warn
// about a stalled collective, and abort the job instead of hanging.
#ifndef MXNET_MPI_HEALTH_H_
#define MXNET_MPI_HEALTH_H_

#include <mpi.h>

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace mxnet_mpi {

struct HealthOptions {
  double warn_s = 60;      // warn when something has waited longer than this
  double abort_s = 600;    // MPI_Abort when it has waited longer than this
  double interval_s = 1;   // heartbeat period
};

HealthOptions& Options();

// What this rank waits on.
enum class FlightKind : int {
  kCollective = 0,  // a collective whose arrays are ready here, waiting for peers
  kJoin = 1,        // join(): standing in for this rank until all ranks join
  kServer = 2,      // a parameter-server request (hybrid stores)
  kLocal = 3,       // a held write: this rank's devices' parts and their sum over ranks
};
// `desc` is quoted in messages; `where` follows it as it is (request.h
// Where(): the parameter and what the push was for).
uint64_t FlightBegin(FlightKind kind, int store, uint64_t seq, const std::string& desc,
                     const std::string& where = "");
void FlightTouch(uint64_t id);  // progress: the wait starts afresh
void FlightEnd(uint64_t id);

// Starts the heartbeat thread over `comm` (a private duplicate of the world).
void HealthStart(MPI_Comm comm, int world_rank);
// This rank reached the end of its program: peers must not wait for any
// collective beyond those it issued (`finals`: store id, collectives issued,
// joins completed).
void HealthAnnounceFinish(const std::vector<std::array<int64_t, 3>>& finals);
// Waits until every rank has announced its finish (aborting if one stops
// answering for MXNET_MPI_STALL_ABORT_S), then ends the thread.
void HealthStop();
bool HealthRunning();

// Store membership, for naming who a collective waits for.
void HealthSetMembers(int store, const std::string& name, const std::vector<int>& world_ranks);
void HealthForgetMembers(int store);

[[noreturn]] void AbortJob(const std::string& why, int code = 3);

}  // namespace mxnet_mpi

#endif  // MXNET_MPI_HEALTH_H_
