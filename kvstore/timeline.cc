#include "timeline.h"

#include <chrono>
#include <cstdio>
#include <mutex>
#include <utility>
#include <vector>

namespace mxnet_mpi {

std::atomic<bool> g_timeline_on{false};

namespace {

struct Event {
  std::string name;
  int op;
  int64_t count, enqueue, ready, start, end;
  bool ok;
  std::vector<std::pair<int64_t, int64_t>> pieces;  // a pre-empted allreduce's
};

std::mutex g_timeline_mu;
std::vector<Event> g_events;

std::string Escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) >= 0x20) out += c;
  }
  return out;
}

}  // namespace

int64_t NowUs() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

void TimelineRecord(const Request& r, bool ok) {
  if (!g_timeline_on) return;
  const int64_t end = NowUs();
  std::lock_guard<std::mutex> lock(g_timeline_mu);
  g_events.push_back(Event{r.desc, static_cast<int>(r.op), r.Count(), r.t_enqueue, r.t_ready,
                           r.t_start ? r.t_start : r.t_ready, end, ok, r.pieces});
}

void TimelineStop() {
  g_timeline_on = false;
  std::lock_guard<std::mutex> lock(g_timeline_mu);
  g_events.clear();
}

std::string TimelineDump(const std::string& path, int rank) {
  std::vector<Event> events;
  {
    std::lock_guard<std::mutex> lock(g_timeline_mu);
    events = g_events;
  }
  FILE* f = std::fopen(path.c_str(), "w");
  if (!f) return "mxnet_mpi: cannot write timeline " + path;
  const int pid = 100000 + rank;  // apart from the pids of MXNet's profiler
  std::fprintf(f, "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n");
  std::fprintf(f, "{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": %d, "
               "\"args\": {\"name\": \"mxnet_mpi rank %d\"}}", pid, rank);
  const char* lanes[] = {"waiting for inputs", "queued for MPI", "MPI"};
  for (int t = 0; t < 3; ++t) {
    std::fprintf(f, ",\n{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": %d, \"tid\": %d, "
                 "\"args\": {\"name\": \"%s\"}}", pid, t, lanes[t]);
  }
  for (const Event& e : events) {
    const std::string name = Escape(e.name);
    const char* verb = OpName(static_cast<OpKind>(e.op));
    // one "collective" event per collective (the MPI part), with all times in args
    std::fprintf(f, ",\n{\"name\": \"%s\", \"cat\": \"collective\", \"ph\": \"X\", \"pid\": %d, "
                 "\"tid\": 2, \"ts\": %lld, \"dur\": %lld, \"args\": {\"op\": \"%s\", "
                 "\"elements\": %lld, \"enqueue_us\": %lld, \"ready_us\": %lld, "
                 "\"start_us\": %lld, \"end_us\": %lld, \"ok\": %s",
                 name.c_str(), pid, static_cast<long long>(e.start),
                 static_cast<long long>(e.end - e.start), verb, static_cast<long long>(e.count),
                 static_cast<long long>(e.enqueue), static_cast<long long>(e.ready),
                 static_cast<long long>(e.start), static_cast<long long>(e.end),
                 e.ok ? "true" : "false");
    if (!e.pieces.empty()) {
      // pre-empted: when each piece ran (other collectives ran in between)
      std::fprintf(f, ", \"pieces_us\": [");
      for (size_t i = 0; i < e.pieces.size(); ++i)
        std::fprintf(f, "%s[%lld, %lld]", i ? ", " : "",
                     static_cast<long long>(e.pieces[i].first),
                     static_cast<long long>(e.pieces[i].second));
      std::fprintf(f, "]");
    }
    std::fprintf(f, "}}");
    if (e.enqueue && e.ready > e.enqueue) {
      std::fprintf(f, ",\n{\"name\": \"%s\", \"cat\": \"inputs\", \"ph\": \"X\", \"pid\": %d, "
                   "\"tid\": 0, \"ts\": %lld, \"dur\": %lld}", name.c_str(), pid,
                   static_cast<long long>(e.enqueue), static_cast<long long>(e.ready - e.enqueue));
    }
    if (e.start > e.ready) {
      std::fprintf(f, ",\n{\"name\": \"%s\", \"cat\": \"queue\", \"ph\": \"X\", \"pid\": %d, "
                   "\"tid\": 1, \"ts\": %lld, \"dur\": %lld}", name.c_str(), pid,
                   static_cast<long long>(e.ready), static_cast<long long>(e.start - e.ready));
    }
  }
  std::fprintf(f, "\n]}\n");
  return std::fclose(f) == 0 ? "" : "mxnet_mpi: error writing timeline " + path;
}

}  // namespace mxnet_mpi
