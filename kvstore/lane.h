// A lane: one communicator whose collectives run strictly in the order they
// were pushed (the store's sequence numbers), the same order on every rank.
//
// Before any data moves, the ranks agree on each unit in one small allreduce
// (the check round): sequence number, signature, size, op, how many ready
// requests to fuse, and whether a rank cannot take part (a token) or has
// joined (stands in). Ranks out of step, mismatched collectives and rank-local
// failures thus become the same named error on every rank, and never shift the
// pairing of later collectives.
#ifndef MXNET_MPI_LANE_H_
#define MXNET_MPI_LANE_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "mpi_ops.h"
#include "request.h"

namespace mxnet_mpi {

struct LaneConfig {
  MPI_Comm comm = MPI_COMM_NULL;
  std::string store;           // store name, for messages
  int index = 0;
  bool fuse = false;           // fuse consecutive ready small allreduces
  int64_t fusion_bytes = 0;
  int64_t chunk_bytes = 1 << 20;
  int64_t p2p_bytes = 0;      // allreduce chunks this big take our point-to-point allreduce (0: never)
  int max_fused = 64;
};

// Outcome of agreeing on the head of a lane.
struct Agreement {
  int n = 0;                 // requests (this rank's) the unit consumes; 0 = none
  int parts = 0;             // arrays of the head request
  bool all_joined = false;   // every rank stands in: a join is complete
  std::string error;         // the unit fails with this on every rank
  Unit unit;                 // what runs (members filled for active ranks)
};

// What running one unit did; every field follows from the agreement, so it is
// the same on every rank (funneled bounds its cycles by `bytes`).
struct Ran {
  int n = 0;              // requests consumed; -1: every rank had joined
  int64_t bytes = 0;      // bytes the unit moved (per rank, as agreed)
  bool partial = false;   // one piece of the head allreduce ran; it stays ready
};

class Lane {
 public:
  explicit Lane(const LaneConfig& cfg);
  ~Lane();
  Lane(const Lane&) = delete;
  Lane& operator=(const Lane&) = delete;

  const LaneConfig& config() const { return cfg_; }
  // Push time, on the pushing thread, in program order.
  void Reserve(uint64_t seq);
  // The request's arrays are ready (or it is a token); any thread.
  void Ready(Request r);
  // Requests reserved and not yet completed.
  size_t Pending();

  // Own-thread operation (concurrent mode; chained while serving a join).
  void StartThread();
  // Inline operation (chained): runs every consecutive ready head now.
  void Drain();
  // Ends the thread once nothing is pending (idempotent).
  void Stop();

  // Join: once nothing is pending here, stand in for this rank in whatever
  // peers still run on this lane, until every rank has joined. Returns when
  // that happened (blocking; runs on the lane thread or the caller's).
  // `flight` (health.h) is touched after every collective served.
  void Serve(uint64_t flight);
  void RequestServe(uint64_t flight);  // own-thread lanes: serve, then signal
  bool WaitServed(double timeout_s);

  // Funneled: agree on and run the head unit among `candidates` (seqs in
  // the order the negotiation fixed). With `piece_bytes` > 0, an allreduce of
  // one array larger than min(piece_bytes, chunk_bytes) runs one piece of that
  // size per call (pre-emptible: other units may run between its pieces).
  // `checked`: the check round of the head alone, already reduced (below);
  // it saves the round when the head runs alone.
  Ran RunAgreed(const std::vector<uint64_t>& candidates, bool joined, int64_t piece_bytes,
                const int64_t* checked = nullptr);
  // Funneled, a round trip fewer per call: the check round's words for the
  // ready request `seq` running alone (CheckWords() int64s), to be reduced
  // with MPI_MAX beside the negotiation; NoCheck() fills the words of a rank
  // that has nothing to offer. The reduced words are usable for the unit of
  // `seq` alone exactly when every rank offered `seq` (CheckUsable), which
  // every rank decides alike from the same reduced words.
  static int CheckWords();
  void CheckFor(uint64_t seq, int64_t* v);
  static void NoCheck(int64_t* v);
  static bool CheckUsable(const int64_t* res, uint64_t seq);
  // Funneled: ready sequence numbers in [from, to), with their priorities.
  std::vector<std::pair<uint64_t, int>> ReadyBetween(uint64_t from, uint64_t to);
  bool HasReady();

 private:
  void Loop();
  // Under mu_: the consecutive ready requests at the head (fusable prefix).
  std::vector<Request*> HeadCandidates();
  // Agree on and run one unit made from `cands` (this rank's, possibly
  // empty when standing in).
  Ran RunOne(const std::vector<Request*>& cands, bool joined, int64_t piece_bytes = 0,
             const int64_t* checked = nullptr);
  Agreement Agree(const std::vector<Request*>& cands, bool joined,
                  const int64_t* checked = nullptr);
  std::string DescribeFailure(const std::vector<Request*>& cands, bool joined);
  void Finish(const std::vector<uint64_t>& seqs, const std::string& err);

  LaneConfig cfg_;
  int rank_ = 0, size_ = 1;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<uint64_t> order_;             // reserved, not yet run (push order)
  std::map<uint64_t, Request> ready_;      // seq -> ready request
  std::mutex exec_mu_;                     // one unit at a time (inline mode)
  Scratch scratch_;
  std::thread thread_;
  bool stop_ = false;
  bool serve_ = false;                     // own-thread lane asked to serve
  bool served_ = false;
  uint64_t serve_flight_ = 0;
};

// Waits for a non-blocking MPI request without burning a core: spins briefly
// (peers usually arrive together), then sleeps between tests.
int WaitPolitely(MPI_Request* req);
// MPI_Allreduce with WaitPolitely's wait: for the small agreement rounds,
// whose blocking form polls, taking the core a descheduled peer (or backprop)
// needs while the others wait.
int AllreducePolitely(const void* in, void* out, int count, MPI_Datatype type, MPI_Op op,
                      MPI_Comm comm);
// A barrier with that wait: before a blocking call that has no non-blocking
// form (MPI_Comm_split), so a rank whose peers come late sleeps meanwhile.
int BarrierPolitely(MPI_Comm comm);

// The nice value (setpriority) a store's communicating thread takes when its
// waits sleep (the point-to-point route, across hosts): woken by the network,
// it then gets the core from backprop at once and keeps the link busy. Set at
// init (MXNET_MPI_COMM_NICE; 0: leave the threads alone); where the system
// refuses it (a negative value needs CAP_SYS_NICE or RLIMIT_NICE) the thread
// keeps the process's priority.
void SetCommNice(int nice);
// Called by a communicating thread as it starts, when its store's waits sleep.
void ApplyCommNice();

}  // namespace mxnet_mpi

#endif  // MXNET_MPI_LANE_H_
