#include <pthread.h>
#include "store.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <map>

#include "health.h"

namespace mxnet_mpi {

namespace {

std::mutex g_stores_mu;
// By id (agreed across members). Never destroyed: a forked child that exits
// must not tear down stores whose threads only exist in its parent.
std::map<int, std::shared_ptr<Store>>& g_stores = *new std::map<int, std::shared_ptr<Store>>();

// Ready() calls this thread is inside (of any store): Close() on such a
// thread must not wait for the calls to end.
thread_local int t_in_ready = 0;

MPI_Comm Dup(MPI_Comm c) {
  MPI_Comm out = MPI_COMM_NULL;
  MPI_Comm_dup(c, &out);
  MPI_Comm_set_errhandler(out, MPI_ERRORS_RETURN);
  return out;
}

}  // namespace

std::shared_ptr<Store> StoreById(int id) {
  std::lock_guard<std::mutex> lock(g_stores_mu);
  auto it = g_stores.find(id);
  return it == g_stores.end() ? nullptr : it->second;
}

void AddStore(std::shared_ptr<Store> store) {
  std::lock_guard<std::mutex> lock(g_stores_mu);
  g_stores[store->id()] = std::move(store);
}

void ForgetStore(int id) {
  std::shared_ptr<Store> gone;  // released after the lock: it may be the last reference
  std::lock_guard<std::mutex> lock(g_stores_mu);
  auto it = g_stores.find(id);
  if (it == g_stores.end()) return;
  gone.swap(it->second);
  g_stores.erase(it);
}

std::vector<std::shared_ptr<Store>> AllStores() {
  std::lock_guard<std::mutex> lock(g_stores_mu);
  std::vector<std::shared_ptr<Store>> out;
  for (auto& kv : g_stores) out.push_back(kv.second);
  return out;
}

Store::Store(int id, ExecKind kind, MPI_Comm comm, const std::string& name,
             const StoreOptions& options)
    : id_(id), kind_(kind), comm_(comm), name_(name), options_(options) {
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
  MPI_Group group, world;
  MPI_Comm_group(comm_, &group);
  MPI_Comm_group(MPI_COMM_WORLD, &world);
  std::vector<int> mine(size_);
  for (int i = 0; i < size_; ++i) mine[i] = i;
  world_ranks_.resize(size_);
  MPI_Group_translate_ranks(group, size_, mine.data(), world, world_ranks_.data());
  MPI_Group_free(&group);
  MPI_Group_free(&world);

  LaneConfig base;
  base.store = name_;
  base.fusion_bytes = options_.fusion_bytes;
  base.chunk_bytes = options_.chunk_bytes;
  base.p2p_bytes = options_.p2p_bytes;
  switch (kind_) {
    case ExecKind::kChained: {
      LaneConfig c = base;
      c.comm = comm_;
      lanes_.emplace_back(new Lane(c));
      break;
    }
    case ExecKind::kFunneled: {
      negotiation_ = Dup(comm_);
      LaneConfig c = base;
      c.comm = comm_;
      c.fuse = true;
      lanes_.emplace_back(new Lane(c));
      negotiator_ = std::thread([this] {
        pthread_setname_np(pthread_self(), "mxmpi-funneled");
        if (options_.p2p_bytes > 0) ApplyCommNice();
        NegotiationLoop();
      });
      break;
    }
    case ExecKind::kConcurrent: {
      LaneConfig small = base;
      small.comm = comm_;
      small.fuse = options_.fusion_bytes > 0;   // MXNET_MPI_FUSION_BYTES=0: no fusion
      small.fusion_bytes =
          small.fuse ? std::max(options_.fusion_bytes, options_.small_bytes) : 0;
      lanes_.emplace_back(new Lane(small));
      for (int i = 0; i < std::max(1, options_.large_lanes); ++i) {
        LaneConfig c = base;
        c.comm = Dup(comm_);
        c.index = i + 1;
        lanes_.emplace_back(new Lane(c));
      }
      for (auto& lane : lanes_) lane->StartThread();
      break;
    }
  }
}

Store::~Store() { Teardown(); }

Lane* Store::PickLane(OpKind op, int64_t bytes) {
  if (kind_ != ExecKind::kConcurrent || lanes_.size() == 1) return lanes_[0].get();
  (void)op;
  if (bytes <= options_.small_bytes) return lanes_[0].get();
  const int large = static_cast<int>(lanes_.size()) - 1;
  return lanes_[1 + (next_large_++ % large)].get();
}

void Store::Reserve(Lane* lane, uint64_t seq) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++outstanding_;
  }
  lane->Reserve(seq);
}

