#include <pthread.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>
#include "lane.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstring>
#include <sstream>

#include "health.h"
#include "timeline.h"

namespace mxnet_mpi {

namespace {

using Clock = std::chrono::steady_clock;

// The check round: int64 words, reduced with MAX as [v, -v] so that every
// rank learns the maximum and the minimum of each word. A joined rank sends
// kNone in both halves, so it never changes the outcome.
// kFrom: where a pre-empted allreduce resumes (its pieces so far).
enum Word : int {
  kSeq = 0, kSig, kCount, kCode, kRoot, kFrom, kReady,  // compared (max == min), kReady: min
  kRow, kToken, kJoined, kWords
};
constexpr int64_t kNone = INT64_MIN;
constexpr int kCompared = 6;  // kSeq..kFrom must agree

int64_t Code(const Request& r) {
  return static_cast<int64_t>(r.op) | (static_cast<int64_t>(r.dtype) << 4) |
         (static_cast<int64_t>(r.flags) << 8) | (static_cast<int64_t>(r.parts.size()) << 16);
}

bool Fusable(const Request& r, int64_t limit) {
  return r.op == OpKind::kAllreduce && r.token.empty() && r.Bytes() > 0 && r.Bytes() <= limit &&
         r.progress == 0;
}

std::string Quote(const std::string& s) { return "'" + s + "'"; }

// How a collective reduces, where not a plain sum: ranks can disagree on it
// alone (kv.average set on one rank), with the same key, shape and dtype.
std::string Reduction(int flags) {
  std::string s;
  if (flags & kAverage) s += ", averaged";
  if (flags & kCompressFp16) s += ", fp16 on the wire";
  if (flags & kMin) s += ", min";
  if (flags & kMax) s += ", max";
  if (flags & kProduct) s += ", product";
  if (flags & kStatesLoaded)
    s += ", after load_optimizer_states, which not every rank called: load them on every rank";
  return s;
}

// The check round's words of this rank for `cands` (or a joined stand-in).
void FillCheck(const std::vector<Request*>& cands, bool joined, int64_t* v) {
  if (joined) {
    for (int i = 0; i < 2 * kWords; ++i) v[i] = kNone;
    v[kToken] = 0;
    v[kJoined] = 1;
    return;
  }
  const Request& first = *cands[0];
  const bool varying = first.op == OpKind::kAllgather || first.op == OpKind::kAlltoall;
  v[kSeq] = static_cast<int64_t>(first.seq);
  v[kSig] = static_cast<int64_t>(first.sig);
  v[kCount] = varying ? 0 : first.Count();
  v[kCode] = Code(first);
  v[kRoot] = first.root;
  v[kFrom] = first.progress;
  v[kReady] = static_cast<int64_t>(cands.size());
  v[kRow] = first.row;
  v[kToken] = first.token.empty() ? 0 : 1;
  v[kJoined] = 0;
  for (int i = 0; i < kWords; ++i) v[kWords + i] = i <= kRow ? -v[i] : kNone;
}

}  // namespace

int Lane::CheckWords() { return 2 * kWords; }

void Lane::CheckFor(uint64_t seq, int64_t* v) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<Request*> one{&ready_.at(seq)};
  FillCheck(one, false, v);
}

void Lane::NoCheck(int64_t* v) {
  FillCheck({}, true, v);
  v[kSeq] = -1;          // the minimum seq differs from any maximum: unusable
  v[kWords + kSeq] = 1;
}

bool Lane::CheckUsable(const int64_t* res, uint64_t seq) {
  return res[kSeq] == static_cast<int64_t>(seq) && res[kWords + kSeq] == -res[kSeq] &&
         res[kJoined] == 0;
}

namespace {
std::atomic<int> g_comm_nice{0};
}  // namespace

void SetCommNice(int nice) { g_comm_nice = nice; }

void ApplyCommNice() {
  const int nice = g_comm_nice;
  // this thread only (Linux: a thread id is a PRIO_PROCESS target); refused
  // without the privilege, which leaves the thread as it was
  if (nice != 0) setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), nice);
}

