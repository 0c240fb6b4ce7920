// A store's communication state: its sequence of collectives, its lanes
// (communicators with their order), and the mode that runs them:
//
// chained     one lane; the engine's process-wide chain variable releases the
//             collectives one at a time in push order, and the engine thread
//             that runs the op runs MPI itself (no hand-off).
// funneled    one lane and one thread; each cycle the ranks AND a bitmask of
//             locally ready sequence numbers and run the agreed ones, highest
//             priority first, fusing small allreduces, until the cycle has
//             moved preempt_bytes; large allreduces move in pieces, so a more
//             urgent array that becomes ready meanwhile goes in between.
// concurrent  a lane for small arrays (fused when ready together) and lanes
//             for large ones, each with its own communicator and thread, so
//             large transfers run side by side and never block small ones.
#ifndef MXNET_MPI_STORE_H_
#define MXNET_MPI_STORE_H_

#include <atomic>
#include <condition_variable>
#include <functional>
#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "lane.h"

namespace mxnet_mpi {

enum class ExecKind : int { kChained = 0, kFunneled = 1, kConcurrent = 2 };

// Every value comes from Python (mxnet_mpi/settings.py holds the defaults).
struct StoreOptions {
  int64_t fusion_bytes = 0;   // fuse allreduces up to this many bytes
  int64_t small_bytes = 0;    // concurrent: arrays up to this go to the small lane
  int64_t chunk_bytes = 0;    // large arrays move in chunks of this size
  int64_t p2p_bytes = 0;      // allreduce chunks this big take our point-to-point allreduce
  int large_lanes = 1;        // concurrent: lanes for large arrays
  int cycle_us = 0;           // funneled: pause after a cycle that agreed on nothing
  // funneled: a cycle ends once its units moved this many bytes, and larger
  // allreduces move in pieces of at most this size (0: cycles run all agreed)
  int64_t preempt_bytes = 0;
};

class Store {
 public:
  // `comm` becomes the store's (it frees it); collective over it.
  Store(int id, ExecKind kind, MPI_Comm comm, const std::string& name,
        const StoreOptions& options);
  ~Store();

  int id() const { return id_; }
  const StoreOptions& options() const { return options_; }
  ExecKind kind() const { return kind_; }
  const std::string& name() const { return name_; }
  MPI_Comm comm() const { return comm_; }
  int size() const { return size_; }
  int rank() const { return rank_; }
  // World ranks of the members, by rank in the store.
  const std::vector<int>& world_ranks() const { return world_ranks_; }

  // Push side (the pushing thread, program order).
  uint64_t NextSeq() { return next_seq_++; }
  uint64_t issued() const { return next_seq_; }
  Lane* PickLane(OpKind op, int64_t bytes);
  void Reserve(Lane* lane, uint64_t seq);
  // Any thread: the request can run (arrays ready, or a token).
  void Ready(Lane* lane, Request r);
  size_t Outstanding();

  // Blocks until this rank's collectives are done, then stands in for it in
  // its peers' collectives until every rank has joined. "" or an error.
  std::string Join();
  uint64_t joins() const { return joins_; }
  // No more pushes; threads and communicators go once nothing is pending.
  void Close();
  bool closed() const { return closed_; }

 private:
  // A request / a Ready() call ended: once closed and nothing is left, the
  // owner thread tears the store down.
  void Completed();
  void EndCall();
  bool TeardownDue() const;  // under mu_
  void PostTeardown();
  void NegotiationLoop();
  void Teardown();

  const int id_;
  const ExecKind kind_;
  MPI_Comm comm_;
  MPI_Comm negotiation_ = MPI_COMM_NULL;  // funneled
  const std::string name_;
  const StoreOptions options_;
  int rank_ = 0, size_ = 1;
  std::vector<int> world_ranks_;
  std::vector<std::unique_ptr<Lane>> lanes_;
  std::atomic<uint64_t> next_seq_{0};
  std::atomic<uint64_t> joins_{0};
  int next_large_ = 0;

  std::mutex mu_;
  std::condition_variable cv_;
  size_t outstanding_ = 0;
  // Ready() calls under way: a request may complete (and the store be closed
  // and torn down) on another thread before the call that made it ready has
  // left the lane, so the lanes stay until every such call has returned.
  size_t calls_ = 0;
  bool close_waits_ = false;  // Close() waits for calls_ to reach 0
  bool closed_ = false;
  bool torn_down_ = false;
  // funneled
  std::thread negotiator_;
  bool stop_ = false;
  bool serve_ = false, served_ = false;
  uint64_t serve_flight_ = 0;
  uint64_t base_ = 0;
  std::set<uint64_t> done_beyond_base_;
  bool news_ = false;
};

// Runs `task` on the library's owner thread (api.cc), soon, not here.
void PostToOwner(std::function<void()> task);

// Stores by id (the members agree on it when the store is created).
std::shared_ptr<Store> StoreById(int id);
void AddStore(std::shared_ptr<Store> store);
void ForgetStore(int id);
std::vector<std::shared_ptr<Store>> AllStores();

}  // namespace mxnet_mpi

#endif  // MXNET_MPI_STORE_H_