void Store::Ready(Lane* lane, Request r) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++calls_;
  }
  ++t_in_ready;
  struct EndOfCall {
    Store* store;
    ~EndOfCall() {
      --t_in_ready;
      store->EndCall();
    }
  } end_of_call{this};
  auto inner = std::move(r.done);
  r.done = [this, inner](const std::string& err) {
    if (inner) inner(err);
    Completed();
  };
  lane->Ready(std::move(r));
  if (kind_ == ExecKind::kChained) {
    lane->Drain();
  } else if (kind_ == ExecKind::kFunneled) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      news_ = true;
    }
    cv_.notify_all();
  }
}

size_t Store::Outstanding() {
  std::lock_guard<std::mutex> lock(mu_);
  return outstanding_;
}

void Store::Completed() {
  bool teardown = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    --outstanding_;
    teardown = TeardownDue();
  }
  cv_.notify_all();
  if (teardown) PostTeardown();
}

void Store::EndCall() {
  bool teardown = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    --calls_;
    if (close_waits_) {
      // That Close() tears down itself and may free the store once the lock
      // is released: nothing after this touches *this.
      cv_.notify_all();
      return;
    }
    teardown = TeardownDue();
  }
  if (teardown) PostTeardown();
}

bool Store::TeardownDue() const {
  return closed_ && outstanding_ == 0 && calls_ == 0 && !torn_down_;
}

void Store::PostTeardown() {
  // Not here: this may be one of the store's own threads.
  std::shared_ptr<Store> self = StoreById(id_);
  if (self) PostToOwner([self] { self->Teardown(); });
}

std::string Store::Join() {
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (closed_) return "mxnet_mpi: join() on a closed store";
    cv_.wait(lock, [this] { return outstanding_ == 0; });
  }
  const uint64_t flight = FlightBegin(FlightKind::kJoin, id_, joins_, "join()");
  switch (kind_) {
    case ExecKind::kChained:
      lanes_[0]->Serve(flight);
      break;
    case ExecKind::kConcurrent:
      for (auto& lane : lanes_) lane->RequestServe(flight);
      for (auto& lane : lanes_) lane->WaitServed(1e9);
      break;
    case ExecKind::kFunneled: {
      std::unique_lock<std::mutex> lock(mu_);
      serve_ = true;
      served_ = false;
      serve_flight_ = flight;
      cv_.notify_all();
      cv_.wait(lock, [this] { return served_; });
      break;
    }
  }
  FlightEnd(flight);
  // Ranks issued different numbers of collectives before joining: carry on
  // from the largest count, the same on every rank.
  uint64_t next = next_seq_;
  AllreducePolitely(MPI_IN_PLACE, &next, 1, MPI_UINT64_T, MPI_MAX, comm_);
  next_seq_ = next;
  {
    std::lock_guard<std::mutex> lock(mu_);
    base_ = next;
    done_beyond_base_.clear();
    // Large collectives take the concurrent lanes in turn, counted per rank:
    // a rank that joined early counted fewer, and the ranks then posted the
    // next large collective on different lanes (a hang). Afresh alike.
    next_large_ = 0;
  }
  ++joins_;
  return "";
}

void Store::Close() {
  bool now = false;
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (closed_) return;
    closed_ = true;
    // With nothing outstanding, a Ready() call still under way only has to
    // leave the lanes (it ran its last request): wait for that, so that the
    // store goes here and now (before MPI_Finalize at the end of the job),
    // not later on the owner thread.
    if (outstanding_ == 0 && t_in_ready == 0 && calls_ > 0) {
      close_waits_ = true;
      cv_.wait(lock, [this] { return calls_ == 0; });
      close_waits_ = false;
    }
    now = TeardownDue();
  }
  if (now) Teardown();
}

void Store::Teardown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (torn_down_) return;
    torn_down_ = true;
    stop_ = true;
  }
  cv_.notify_all();
  if (negotiator_.joinable()) negotiator_.join();
  for (auto& lane : lanes_) lane->Stop();
  int finalized = 0;
  MPI_Finalized(&finalized);
  for (size_t i = 1; i < lanes_.size() && !finalized; ++i) {
    MPI_Comm c = lanes_[i]->config().comm;
    MPI_Comm_free(&c);
  }
  lanes_.clear();
  if (!finalized && negotiation_ != MPI_COMM_NULL) MPI_Comm_free(&negotiation_);
  if (!finalized && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
  HealthForgetMembers(id_);
  ForgetStore(id_);
}