int WaitPolitely(MPI_Request* req) {
  PreciseSleeps();
  const auto start = Clock::now();
  for (;;) {
    int done = 0;
    const int rc = MPI_Test(req, &done, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS || done) return rc;
    const auto waited = Clock::now() - start;
    if (waited < std::chrono::microseconds(100)) continue;
    std::this_thread::sleep_for(waited < std::chrono::milliseconds(100)
                                    ? std::chrono::microseconds(50)
                                    : std::chrono::microseconds(1000));
  }
}

int AllreducePolitely(const void* in, void* out, int count, MPI_Datatype type, MPI_Op op,
                      MPI_Comm comm) {
  MPI_Request req;
  const int rc = MPI_Iallreduce(in, out, count, type, op, comm, &req);
  return rc == MPI_SUCCESS ? WaitPolitely(&req) : rc;
}

int BarrierPolitely(MPI_Comm comm) {
  MPI_Request req;
  const int rc = MPI_Ibarrier(comm, &req);
  return rc == MPI_SUCCESS ? WaitPolitely(&req) : rc;
}

Lane::Lane(const LaneConfig& cfg) : cfg_(cfg) {
  MPI_Comm_rank(cfg_.comm, &rank_);
  MPI_Comm_size(cfg_.comm, &size_);
}

Lane::~Lane() { Stop(); }

void Lane::Reserve(uint64_t seq) {
  std::lock_guard<std::mutex> lock(mu_);
  order_.push_back(seq);
}

void Lane::Ready(Request r) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    const uint64_t seq = r.seq;
    ready_.emplace(seq, std::move(r));
  }
  cv_.notify_all();
}

size_t Lane::Pending() {
  std::lock_guard<std::mutex> lock(mu_);
  return order_.size();
}

void Lane::StartThread() {
  if (!thread_.joinable()) {
    thread_ = std::thread([this] {
      pthread_setname_np(pthread_self(), "mxmpi-lane");
      if (cfg_.p2p_bytes > 0) ApplyCommNice();
      Loop();
    });
  }
}

void Lane::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
}

std::vector<Request*> Lane::HeadCandidates() {
  std::vector<Request*> out;
  int64_t bytes = 0;
  for (uint64_t seq : order_) {
    auto it = ready_.find(seq);
    if (it == ready_.end()) break;
    Request* r = &it->second;
    if (out.empty()) {
      out.push_back(r);
      bytes = r->Bytes();
      if (!cfg_.fuse || !Fusable(*r, cfg_.fusion_bytes)) break;
      continue;
    }
    if (!Fusable(*r, cfg_.fusion_bytes) || r->dtype != out[0]->dtype ||
        r->flags != out[0]->flags || bytes + r->Bytes() > cfg_.fusion_bytes ||
        static_cast<int>(out.size()) >= cfg_.max_fused)
      break;
    out.push_back(r);
    bytes += r->Bytes();
  }
  return out;
}

void Lane::Loop() {
  for (;;) {
    std::vector<Request*> cands;
    bool serve = false;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] {
        const bool head = !order_.empty() && ready_.count(order_.front());
        return head || (order_.empty() && (serve_ || stop_));
      });
      if (!order_.empty()) {
        cands = HeadCandidates();
      } else if (serve_) {
        serve = true;
      } else {
        return;  // stopped, nothing pending
      }
    }
    if (serve) {
      Serve(serve_flight_);
      {
        std::lock_guard<std::mutex> lock(mu_);
        serve_ = false;
        served_ = true;
      }
      cv_.notify_all();
      continue;
    }
    RunOne(cands, false);
  }
}

void Lane::Drain() {
  std::lock_guard<std::mutex> exec(exec_mu_);
  for (;;) {
    std::vector<Request*> cands;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (order_.empty() || !ready_.count(order_.front())) return;
      cands = HeadCandidates();
    }
    RunOne(cands, false);
  }
}

