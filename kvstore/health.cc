#include "health.h"

#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>
#include <vector>

namespace mxnet_mpi {

HealthOptions& Options() {
  static HealthOptions options;
  return options;
}

// ---------------------------------------------------------------- signatures
namespace {

uint64_t Fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

constexpr int kNameLen = 112;

struct Described {
  char name[kNameLen];
  int64_t count;
  int64_t op;
};

std::string Describe(const char* name, int64_t count, int64_t op) {
  std::ostringstream os;
  os << "'" << name << "' (" << count << " elements"
     << (op == static_cast<int64_t>(OpKind::kBroadcast) ? ", broadcast" : "") << ")";
  return os.str();
}

}  // namespace

std::string CheckSignature(const Request& r) {
  const int64_t sig[4] = {static_cast<int64_t>(Fnv1a(r.name) >> 1), r.count, r.dtype,
                          static_cast<int64_t>(r.op) | (static_cast<int64_t>(r.root) << 8)};
  int64_t both[8], out[8];
  for (int i = 0; i < 4; ++i) {
    both[i] = sig[i];
    both[4 + i] = -sig[i];
  }
  if (MPI_Allreduce(both, out, 8, MPI_INT64_T, MPI_MAX, r.comm) != MPI_SUCCESS)
    return "mxnet_mpi: signature check failed for '" + r.name + "'";
  bool same = true;
  for (int i = 0; i < 4; ++i) same = same && out[i] == -out[4 + i];
  if (same) return "";

  int rank = 0, size = 1;
  MPI_Comm_rank(r.comm, &rank);
  MPI_Comm_size(r.comm, &size);
  Described mine{};
  std::strncpy(mine.name, r.name.c_str(), kNameLen - 1);
  mine.count = r.count;
  mine.op = static_cast<int64_t>(r.op);
  std::vector<Described> all(size);
  MPI_Allgather(&mine, sizeof(Described), MPI_BYTE, all.data(), sizeof(Described), MPI_BYTE,
                r.comm);
  std::ostringstream os;
  os << "mxnet_mpi: ranks disagree on a collective (different key, shape or dtype, or keys "
        "pushed in a different order): ";
  for (int i = 0; i < size; ++i) {
    os << (i ? "; " : "") << "rank " << i << " runs "
       << Describe(all[i].name, all[i].count, all[i].op);
  }
  const std::string msg = os.str();
  std::fprintf(stderr, "[rank %d] %s\n", rank, msg.c_str());
  std::fflush(stderr);
  return msg;
}

// ---------------------------------------------------------------- in flight
namespace {

using Clock = std::chrono::steady_clock;

struct Flight {
  std::string name;
  Clock::time_point since;
};

std::mutex g_flight_mu;
std::map<uint64_t, Flight> g_flights;  // ordered by id = by time of readiness
uint64_t g_next_flight = 1;

// The longest-waiting collective on this rank, if any.
bool Oldest(Flight* out) {
  std::lock_guard<std::mutex> lock(g_flight_mu);
  if (g_flights.empty()) return false;
  *out = g_flights.begin()->second;
  return true;
}

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

}  // namespace

uint64_t FlightBegin(const std::string& name) {
  std::lock_guard<std::mutex> lock(g_flight_mu);
  const uint64_t id = g_next_flight++;
  g_flights.emplace(id, Flight{name, Clock::now()});
  return id;
}

void FlightEnd(uint64_t id) {
  if (id == 0) return;
  std::lock_guard<std::mutex> lock(g_flight_mu);
  g_flights.erase(id);
}

// ---------------------------------------------------------------- health thread
namespace {

struct Status {
  int32_t rank;
  int32_t stopping;
  int32_t waiting;  // 1 if a collective is in flight
  int32_t pad;
  double age;       // seconds the oldest collective has waited
  char name[kNameLen];
};

std::thread g_health;
std::atomic<bool> g_stopping{false};
MPI_Comm g_health_comm = MPI_COMM_NULL;
int g_rank = 0;

[[noreturn]] void AbortJob(const std::string& why) {
  std::fprintf(stderr, "[rank %d] mxnet_mpi: %s; aborting the MPI job\n", g_rank, why.c_str());
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, 3);
  std::abort();
}

void MaybeAbortOwnStall() {
  Flight f;
  if (Oldest(&f) && Seconds(f.since) > Options().abort_s) {
    std::ostringstream os;
    os << "collective '" << f.name << "' has waited " << static_cast<int>(Seconds(f.since))
       << " s for its peers, more than MXNET_MPI_STALL_ABORT_S=" << Options().abort_s;
    AbortJob(os.str());
  }
}

void Report(const std::vector<Status>& all, std::set<std::string>* warned) {
  const Status& me = all[g_rank];
  if (!me.waiting || me.age < Options().warn_s || warned->count(me.name)) return;
  warned->insert(me.name);
  std::ostringstream os;
  os << "[rank " << g_rank << "] mxnet_mpi: stall warning: '" << me.name << "' has waited "
     << static_cast<int>(me.age) << " s. Ranks waiting on it:";
  for (const Status& s : all)
    if (s.waiting && std::strcmp(s.name, me.name) == 0) os << " " << s.rank;
  os << ". Missing ranks:";
  for (const Status& s : all) {
    if (s.waiting && std::strcmp(s.name, me.name) == 0) continue;
    os << " " << s.rank;
    if (s.waiting) {
      os << " (waiting on '" << s.name << "' for " << static_cast<int>(s.age) << " s)";
    } else {
      os << " (no collective ready: not pushed yet, or its inputs not computed)";
    }
  }
  os << ". Aborts after MXNET_MPI_STALL_ABORT_S=" << Options().abort_s << " s.\n";
  std::fputs(os.str().c_str(), stderr);
  std::fflush(stderr);
}

void HealthLoop() {
  int size = 1;
  MPI_Comm_size(g_health_comm, &size);
  std::vector<Status> all(size);
  std::set<std::string> warned;
  for (;;) {
    Status mine{};
    mine.rank = g_rank;
    mine.stopping = g_stopping.load();
    Flight f;
    if (Oldest(&f)) {
      mine.waiting = 1;
      mine.age = Seconds(f.since);
      std::strncpy(mine.name, f.name.c_str(), kNameLen - 1);
    }
    MPI_Request req;
    MPI_Iallgather(&mine, sizeof(Status), MPI_BYTE, all.data(), sizeof(Status), MPI_BYTE,
                   g_health_comm, &req);
    const auto round_start = Clock::now();
    for (int done = 0; !done;) {
      MPI_Test(&req, &done, MPI_STATUS_IGNORE);
      if (done) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      // A peer that never joins the round is dead or wedged: if we wait on a
      // collective meanwhile, our own stall decides.
      MaybeAbortOwnStall();
      if (g_stopping && Seconds(round_start) > Options().abort_s)
        AbortJob("a peer never reached the end of the job (finalize)");
    }
    bool all_stopping = true;
    for (const Status& s : all) all_stopping = all_stopping && s.stopping;
    if (all_stopping) return;
    Report(all, &warned);
    MaybeAbortOwnStall();
    if (!g_stopping) {
      const auto until = Clock::now() + std::chrono::duration<double>(Options().interval_s);
      while (!g_stopping && Clock::now() < until)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
}

}  // namespace

void HealthStart(MPI_Comm comm, int world_rank) {
  g_health_comm = comm;
  g_rank = world_rank;
  g_stopping = false;
  g_health = std::thread(&HealthLoop);
}

void HealthStop() {
  if (!g_health.joinable()) return;
  g_stopping = true;
  g_health.join();
}

}  // namespace mxnet_mpi