void Store::NegotiationLoop() {
  constexpr int kWindow = 4096;
  constexpr int kWords = kWindow / 64;
  Lane* lane = lanes_[0].get();
  std::vector<uint64_t> mine(kWords + 1), agreed(kWords + 1);
  // The check round of the lowest ready request, reduced beside the
  // negotiation: when that request is the only one agreed (a lone call), it
  // runs without a check round of its own.
  std::vector<int64_t> offer(Lane::CheckWords()), checked(Lane::CheckWords());
  std::map<uint64_t, int> priority;
  bool retry = false;  // ready requests may remain after a cycle
  for (;;) {
    bool serving = false;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || serve_ || news_ || retry; });
      if (stop_ && !serve_ && !lane->HasReady()) return;
      serving = serve_;
      news_ = false;
      retry = false;
    }
    std::fill(mine.begin(), mine.end(), 0);
    priority.clear();
    if (serving) {
      std::fill(mine.begin(), mine.end(), ~0ull);
    } else {
      for (const auto& sp : lane->ReadyBetween(base_, base_ + kWindow)) {
        const uint64_t bit = sp.first - base_;
        mine[bit / 64] |= uint64_t{1} << (bit % 64);
        priority[sp.first] = sp.second;
      }
      if (priority.empty()) continue;  // woken for nothing new in the window
    }
    if (serving)
      Lane::NoCheck(offer.data());
    else
      lane->CheckFor(priority.begin()->first, offer.data());
    // Both reductions in flight at once, started in the same order on every
    // rank: one round trip's wait for the two.
    MPI_Request reqs[2];
    int rc = MPI_Iallreduce(mine.data(), agreed.data(), kWords + 1, MPI_UINT64_T, MPI_BAND,
                            negotiation_, &reqs[0]);
    if (rc == MPI_SUCCESS)
      rc = MPI_Iallreduce(offer.data(), checked.data(), Lane::CheckWords(), MPI_INT64_T,
                          MPI_MAX, negotiation_, &reqs[1]);
    if (rc == MPI_SUCCESS) rc = WaitPolitely(&reqs[0]);
    if (rc == MPI_SUCCESS) rc = WaitPolitely(&reqs[1]);
    if (rc != MPI_SUCCESS) {
      std::fprintf(stderr, "mxnet_mpi: negotiation of store '%s' failed\n", name_.c_str());
      return;
    }
    if (agreed[kWords] == ~0ull) {  // every rank is serving a join: done
      {
        std::lock_guard<std::mutex> lock(mu_);
        serve_ = false;
        served_ = true;
      }
      cv_.notify_all();
      continue;
    }
    std::vector<uint64_t> run;
    for (int bit = 0; bit < kWindow; ++bit)
      if (agreed[bit / 64] >> (bit % 64) & 1) run.push_back(base_ + bit);
    if (run.empty()) {
      // Peers are not ready for what we have: wait for news, or a cycle.
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, std::chrono::microseconds(options_.cycle_us),
                   [&] { return stop_ || news_ || serve_; });
      retry = true;
      continue;
    }
    if (run.size() > 1) {
      // Highest priority first (MXNet: larger is more urgent), then push order.
      // Priorities are hints that may differ between ranks: the order uses the
      // largest of each, the same on every rank.
      std::vector<int> prio(run.size(), INT_MIN);
      if (!serving)
        for (size_t k = 0; k < run.size(); ++k) prio[k] = priority[run[k]];
      if (AllreducePolitely(MPI_IN_PLACE, prio.data(), static_cast<int>(prio.size()), MPI_INT,
                            MPI_MAX, negotiation_) != MPI_SUCCESS) {
        std::fprintf(stderr, "mxnet_mpi: negotiation of store '%s' failed\n", name_.c_str());
        return;
      }
      std::vector<size_t> idx(run.size());
      for (size_t k = 0; k < idx.size(); ++k) idx[k] = k;
      std::stable_sort(idx.begin(), idx.end(), [&](size_t a, size_t b) { return prio[a] > prio[b]; });
      std::vector<uint64_t> sorted;
      for (size_t k : idx) sorted.push_back(run[k]);
      run.swap(sorted);
    }
    // Bounded cycle: once it moved preempt_bytes, what stays agreed and ready
    // is negotiated afresh with whatever became ready meanwhile, so a more
    // urgent gradient goes first. Units and their sizes are agreed, so every
    // rank stops at the same place.
    const int64_t budget = options_.preempt_bytes;
    std::vector<uint64_t> remaining = run;
    size_t consumed = 0;
    int64_t moved = 0;
    // Decided from reduced values only, so alike on every rank.
    const int64_t* lone = !serving && run.size() == 1 &&
                                  Lane::CheckUsable(checked.data(), run[0])
                              ? checked.data()
                              : nullptr;
    while (consumed < run.size()) {
      const Ran r = lane->RunAgreed(serving ? std::vector<uint64_t>() : remaining, serving,
                                    budget, lone);
      lone = nullptr;   // later pieces of the same array: a check round each
      if (r.n <= 0 && !r.partial) break;  // cannot happen while ranks agree; never spin
      if (serving) FlightTouch(serve_flight_);
      if (!serving) {
        for (int k = 0; k < r.n; ++k) done_beyond_base_.insert(remaining[k]);
        remaining.erase(remaining.begin(), remaining.begin() + r.n);
      }
      consumed += r.n;
      moved += r.bytes;
      if (budget > 0 && moved >= budget) break;
    }
    while (done_beyond_base_.count(base_)) done_beyond_base_.erase(base_++);
    retry = !serving && lane->HasReady();
  }
}

}  // namespace mxnet_mpi