void Lane::Serve(uint64_t flight) {
  std::lock_guard<std::mutex> exec(exec_mu_);
  while (RunOne({}, true).n >= 0) FlightTouch(flight);
}

void Lane::RequestServe(uint64_t flight) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    serve_ = true;
    serve_flight_ = flight;
    served_ = false;
  }
  cv_.notify_all();
}

bool Lane::WaitServed(double timeout_s) {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, std::chrono::duration<double>(timeout_s), [this] { return served_; });
}

Ran Lane::RunAgreed(const std::vector<uint64_t>& candidates, bool joined, int64_t piece_bytes,
                    const int64_t* checked) {
  std::vector<Request*> cands;
  if (!joined) {
    std::lock_guard<std::mutex> lock(mu_);
    int64_t bytes = 0;
    for (uint64_t seq : candidates) {
      Request* r = &ready_.at(seq);
      if (!cands.empty() &&
          (!Fusable(*r, cfg_.fusion_bytes) || !Fusable(*cands[0], cfg_.fusion_bytes) ||
           r->dtype != cands[0]->dtype || r->flags != cands[0]->flags ||
           bytes + r->Bytes() > cfg_.fusion_bytes ||
           static_cast<int>(cands.size()) >= cfg_.max_fused))
        break;
      cands.push_back(r);
      bytes += r->Bytes();
    }
  }
  // The reduced check fits only a unit of the head alone.
  return RunOne(cands, joined, piece_bytes, cands.size() == 1 ? checked : nullptr);
}

std::vector<std::pair<uint64_t, int>> Lane::ReadyBetween(uint64_t from, uint64_t to) {
  std::vector<std::pair<uint64_t, int>> out;
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = ready_.lower_bound(from); it != ready_.end() && it->first < to; ++it)
    out.emplace_back(it->first, it->second.priority);
  return out;
}

bool Lane::HasReady() {
  std::lock_guard<std::mutex> lock(mu_);
  return !ready_.empty();
}

