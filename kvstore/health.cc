#include <pthread.h>
#include "health.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

namespace mxnet_mpi {

HealthOptions& Options() {
  static HealthOptions options;
  return options;
}

namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// ---------------------------------------------------------------- flights
struct Flight {
  FlightKind kind;
  int store;
  uint64_t seq;
  std::string desc;
  std::string where;
  Clock::time_point since;
};

std::mutex g_flight_mu;
std::map<uint64_t, Flight> g_flights;
uint64_t g_next_flight = 1;

// (store, seq) of the collectives in flight, oldest first, at most `max`.
std::vector<std::pair<int, uint64_t>> InFlight(size_t max) {
  std::vector<std::pair<Clock::time_point, std::pair<int, uint64_t>>> all;
  {
    std::lock_guard<std::mutex> lock(g_flight_mu);
    for (const auto& kv : g_flights)
      if (kv.second.kind == FlightKind::kCollective)
        all.push_back({kv.second.since, {kv.second.store, kv.second.seq}});
  }
  std::sort(all.begin(), all.end());
  std::vector<std::pair<int, uint64_t>> out;
  for (size_t i = 0; i < all.size() && i < max; ++i) out.push_back(all[i].second);
  return out;
}

bool Oldest(uint64_t* id, Flight* out) {
  std::lock_guard<std::mutex> lock(g_flight_mu);
  bool found = false;
  for (const auto& kv : g_flights) {
    if (!found || kv.second.since < out->since) {
      *out = kv.second;
      *id = kv.first;
      found = true;
    }
  }
  return found;
}

void ShiftFlights(Clock::duration by) {
  std::lock_guard<std::mutex> lock(g_flight_mu);
  for (auto& kv : g_flights) kv.second.since += by;
}

// ---------------------------------------------------------------- members
struct Members {
  std::string name;
  std::vector<int> ranks;
};
std::mutex g_members_mu;
std::map<int, Members> g_members;

bool MembersOf(int store, Members* out) {
  std::lock_guard<std::mutex> lock(g_members_mu);
  auto it = g_members.find(store);
  if (it == g_members.end()) return false;
  *out = it->second;
  return true;
}

// ---------------------------------------------------------------- heartbeats
constexpr int kTag = 7;
constexpr int kDescLen = 152;
constexpr int kWhereLen = 200;
constexpr int kMaxFinals = 16;
// A rank has several collectives in flight at once (a step's gradients);
// which is its oldest differs from rank to rank, so each heartbeat carries
// them all (the oldest this many): a peer in flight on the one a rank waits
// on is waiting on it too, not missing.
constexpr int kMaxInFlight = 32;

// kFinishing: the program ended (Python's exit handlers run); kStopping: the
// process reached the end of the job (MPI is being finalised).
enum State : int32_t { kRunning = 0, kFinishing = 1, kStopping = 2 };

struct Status {
  int32_t rank, state, waiting, kind;
  int32_t store, nfinals;
  int64_t seq;
  double age;
  int32_t pid, pad;
  char desc[kDescLen];
  char where[kWhereLen];
  int64_t finals[kMaxFinals][3];  // (store id, collectives issued, joins completed)
  int32_t ninflight, pad2;
  int64_t inflight[kMaxInFlight][2];  // (store id, seq) of its collectives in flight
};

struct Peer {
  Status last{};
  bool heard = false;
  Clock::time_point at;
  Status out{};
  MPI_Request send = MPI_REQUEST_NULL;
  bool stop_posted = false;  // our kStopping status is on its way to this peer
};

std::thread* g_thread = nullptr;  // never destroyed at exit (forked children)
MPI_Comm g_comm = MPI_COMM_NULL;
int g_rank = 0, g_size = 1;
std::atomic<bool> g_running{false};
std::atomic<bool> g_stop{false};
std::atomic<bool> g_announce{false};
std::mutex g_finals_mu;
std::vector<std::array<int64_t, 3>> g_finals;
bool g_finishing = false;
Clock::time_point g_finishing_since;

Status Mine() {
  Status s{};
  s.rank = g_rank;
  s.pid = static_cast<int32_t>(getpid());
  uint64_t id;
  Flight f;
  if (Oldest(&id, &f)) {
    s.waiting = 1;
    s.kind = static_cast<int32_t>(f.kind);
    s.store = f.store;
    s.seq = static_cast<int64_t>(f.seq);
    s.age = Seconds(Clock::now() - f.since);
    std::strncpy(s.desc, f.desc.c_str(), kDescLen - 1);
    std::strncpy(s.where, f.where.c_str(), kWhereLen - 1);
  }
  const auto inflight = InFlight(kMaxInFlight);
  s.ninflight = static_cast<int32_t>(inflight.size());
  for (size_t i = 0; i < inflight.size(); ++i) {
    s.inflight[i][0] = inflight[i].first;
    s.inflight[i][1] = static_cast<int64_t>(inflight[i].second);
  }
  std::lock_guard<std::mutex> lock(g_finals_mu);
  s.state = g_stop ? kStopping : g_finishing ? kFinishing : kRunning;
  s.nfinals = static_cast<int32_t>(std::min<size_t>(g_finals.size(), kMaxFinals));
  for (int i = 0; i < s.nfinals; ++i) {
    for (int j = 0; j < 3; ++j) s.finals[i][j] = g_finals[i][j];
  }
  return s;
}

void SendAll(std::vector<Peer>* peers) {
  const Status mine = Mine();
  for (int p = 0; p < g_size; ++p) {
    if (p == g_rank) continue;
    Peer& peer = (*peers)[p];
    if (peer.send != MPI_REQUEST_NULL) {
      int done = 0;
      MPI_Test(&peer.send, &done, MPI_STATUS_IGNORE);
      if (!done) continue;  // not receiving (stopped?): never pile up sends
    }
    peer.out = mine;
    MPI_Isend(&peer.out, sizeof(Status), MPI_BYTE, p, kTag, g_comm, &peer.send);
    peer.stop_posted = mine.state == kStopping;
  }
}

// Whether every peer has been sent this rank's kStopping status. A send still
// pending from before is skipped by SendAll, so a rank must not go quiet in
// the final barrier until the status that its peers wait for has left.
bool StopPosted(const std::vector<Peer>& peers) {
  for (int p = 0; p < g_size; ++p)
    if (p != g_rank && !peers[p].stop_posted) return false;
  return true;
}

void Drain(std::vector<Peer>* peers) {
  for (;;) {
    int flag = 0;
    MPI_Status st;
    MPI_Iprobe(MPI_ANY_SOURCE, kTag, g_comm, &flag, &st);
    if (!flag) return;
    Status s;
    MPI_Recv(&s, sizeof(Status), MPI_BYTE, st.MPI_SOURCE, kTag, g_comm, MPI_STATUS_IGNORE);
    Peer& peer = (*peers)[st.MPI_SOURCE];
    peer.last = s;
    peer.heard = true;
    peer.at = Clock::now();
  }
}

double SilentAfter() { return std::max(3 * Options().interval_s, 1.5); }

bool Silent(const Peer& p, Clock::time_point now) { return Seconds(now - p.at) > SilentAfter(); }

// What a finished peer did on a store: collectives issued, joins completed.
int64_t FinalOn(const Status& s, int store, int what) {
  for (int i = 0; i < s.nfinals; ++i)
    if (s.finals[i][0] == store) return s.finals[i][what];
  return 0;
}
int64_t IssuedOn(const Status& s, int store) { return FinalOn(s, store, 1); }

std::string Where(const Flight& f, const Members& m) {
  std::ostringstream os;
  if (f.kind == FlightKind::kJoin) {
    os << "join() on store '" << m.name << "'";
  } else {
    os << "'" << f.desc << "'" << f.where << " (collective #" << f.seq << " of store '"
       << m.name << "')";
  }
  return os.str();
}

// Who the flight waits for, and what each of them is doing.
std::string Peers(const Flight& f, const Members& m, const std::vector<Peer>& peers,
                  Clock::time_point now, bool* any_missing) {
  std::ostringstream waiting, missing;
  waiting << " " << g_rank;
  *any_missing = false;
  for (int p : m.ranks) {
    if (p == g_rank || p < 0 || p >= g_size) continue;
    const Peer& peer = peers[p];
    const Status& s = peer.last;
    bool same = peer.heard && s.waiting && s.store == f.store &&
                s.kind == static_cast<int32_t>(f.kind) &&
                (f.kind == FlightKind::kJoin || s.seq == static_cast<int64_t>(f.seq));
    for (int i = 0; i < s.ninflight && i < kMaxInFlight && peer.heard && !same; ++i)
      same = f.kind == FlightKind::kCollective && s.inflight[i][0] == f.store &&
             s.inflight[i][1] == static_cast<int64_t>(f.seq);
    if (same && !Silent(peer, now)) {
      waiting << " " << p;
      continue;
    }
    missing << (*any_missing ? "; " : " ") << p << " (";
    *any_missing = true;
    if (!peer.heard || Silent(peer, now)) {
      missing << "not answering for " << static_cast<int>(Seconds(now - peer.at))
              << " s: stopped (e.g. SIGSTOP), hung outside Python, or its host is unreachable";
    } else if (s.state >= kFinishing) {
      missing << "finished its program after issuing " << IssuedOn(s, f.store)
              << " collectives on this store";
    } else if (s.waiting && s.kind == static_cast<int32_t>(FlightKind::kJoin)) {
      missing << "alive, has joined (ran out of data) and waits for the others";
    } else if (s.waiting) {
      missing << "alive, waiting on '" << s.desc << "'" << s.where;
      if (s.kind == static_cast<int32_t>(FlightKind::kCollective)) {
        missing << " (#" << s.seq;
        Members other;
        // Two stores whose collectives the ranks issue in different orders
        // (two Trainers stepped in turn): each waits on its own store.
        if (s.store != f.store)
          missing << " of another store"
                  << (MembersOf(static_cast<int>(s.store), &other) ? ", '" + other.name + "'" : "")
                  << ": the ranks wait on different stores, which they use in different "
                     "orders";
        missing << ")";
      }
      missing << " for " << static_cast<int>(s.age) << " s";
    } else {
      missing << "alive, no collective ready: not pushed yet, or its inputs not computed";
    }
    missing << ")";
  }
  if (!*any_missing)  // it named nobody ("Missing ranks:.") where every rank is in it
    return ". Ranks waiting on it:" + waiting.str() + ". No rank is missing: every rank has "
           "issued it and its data moves slowly or not at all (a link between hosts down, "
           "congested or losing packets, or ranks that do not get the CPU)";
  return ". Ranks waiting on it:" + waiting.str() + ". Missing ranks:" + missing.str();
}

std::string ServerNote() {
  return ": a parameter-server request (the servers or the scheduler do not answer: stopped, "
         "dead or overloaded; `python -m mxnet_mpi.launch` names stopped servers; or a "
         "synchronous server waits for a group that has not got there: groups that run "
         "different numbers of steps)";
}

void Evaluate(const std::vector<Peer>& peers, std::set<std::pair<uint64_t, int>>* warned) {
  uint64_t id;
  Flight f;
  if (!Oldest(&id, &f)) return;
  const auto now = Clock::now();
  const double age = Seconds(now - f.since);
  const HealthOptions& o = Options();
  Members m;
  const bool known = f.kind != FlightKind::kServer && MembersOf(f.store, &m);
  if (known) {
    // A peer that finished its program never runs what it did not issue.
    for (int p : m.ranks) {
      if (p == g_rank || p < 0 || p >= g_size || !peers[p].heard) continue;
      const Status& s = peers[p].last;
      if (s.state < kFinishing) continue;
      const int64_t issued = IssuedOn(s, f.store);
      if (f.kind == FlightKind::kCollective && static_cast<int64_t>(f.seq) >= issued) {
        std::ostringstream os;
        const std::string where = Where(f, m);
        os << "rank " << p << " finished its program after issuing " << issued
           << " collectives on store '" << m.name << "', but this rank waits on " << where
           << ", which rank " << p << " will never run. ";
        // SyncBatchNorm's own stores, or its first-forward meeting on the free functions'
        if (m.name.rfind("SyncBatchNorm", 0) == 0 ||
            where.find("'SyncBatchNorm ") != std::string::npos)
          os << "A SyncBatchNorm layer meets every rank at each training forward and "
             << "backward and cannot join: every rank needs the same number of training "
             << "batches through it";
        else
          os << "Ranks with uneven amounts of data must call join() (kv.join() or "
             << "mxnet_mpi.join()) when they run out (the hybrid stores dist_sync_mpi and "
             << "dist_async_mpi cannot join: there, every rank needs the same number of "
             << "batches)";
        AbortJob(os.str(), 4);
      }
      // A join flight's seq is the joins this rank completed before it.
      if (f.kind == FlightKind::kJoin && static_cast<int64_t>(f.seq) >= FinalOn(s, f.store, 2)) {
        std::ostringstream os;
        os << "rank " << p << " finished its program without calling join() on store '"
           << m.name << "', while this rank waits in join() for every rank to join";
        AbortJob(os.str(), 4);
      }
    }
  }
  if (age < o.warn_s && age < o.abort_s) return;
  std::string detail;
  bool missing = false;
  int silent = 0;
  if (known) {
    detail = Peers(f, m, peers, now, &missing);
    for (int p : m.ranks)
      if (p != g_rank && p >= 0 && p < g_size && (!peers[p].heard || Silent(peers[p], now)))
        ++silent;
  } else if (f.kind == FlightKind::kServer) {
    detail = ServerNote();
  } else if (f.kind == FlightKind::kLocal) {
    detail = " (every device of a rank must run each training forward and backward of the "
             "layer; several CPU contexts share MXNet's MXNET_CPU_TEMP_COPY temp spaces, and too "
             "few of them deadlock the devices: see docs/collectives.md, SyncBatchNorm)";
  }
  const std::string what = known ? Where(f, m) : "'" + f.desc + "'" + f.where;
  if (age >= o.abort_s) {
    std::ostringstream os;
    os << (f.kind == FlightKind::kCollective ? "collective " : "") << what << " has waited "
       << static_cast<int>(age) << " s, more than MXNET_MPI_STALL_ABORT_S=" << o.abort_s
       << detail;
    AbortJob(os.str());
  }
  // Once per flight, and again when more peers stop answering.
  if (warned->count({id, silent})) return;
  warned->insert({id, silent});
  std::ostringstream os;
  os << "[rank " << g_rank << "] mxnet_mpi: stall warning: " << what << " has waited "
     << static_cast<int>(age) << " s" << detail << ". Aborts after MXNET_MPI_STALL_ABORT_S="
     << o.abort_s << " s.\n";
  std::fputs(os.str().c_str(), stderr);
  std::fflush(stderr);
}

bool AllStopping(const std::vector<Peer>& peers) {
  for (int p = 0; p < g_size; ++p) {
    if (p == g_rank) continue;
    if (!peers[p].heard || peers[p].last.state != kStopping) return false;
  }
  return true;
}

// The ranks this one waits for at the end of the job, and what each does.
std::string NotStopping(const std::vector<Peer>& peers, Clock::time_point now, int* silent) {
  std::ostringstream os;
  *silent = 0;
  for (int p = 0; p < g_size; ++p) {
    if (p == g_rank || (peers[p].heard && peers[p].last.state == kStopping)) continue;
    os << (os.tellp() > 0 ? "; " : " ") << p << " (";
    if (!peers[p].heard || Silent(peers[p], now)) {
      ++*silent;
      os << "not answering for " << static_cast<int>(Seconds(now - peers[p].at))
         << " s: stopped, hung outside Python, or its host is unreachable";
    } else if (peers[p].last.state == kFinishing) {
      os << "its program ended, but its process does not exit: stuck in exit handlers or "
            "interpreter shutdown (threads or child processes, e.g. DataLoader workers, "
            "that do not end)";
    } else if (peers[p].last.waiting) {
      os << "still running its program, waiting on '" << peers[p].last.desc << "'"
         << peers[p].last.where;
    } else {
      os << "still running its program or its exit handlers";
    }
    os << ")";
  }
  return os.str();
}

// Once this rank's program ended: nothing may wait silently for ever, this
// rank's own exit (stuck in Python's exit handlers) or its peers' at the end
// of the job. Warns once at MXNET_MPI_STALL_WARN_S, aborts at ..._ABORT_S.
// A wait with a flight (a collective, the parameter servers' exit barrier)
// is Evaluate's, which names it better; this clock starts when the last ends.
void EvaluateEnd(const std::vector<Peer>& peers, Clock::time_point now, bool* warned,
                 Clock::time_point* quiet_since) {
  uint64_t id;
  Flight f;
  if (Oldest(&id, &f)) {
    *quiet_since = now;
    return;
  }
  bool finishing;
  Clock::time_point since;
  {
    std::lock_guard<std::mutex> lock(g_finals_mu);
    finishing = g_finishing;
    since = g_finishing_since;
  }
  if (!finishing) return;
  const HealthOptions& o = Options();
  const double age = Seconds(now - std::max(since, *quiet_since));
  if (age < o.warn_s && age < o.abort_s) return;
  std::ostringstream os;
  if (!g_stop) {
    os << "this rank's program ended " << static_cast<int>(age) << " s ago, but its process "
       << "does not exit: stuck in Python's exit handlers or interpreter shutdown (threads "
       << "or child processes, e.g. DataLoader workers, that do not end)";
  } else {
    int silent = 0;
    const std::string who = NotStopping(peers, now, &silent);
    if (who.empty()) return;  // the final barrier: every peer is at the end too
    os << "this rank's program ended " << static_cast<int>(age) << " s ago and it waits "
       << "for the end of the job. Ranks not there yet:" << who;
  }
  if (age >= o.abort_s) {
    os << " (more than MXNET_MPI_STALL_ABORT_S=" << o.abort_s << ")";
    AbortJob(os.str());
  }
  if (*warned) return;
  *warned = true;
  std::fprintf(stderr, "[rank %d] mxnet_mpi: stall warning: %s. Aborts after "
               "MXNET_MPI_STALL_ABORT_S=%g s.\n", g_rank, os.str().c_str(), o.abort_s);
  std::fflush(stderr);
}

void Loop() {
  std::vector<Peer> peers(g_size);
  const auto start = Clock::now();
  for (Peer& p : peers) p.at = start;
  auto last = start, next_send = start;
  std::set<std::pair<uint64_t, int>> warned;
  bool barrier = false, end_warned = false;
  bool stop_announced = false;
  Clock::time_point quiet_since = start;
  MPI_Request barrier_req = MPI_REQUEST_NULL;
  Clock::time_point barrier_since;
  for (;;) {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;  // someone else (the user, mpi4py) ended MPI
    const auto now = Clock::now();
    const auto gap = now - last;
    last = now;
    const HealthOptions& o = Options();
    if (Seconds(gap) > std::max(3 * o.interval_s, 2.0)) {
      // This process was not running (stopped, or starved): do not blame peers.
      std::fprintf(stderr, "[rank %d] mxnet_mpi: this rank did not run for %d s (stopped with "
                   "SIGSTOP, or starved); peers may have reported it\n", g_rank,
                   static_cast<int>(Seconds(gap)));
      std::fflush(stderr);
      for (Peer& p : peers) p.at = now;
      ShiftFlights(gap);
    }
    if (g_stop && !stop_announced) {  // tell the peers at once: they may be waiting for it
      stop_announced = true;
      g_announce = true;
    }
    const bool unposted = g_stop && !barrier && !StopPosted(peers);
    if (!barrier && (now >= next_send || g_announce.exchange(false) || unposted)) {
      SendAll(&peers);
      next_send = now + std::chrono::duration_cast<Clock::duration>(
                            std::chrono::duration<double>(o.interval_s));
    }
    Drain(&peers);
    if (!barrier) Evaluate(peers, &warned);
    if (!barrier) EvaluateEnd(peers, now, &end_warned, &quiet_since);
    if (g_stop && !barrier) {
      if (AllStopping(peers) && StopPosted(peers)) {
        MPI_Ibarrier(g_comm, &barrier_req);
        barrier = true;
        barrier_since = now;
      } else {
        for (int p = 0; p < g_size; ++p) {
          if (p != g_rank && Seconds(now - peers[p].at) > o.abort_s) {
            std::ostringstream os;
            os << "rank " << p << " stopped answering " << static_cast<int>(Seconds(now - peers[p].at))
               << " s ago (more than MXNET_MPI_STALL_ABORT_S=" << o.abort_s
               << ") while this rank waits for the end of the job";
            AbortJob(os.str());
          }
        }
      }
    }
    if (barrier) {
      int done = 0;
      MPI_Test(&barrier_req, &done, MPI_STATUS_IGNORE);
      if (done) {
        for (Peer& p : peers)
          if (p.send != MPI_REQUEST_NULL) MPI_Wait(&p.send, MPI_STATUS_IGNORE);
        Drain(&peers);
        return;
      }
      if (Seconds(now - barrier_since) > o.abort_s)
        AbortJob("a peer never reached the end of the job (finalize)");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

}  // namespace

uint64_t FlightBegin(FlightKind kind, int store, uint64_t seq, const std::string& desc,
                     const std::string& where) {
  std::lock_guard<std::mutex> lock(g_flight_mu);
  const uint64_t id = g_next_flight++;
  g_flights.emplace(id, Flight{kind, store, seq, desc, where, Clock::now()});
  return id;
}

void FlightTouch(uint64_t id) {
  std::lock_guard<std::mutex> lock(g_flight_mu);
  auto it = g_flights.find(id);
  if (it != g_flights.end()) it->second.since = Clock::now();
}

void FlightEnd(uint64_t id) {
  if (id == 0) return;
  std::lock_guard<std::mutex> lock(g_flight_mu);
  g_flights.erase(id);
}

void HealthSetMembers(int store, const std::string& name, const std::vector<int>& world_ranks) {
  std::lock_guard<std::mutex> lock(g_members_mu);
  g_members[store] = Members{name, world_ranks};
}

void HealthForgetMembers(int store) {
  std::lock_guard<std::mutex> lock(g_members_mu);
  g_members.erase(store);
}

void HealthStart(MPI_Comm comm, int world_rank) {
  g_comm = comm;
  g_rank = world_rank;
  MPI_Comm_size(comm, &g_size);
  g_stop = false;
  g_running = true;
  g_thread = new std::thread([] {
    pthread_setname_np(pthread_self(), "mxmpi-health");
    Loop();
  });
}

void HealthAnnounceFinish(const std::vector<std::array<int64_t, 3>>& finals) {
  {
    std::lock_guard<std::mutex> lock(g_finals_mu);
    g_finals = finals;
    if (!g_finishing) g_finishing_since = Clock::now();
    g_finishing = true;
  }
  g_announce = true;
}

void HealthStop() {
  if (!g_thread || !g_thread->joinable()) return;
  g_stop = true;
  g_thread->join();
  delete g_thread;
  g_thread = nullptr;
  g_running = false;
}

bool HealthRunning() { return g_running; }

void AbortJob(const std::string& why, int code) {
  std::fprintf(stderr, "[rank %d] mxnet_mpi: %s; aborting the MPI job\n", g_rank, why.c_str());
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, code);
  std::abort();
}

}  // namespace mxnet_mpi