Agreement Lane::Agree(const std::vector<Request*>& cands, bool joined,
                      const int64_t* checked) {
  Agreement a;
  int64_t v[2 * kWords], res[2 * kWords];
  int rc = MPI_SUCCESS;
  if (checked != nullptr) {
    std::memcpy(res, checked, sizeof(res));   // reduced beside the negotiation
  } else {
    FillCheck(cands, joined, v);
    rc = AllreducePolitely(v, res, 2 * kWords, MPI_INT64_T, MPI_MAX, cfg_.comm);
  }
  if (rc != MPI_SUCCESS) {
    a.n = joined ? 0 : 1;
    a.error = MpiError("check round", rc, joined ? "join" : cands[0]->desc);
    return a;
  }
  if (res[kSeq] == kNone) {
    a.all_joined = true;
    return a;
  }
  bool mismatch = false;
  for (int i = 0; i < kCompared; ++i) mismatch = mismatch || res[i] != -res[kWords + i];
  const bool any_joined = res[kJoined] == 1;
  if (mismatch || res[kToken] == 1) {
    a.n = 1;  // the head fails on every rank; the next head is agreed afresh
    a.error = DescribeFailure(cands, joined);
    return a;
  }
  a.n = static_cast<int>(-res[kWords + kReady]);  // the smallest ready prefix
  Unit& u = a.unit;
  u.op = static_cast<OpKind>(res[kCode] & 15);
  u.dtype = static_cast<int>((res[kCode] >> 4) & 15);
  u.flags = static_cast<int>((res[kCode] >> 8) & 255);
  u.root = static_cast<int>(res[kRoot]);
  u.row = res[kRow];
  u.joined = joined;
  u.active = size_;
  u.total = res[kCount];
  u.from = res[kFrom];
  a.parts = static_cast<int>(res[kCode] >> 16);
  if (!joined) u.members.assign(cands.begin(), cands.begin() + a.n);
  if (a.n > 1 || any_joined) {
    // Second round: the fused prefix is the same everywhere (hash and size),
    // stand-ins learn its size, and a joined broadcast root is refused.
    int64_t w[6], wr[6];
    if (joined) {
      w[0] = w[1] = w[3] = w[4] = kNone;
      w[2] = (u.op == OpKind::kBroadcast && u.root == rank_) ? 1 : 0;
      w[5] = kNone;
    } else {
      uint64_t h = 1469598103934665603ull;
      int64_t total = 0;
      for (int i = 0; i < a.n; ++i) {
        h = Hash(&cands[i]->sig, sizeof(uint64_t), h);
        total += cands[i]->Count();
      }
      w[0] = static_cast<int64_t>(h >> 2);
      w[1] = total;
      w[2] = 0;
      w[3] = -w[0];
      w[4] = -w[1];
      w[5] = kNone;
    }
    // With a joined rank, how many joined, reduced beside it (one round trip);
    // without, none: known to every rank from the first round.
    int joined_here = joined ? 1 : 0, joined_all = 0;
    MPI_Request reqs[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
    rc = MPI_Iallreduce(w, wr, 6, MPI_INT64_T, MPI_MAX, cfg_.comm, &reqs[0]);
    if (rc == MPI_SUCCESS && any_joined)
      rc = MPI_Iallreduce(&joined_here, &joined_all, 1, MPI_INT, MPI_SUM, cfg_.comm, &reqs[1]);
    if (rc == MPI_SUCCESS) rc = WaitPolitely(&reqs[0]);
    if (rc == MPI_SUCCESS && any_joined) rc = WaitPolitely(&reqs[1]);
    if (rc != MPI_SUCCESS) {
      a.error = MpiError("check round", rc, joined ? "join" : cands[0]->desc);
      a.n = 1;
      return a;
    }
    if (wr[0] != -wr[3] || wr[1] != -wr[4]) {
      a.n = 1;
      a.error = DescribeFailure(cands, joined);
      return a;
    }
    if (wr[2] == 1) {
      a.n = 1;
      std::ostringstream os;
      os << "MPIKVStoreError: mxnet_mpi: the root of a broadcast of store '" << cfg_.store
         << "' (rank " << u.root << ") has already joined (it ran out of data): a joined "
         << "rank can take part in sums, not be a broadcast's source";
      a.error = os.str();
      return a;
    }
    u.total = wr[1];
    u.active = size_ - joined_all;
  }
  return a;
}

std::string Lane::DescribeFailure(const std::vector<Request*>& cands, bool joined) {
  struct Record {
    int64_t seq, count;
    int32_t token, joined, flags;
    char desc[200];
    char where[240];   // Where(): the parameter and the push, as this rank names them
    char reason[440];
  };
  Record mine{};
  if (joined) {
    mine.joined = 1;
  } else {
    const Request& r = *cands[0];
    mine.seq = static_cast<int64_t>(r.seq);
    mine.count = r.Count();
    mine.token = r.token.empty() ? 0 : 1;
    mine.flags = r.flags;
    std::strncpy(mine.desc, r.desc.c_str(), sizeof(mine.desc) - 1);
    std::strncpy(mine.where, Where(r).c_str(), sizeof(mine.where) - 1);
    std::strncpy(mine.reason, r.token.c_str(), sizeof(mine.reason) - 1);
  }
  std::vector<Record> all(size_);
  MPI_Allgather(&mine, sizeof(Record), MPI_BYTE, all.data(), sizeof(Record), MPI_BYTE, cfg_.comm);
  std::ostringstream os;
  os << "mxnet_mpi: ";
  bool any_token = false, differ = false;
  const Record* ref = nullptr;
  for (const Record& rec : all) {
    if (rec.joined) continue;
    if (!ref) ref = &rec;
    differ = differ || rec.seq != ref->seq || std::strcmp(rec.desc, ref->desc) != 0 ||
             rec.count != ref->count || rec.flags != ref->flags;
  }
  for (int i = 0; i < size_; ++i) {
    if (!all[i].token) continue;
    os << (any_token ? "; " : "") << "rank " << i << " could not take part in collective #"
       << all[i].seq << " " << Quote(all[i].desc) << all[i].where << " of store '" << cfg_.store
       << "': " << all[i].reason;
    any_token = true;
  }
  if (differ || !any_token) {
    os << (any_token ? "; besides, " : "")
       << "ranks disagree on a collective of store '" << cfg_.store
       << "' (different key, shape or dtype, or collectives issued in a different order or "
          "skipped on some rank): ";
    bool first = true;
    for (int i = 0; i < size_; ++i) {
      if (all[i].joined) continue;
      os << (first ? "" : "; ") << "rank " << i << " runs #" << all[i].seq << " "
         << Quote(all[i].desc) << " (" << all[i].count << " elements"
         << Reduction(all[i].flags) << ")" << all[i].where;
      first = false;
    }
  }
  const std::string msg = os.str();
  if (!mine.token && !mine.joined) {
    // A rank that failed locally has raised already; the others learn it here
    // (printed too, since a job that stops on it may never show the exception).
    std::fprintf(stderr, "[rank %d] %s\n", rank_, msg.c_str());
    std::fflush(stderr);
  }
  return "MPIKVStoreError: " + msg;
}

Ran Lane::RunOne(const std::vector<Request*>& cands, bool joined, int64_t piece_bytes,
                 const int64_t* checked) {
  Agreement a = Agree(cands, joined, checked);
  Ran ran;
  if (a.all_joined) {
    ran.n = -1;
    return ran;
  }
  ran.n = a.n;
  std::vector<uint64_t> seqs;
  if (!joined) {
    for (int i = 0; i < a.n && i < static_cast<int>(cands.size()); ++i)
      seqs.push_back(cands[i]->seq);
  }
  if (!a.error.empty()) {
    Finish(seqs, a.error);
    return ran;
  }
  Unit& u = a.unit;
  const int esize = DTypeSize(u.dtype);
  if (piece_bytes > 0 && u.op == OpKind::kAllreduce && (u.flags & kCompressFp16) == 0 &&
      a.n == 1 && a.parts == 1 && esize > 0) {
    // Pieces at fixed multiples of their size from the array's start: the same
    // MPI calls on each element whatever runs in between, on every rank.
    const int64_t piece =
        std::max<int64_t>(1, std::min(piece_bytes, cfg_.chunk_bytes) / esize);
    if (u.total > piece) u.to = std::min(u.total, u.from + piece);
  }
  const int64_t start = g_timeline_on ? NowUs() : 0;
  for (Request* r : u.members)
    if (r->progress == 0) r->t_start = start;
  Transfer t;
  t.chunk_bytes = cfg_.chunk_bytes;
  t.p2p_bytes = cfg_.p2p_bytes;
  const std::string err = RunUnit(cfg_.comm, &u, &scratch_, t);
  ran.bytes = (u.to >= 0 ? u.to - u.from : u.total) * esize;
  if (u.to >= 0 && g_timeline_on && !joined)
    u.members[0]->pieces.emplace_back(start, NowUs());
  if (u.to >= 0 && u.to < u.total && err.empty()) {
    if (!joined) u.members[0]->progress = u.to;
    ran.n = 0;
    ran.partial = true;
    return ran;
  }
  Finish(seqs, err);
  return ran;
}

void Lane::Finish(const std::vector<uint64_t>& seqs, const std::string& err) {
  if (seqs.empty()) return;
  std::vector<Request> done;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (uint64_t seq : seqs) {
      for (auto it = order_.begin(); it != order_.end(); ++it) {
        if (*it == seq) {
          order_.erase(it);
          break;
        }
      }
      auto it = ready_.find(seq);
      done.push_back(std::move(it->second));
      ready_.erase(it);
    }
  }
  for (Request& r : done) {
    FlightEnd(r.flight);
    TimelineRecord(r, err.empty());
    if (r.done) r.done(err);
  }
  cv_.notify_all();
}

}  // namespace mxnet_mpi
