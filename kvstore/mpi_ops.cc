// Blocking MPI calls on raw buffers for every collective kind, plus the
// small helpers (dtypes, signatures) the rest of the library shares.
#include "mpi_ops.h"

#include <sys/prctl.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstring>
#include <limits>
#include <mutex>
#include <thread>
#include <utility>

#include "half.h"


namespace mxnet_mpi {

// ---------------------------------------------------------------- helpers
const char* OpName(OpKind op) {
  switch (op) {
    case OpKind::kAllreduce: return "allreduce";
    case OpKind::kBroadcast: return "broadcast";
    case OpKind::kAllgather: return "allgather";
    case OpKind::kAlltoall: return "alltoall";
    case OpKind::kReduceScatter: return "reduce_scatter";
  }
  return "?";
}

int DTypeSize(int dtype) {
  switch (dtype) {
    case kFloat32: case kInt32: return 4;
    case kFloat64: case kInt64: return 8;
    case kFloat16: return 2;
    case kUint8: case kInt8: return 1;
    default: return 0;
  }
}

bool IsFloat(int dtype) { return dtype == kFloat32 || dtype == kFloat64 || dtype == kFloat16; }

std::string Where(const Request& r) {
  std::string out;
  if (!r.name.empty()) out += " for " + r.name;
  if (r.context && !r.context->empty()) out += " [" + *r.context + "]";
  return out;
}

uint64_t Hash(const void* data, size_t n, uint64_t h) {
  const unsigned char* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

uint64_t Signature(const Request& r) {
  uint64_t h = Hash(r.desc.data(), r.desc.size());
  // Not the priority: a scheduling hint that may differ between ranks.
  const int64_t head[5] = {static_cast<int64_t>(r.op), r.dtype, r.root, r.flags,
                           static_cast<int64_t>(r.parts.size())};
  h = Hash(head, sizeof(head), h);
  if (r.op == OpKind::kAllgather || r.op == OpKind::kAlltoall) {
    h = Hash(&r.row, sizeof(r.row), h);  // first dimensions differ between ranks
  } else {
    for (const Part& p : r.parts) h = Hash(&p.count, sizeof(p.count), h);
  }
  return h >> 2;  // non-negative, and negatable without overflow (lane.cc)
}

MPI_Datatype MpiType(int dtype) {
  switch (dtype) {
    case kFloat32: return MPI_FLOAT;
    case kFloat64: return MPI_DOUBLE;
    case kFloat16: return MPI_UINT16_T;
    case kUint8: return MPI_UINT8_T;
    case kInt32: return MPI_INT32_T;
    case kInt8: return MPI_INT8_T;
    case kInt64: return MPI_INT64_T;
    default: return MPI_DATATYPE_NULL;
  }
}

std::string MpiError(const char* what, int code, const std::string& name) {
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, msg, &len);
  return std::string("mxnet_mpi: ") + what + " failed for '" + name + "': " +
         std::string(msg, len);
}

namespace {

// float16 has no MPI datatype: reduce it as 2-byte words with user ops that
// compute in float32 and round once, which is what numpy does for float16.
void HalfSum(void* invec, void* inoutvec, int* len, MPI_Datatype*) {
  AddHalf(static_cast<const _Float16*>(invec), static_cast<_Float16*>(inoutvec), *len);
}

template <typename F>
void HalfApply(void* invec, void* inoutvec, int len, F f) {
  const _Float16* a = static_cast<const _Float16*>(invec);
  _Float16* b = static_cast<_Float16*>(inoutvec);
  for (int i = 0; i < len; ++i)
    b[i] = static_cast<_Float16>(f(static_cast<float>(a[i]), static_cast<float>(b[i])));
}

// NaN propagates, as in numpy's minimum/maximum.
void HalfMin(void* in, void* inout, int* len, MPI_Datatype*) {
  HalfApply(in, inout, *len, [](float a, float b) { return a != a || a < b ? a : b; });
}
void HalfMax(void* in, void* inout, int* len, MPI_Datatype*) {
  HalfApply(in, inout, *len, [](float a, float b) { return a != a || a > b ? a : b; });
}
void HalfProd(void* in, void* inout, int* len, MPI_Datatype*) {
  HalfApply(in, inout, *len, [](float a, float b) { return a * b; });
}

// 8-bit sums and products wrap, as in MXNet's own stores and numpy. Open
// MPI's op/avx component adds 8-bit integers with saturating SIMD adds
// (200 + 200 gave 255 for uint8), so these never go to its builtin ops. The
// low 8 bits of a two's-complement sum or product are the same for int8.
void ByteSum(void* in, void* inout, int* len, MPI_Datatype*) {
  const uint8_t* a = static_cast<const uint8_t*>(in);
  uint8_t* b = static_cast<uint8_t*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = static_cast<uint8_t>(a[i] + b[i]);
}
void ByteProd(void* in, void* inout, int* len, MPI_Datatype*) {
  const uint8_t* a = static_cast<const uint8_t*>(in);
  uint8_t* b = static_cast<uint8_t*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = static_cast<uint8_t>(a[i] * b[i]);
}

// MPI_MIN/MPI_MAX on floats drop a NaN or keep it depending on the operand
// order and the array's length (a NaN on one rank vanished from a max);
// these propagate it, as numpy's minimum/maximum and the float16 ops do.
template <typename T>
void NanMin(void* in, void* inout, int* len, MPI_Datatype*) {
  const T* a = static_cast<const T*>(in);
  T* b = static_cast<T*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = a[i] != a[i] || a[i] < b[i] ? a[i] : b[i];
}
template <typename T>
void NanMax(void* in, void* inout, int* len, MPI_Datatype*) {
  const T* a = static_cast<const T*>(in);
  T* b = static_cast<T*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = a[i] != a[i] || a[i] > b[i] ? a[i] : b[i];
}

// The MPI reduction of an allreduce/reduce_scatter with these flags.
MPI_Op ReduceOp(int dtype, int flags) {
  static MPI_Op half[4] = {MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL};
  static MPI_Op bytes[4] = {MPI_OP_NULL, MPI_MIN, MPI_MAX, MPI_OP_NULL};
  static MPI_Op f32[4] = {MPI_SUM, MPI_OP_NULL, MPI_OP_NULL, MPI_PROD};
  static MPI_Op f64[4] = {MPI_SUM, MPI_OP_NULL, MPI_OP_NULL, MPI_PROD};
  static std::once_flag once;
  const int which = (flags & kMin) ? 1 : (flags & kMax) ? 2 : (flags & kProduct) ? 3 : 0;
  std::call_once(once, [] {
    MPI_Op_create(&HalfSum, /*commute=*/1, &half[0]);
    MPI_Op_create(&HalfMin, 1, &half[1]);
    MPI_Op_create(&HalfMax, 1, &half[2]);
    MPI_Op_create(&HalfProd, 1, &half[3]);
    MPI_Op_create(&ByteSum, 1, &bytes[0]);
    MPI_Op_create(&ByteProd, 1, &bytes[3]);
    MPI_Op_create(&NanMin<float>, 1, &f32[1]);
    MPI_Op_create(&NanMax<float>, 1, &f32[2]);
    MPI_Op_create(&NanMin<double>, 1, &f64[1]);
    MPI_Op_create(&NanMax<double>, 1, &f64[2]);
  });
  switch (dtype) {
    case kFloat16: return half[which];
    case kFloat32: return f32[which];
    case kFloat64: return f64[which];
    case kUint8: case kInt8: return bytes[which];
    default: {
      const MPI_Op builtin[4] = {MPI_SUM, MPI_MIN, MPI_MAX, MPI_PROD};
      return builtin[which];
    }
  }
}

template <typename T>
void FillAs(void* buf, int64_t n, T v) {
  T* p = static_cast<T*>(buf);
  for (int64_t i = 0; i < n; ++i) p[i] = v;
}

template <typename T>
void FillIdentityAs(void* buf, int64_t n, int flags) {
  using L = std::numeric_limits<T>;
  const T hi = L::has_infinity ? L::infinity() : L::max();
  const T lo = L::has_infinity ? -L::infinity() : L::lowest();
  FillAs<T>(buf, n, (flags & kMin) ? hi : (flags & kMax) ? lo : T(1));
}

// What a rank that has joined contributes: the identity of the reduction
// (0 for sums, +inf/-inf or the dtype's extremes for min/max, 1 for products).
void FillIdentity(void* buf, int64_t n, int dtype, int flags) {
  if (!(flags & kNotSum)) {
    std::memset(buf, 0, static_cast<size_t>(n) * DTypeSize(dtype));
    return;
  }
  switch (dtype) {
    case kFloat32: FillIdentityAs<float>(buf, n, flags); break;
    case kFloat64: FillIdentityAs<double>(buf, n, flags); break;
    case kFloat16: {
      const float v = (flags & kMin) ? std::numeric_limits<float>::infinity()
                    : (flags & kMax) ? -std::numeric_limits<float>::infinity() : 1.0f;
      FillAs<_Float16>(buf, n, static_cast<_Float16>(v));
      break;
    }
    case kUint8: FillIdentityAs<uint8_t>(buf, n, flags); break;
    case kInt32: FillIdentityAs<int32_t>(buf, n, flags); break;
    case kInt8: FillIdentityAs<int8_t>(buf, n, flags); break;
    case kInt64: FillIdentityAs<int64_t>(buf, n, flags); break;
    default: break;
  }
}

template <typename T>
void DivideAs(void* buf, int64_t n, int by) {
  T* p = static_cast<T*>(buf);
  for (int64_t i = 0; i < n; ++i) p[i] = static_cast<T>(p[i] / static_cast<T>(by));
}

// The mean of a sum over `by` ranks, as numpy's `sum / by` (float dtypes).
void Divide(void* buf, int64_t n, int dtype, int by) {
  if (by <= 1) return;
  switch (dtype) {
    case kFloat32: DivideAs<float>(buf, n, by); break;
    case kFloat64: DivideAs<double>(buf, n, by); break;
    case kFloat16: {
      _Float16* p = static_cast<_Float16*>(buf);
      for (int64_t i = 0; i < n; ++i) p[i] = static_cast<_Float16>(static_cast<float>(p[i]) / by);
      break;
    }
    default: break;  // refused at push time
  }
}

int64_t ChunkElems(int64_t chunk_bytes, int esize) {
  const int64_t by_bytes = std::max<int64_t>(1, chunk_bytes / esize);
  return std::min<int64_t>(by_bytes, INT_MAX / 8);
}

// Blocks of n elements over p ranks: the first n % p ranks get one more.
void Blocks(int64_t n, int p, std::vector<int>* counts, std::vector<int>* displs) {
  counts->assign(p, 0);
  displs->assign(p, 0);
  int64_t at = 0;
  for (int r = 0; r < p; ++r) {
    (*counts)[r] = static_cast<int>(n / p + (r < n % p ? 1 : 0));
    (*displs)[r] = static_cast<int>(at);
    at += (*counts)[r];
  }
}

// Posts one message from and one to every other rank, appending the requests
// to *reqs: receives first, sends staggered so that not every rank sends to
// rank 0 first. recv(r) / send(r) give rank r's {buffer, count}.
template <typename Recv, typename Send>
int PostExchange(MPI_Comm comm, MPI_Datatype type, int tag, Recv recv, Send send,
                 std::vector<MPI_Request>* reqs) {
  int p = 1, me = 0;
  MPI_Comm_size(comm, &p);
  MPI_Comm_rank(comm, &me);
  int rc = MPI_SUCCESS;
  for (int r = 0; r < p && rc == MPI_SUCCESS; ++r) {
    if (r == me) continue;
    const auto [buf, count] = recv(r);
    reqs->emplace_back();
    rc = MPI_Irecv(buf, count, type, r, tag, comm, &reqs->back());
  }
  for (int k = 1; k < p && rc == MPI_SUCCESS; ++k) {
    const int r = (me + k) % p;
    const auto [buf, count] = send(r);
    reqs->emplace_back();
    rc = MPI_Isend(buf, count, type, r, tag, comm, &reqs->back());
  }
  return rc;
}

// One exchange (PostExchange), then a wait that sleeps (WaitAllSleeping).
template <typename Recv, typename Send>
int ExchangeSleeping(MPI_Comm comm, MPI_Datatype type, int tag, Recv recv, Send send) {
  std::vector<MPI_Request> reqs;
  int rc = PostExchange(comm, type, tag, recv, send, &reqs);
  if (rc == MPI_SUCCESS) rc = WaitAllSleeping(static_cast<int>(reqs.size()), reqs.data());
  return rc;
}

// Allreduce of n elements in place over point-to-point messages: each rank
// owns one block; every rank sends each block to its owner (a reduce-scatter),
// the owner reduces its block in rank order 0, 1, ..., p-1 and sends the
// result to every rank (an allgather). The bytes each rank sends and receives
// are a ring's, 2(p-1)/p x n. Every element is reduced once, in the same order
// whatever the buffer's size or layout (fusion groups arrays by timing), and
// copied to the others, so all ranks, and all runs, hold the same bits. The
// waits sleep (WaitAllSleeping): Open MPI's blocking collectives poll, which
// takes the core that backprop needs.
std::string P2pAllreduce(MPI_Comm comm, void* buf, int64_t n, int dtype, int flags,
                         Scratch* s, const std::string& name) {
  int p = 1, me = 0;
  MPI_Comm_size(comm, &p);
  MPI_Comm_rank(comm, &me);
  const int esize = DTypeSize(dtype);
  const MPI_Datatype type = MpiType(dtype);
  const MPI_Op op = ReduceOp(dtype, flags);
  std::vector<int> counts, displs;
  Blocks(n, p, &counts, &displs);
  char* base = static_cast<char*>(buf);
  auto at = [&](int b) { return base + static_cast<int64_t>(displs[b]) * esize; };
  const size_t mine = static_cast<size_t>(counts[me]) * esize;
  // every rank's copy of my block, by rank
  char* parts = s->Get(&s->b, mine * p + 1);
  // Each block in S pieces (S from n and p alone, so the same on every rank):
  // piece k's reduce-scatter messages are all posted at once, and piece k is
  // folded and its allgather posted as soon as piece k has arrived, while the
  // later pieces are still on the wire. Pieces of at least 128 KiB, at most
  // 16: with one piece per block a phase's tail (the last message still
  // arriving) leaves the link idle: at 4 hosts and 1.7 Gbit/s, the funneled
  // store's allreduce of resnet18_v1's gradients (in 4 MiB units) took 1.85x
  // the wire time with 1 MiB pieces, 1.40x with 128 KiB ones.
  const int64_t block_bytes = n / p * esize;
  const int S = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(
      16, block_bytes / (128 << 10))));
  auto lo = [&](int b, int k) { return static_cast<int64_t>(counts[b]) * k / S; };
  auto cnt = [&](int b, int k) { return static_cast<int>(lo(b, k + 1) - lo(b, k)); };
  std::vector<std::vector<MPI_Request>> rs(S);
  std::vector<MPI_Request> ag;
  int rc = MPI_SUCCESS;
  for (int k = 0; k < S && rc == MPI_SUCCESS; ++k) {
    rc = PostExchange(
        comm, type, 0,
        [&](int r) { return std::make_pair(parts + r * mine + lo(me, k) * esize, cnt(me, k)); },
        [&](int r) { return std::make_pair(at(r) + lo(r, k) * esize, cnt(r, k)); }, &rs[k]);
  }
  if (rc != MPI_SUCCESS) return MpiError("point-to-point allreduce (reduce-scatter)", rc, name);
  // acc = x_0, then acc = x_r (op) acc for r = 1..p-1. Rank 0 folds into its
  // own block, which holds x_0; any other rank folds into parts[0] (x_0, as
  // received), reading its own x_me where it is, and copies the result once:
  // one pass over the block at most, on the thread that also feeds the sockets.
  char* acc = me == 0 ? at(me) : parts;
  for (int k = 0; k < S; ++k) {
    rc = WaitAllSleeping(static_cast<int>(rs[k].size()), rs[k].data());
    if (rc != MPI_SUCCESS) return MpiError("point-to-point allreduce (reduce-scatter)", rc, name);
    const int64_t off = lo(me, k) * esize;
    for (int r = 1; r < p; ++r) {
      const char* x = (r == me ? at(me) : parts + r * mine) + off;
      rc = MPI_Reduce_local(x, acc + off, cnt(me, k), type, op);
      if (rc != MPI_SUCCESS) return MpiError("MPI_Reduce_local", rc, name);
    }
    if (me != 0) std::memcpy(at(me) + off, acc + off, static_cast<size_t>(cnt(me, k)) * esize);
    // piece k of every block out and in; my sends of piece k have completed,
    // so its receives may overwrite those buffers
    rc = PostExchange(
        comm, type, 1,
        [&](int r) { return std::make_pair(at(r) + lo(r, k) * esize, cnt(r, k)); },
        [&](int) { return std::make_pair(at(me) + off, cnt(me, k)); }, &ag);
    if (rc != MPI_SUCCESS) return MpiError("point-to-point allreduce (allgather)", rc, name);
  }
  rc = WaitAllSleeping(static_cast<int>(ag.size()), ag.data());
  if (rc != MPI_SUCCESS) return MpiError("point-to-point allreduce (allgather)", rc, name);
  return "";
}

// Whether an allreduce of n elements takes the point-to-point route (sleeping
// waits) rather than MPI's collectives: per chunk, and for a whole
// fp16-compressed allreduce.
bool UseP2p(const Transfer& t, MPI_Comm comm, int64_t n, int esize) {
  int p = 1;
  MPI_Comm_size(comm, &p);
  return t.p2p_bytes > 0 && p > 1 && n * esize >= t.p2p_bytes && n >= p;
}

// Fewer elements than ranks, where the point-to-point route would take them:
// every rank's copy gathered and folded in rank order, as that route's block
// owners fold theirs, so an array gets the same bits whether it moves alone or
// fused with others into a chunk large enough for the route.
std::string GatherFold(MPI_Comm comm, const void* in, void* out, int n, int dtype, int flags,
                       const std::string& name) {
  int p = 1;
  MPI_Comm_size(comm, &p);
  const size_t bytes = static_cast<size_t>(n) * DTypeSize(dtype);
  std::vector<char> all(bytes * p);
  int rc = MPI_Allgather(in, n, MpiType(dtype), all.data(), n, MpiType(dtype), comm);
  if (rc != MPI_SUCCESS) return MpiError("MPI_Allgather", rc, name);
  std::memcpy(out, all.data(), bytes);
  for (int r = 1; r < p; ++r) {
    rc = MPI_Reduce_local(all.data() + r * bytes, out, n, MpiType(dtype), ReduceOp(dtype, flags));
    if (rc != MPI_SUCCESS) return MpiError("MPI_Reduce_local", rc, name);
  }
  return "";
}

// Sum (or min/max/product, by `flags`) of n elements over the communicator,
// chunked; in == out means in place.
std::string ReduceChunked(MPI_Comm comm, const void* in, void* out, int64_t n, int dtype,
                          int flags, const Transfer& t, Scratch* s, const std::string& name) {
  const int esize = DTypeSize(dtype);
  const int64_t step = ChunkElems(t.chunk_bytes, esize);
  for (int64_t off = 0; off < n; off += step) {
    const int len = static_cast<int>(std::min(step, n - off));
    char* o = static_cast<char*>(out) + off * esize;
    if (UseP2p(t, comm, len, esize)) {
      if (in != out) std::memcpy(o, static_cast<const char*>(in) + off * esize,
                                 static_cast<size_t>(len) * esize);
      const std::string err = P2pAllreduce(comm, o, len, dtype, flags, s, name);
      if (!err.empty()) return err;
      continue;
    }
    const void* src = in == out ? o : static_cast<const char*>(in) + off * esize;
    if (t.p2p_bytes > 0 && static_cast<int64_t>(len) * esize >= t.p2p_bytes) {
      const std::string err = GatherFold(comm, src, o, len, dtype, flags, name);
      if (!err.empty()) return err;
      continue;
    }
    const void* i = in == out ? MPI_IN_PLACE : src;
    const int rc = MPI_Allreduce(i, o, len, MpiType(dtype), ReduceOp(dtype, flags), comm);
    if (rc != MPI_SUCCESS) return MpiError("MPI_Allreduce", rc, name);
  }
  return "";
}

// fp16 on the wire, fp32 accumulation: each rank receives every rank's copy of
// its block (alltoall), sums them in float32 in rank order, rounds once, and
// the rounded blocks are gathered everywhere. Bytes on the wire are those of
// a reduce-scatter + allgather of float16: half of float32's. With `p2p` (the
// allreduce would take P2pAllreduce: across hosts by default) the two
// exchanges are point-to-point messages with waits that sleep, not
// MPI_Alltoallv / MPI_Allgatherv, whose blocking waits poll: the same bytes,
// the same result.
std::string CompressedSum(MPI_Comm comm, const void* in, void* out, int64_t n, int dtype,
                          int divide_by, bool p2p, Scratch* s, const std::string& name) {
  int p = 1;
  MPI_Comm_size(comm, &p);
  const int64_t window = std::max<int64_t>(p, (INT_MAX / 4 / p) * p);
  const int esize = DTypeSize(dtype);
  for (int64_t off = 0; off < n; off += window) {
    const int64_t len = std::min(window, n - off);
    std::vector<int> counts, displs;
    Blocks(len, p, &counts, &displs);
    int me = 0;
    MPI_Comm_rank(comm, &me);
    const int mine = counts[me];
    auto* send = reinterpret_cast<_Float16*>(s->Get(&s->a, len * 2));
    auto* recv = reinterpret_cast<_Float16*>(s->Get(&s->b, static_cast<size_t>(mine) * p * 2));
    auto* block = reinterpret_cast<_Float16*>(s->Get(&s->c, static_cast<size_t>(mine) * 2 + 2));
    const char* src = static_cast<const char*>(in) + off * esize;
    if (in == nullptr) {
      std::memset(send, 0, len * 2);
    } else if (dtype == kFloat32) {
      FloatToHalf(reinterpret_cast<const float*>(src), send, len);
    } else {
      DoubleToHalf(reinterpret_cast<const double*>(src), send, len);
    }
    int rc;
    if (p2p) {   // every rank's copy of my block in, my copy of block r out to rank r
      std::memcpy(recv + static_cast<int64_t>(me) * mine, send + displs[me], mine * 2);
      rc = ExchangeSleeping(
          comm, MPI_UINT16_T, 2,
          [&](int r) { return std::make_pair(recv + static_cast<int64_t>(r) * mine, mine); },
          [&](int r) { return std::make_pair(send + displs[r], counts[r]); });
    } else {
      std::vector<int> rcounts(p, mine), rdispls(p);
      for (int r = 0; r < p; ++r) rdispls[r] = r * mine;
      rc = MPI_Alltoallv(send, counts.data(), displs.data(), MPI_UINT16_T, recv, rcounts.data(),
                         rdispls.data(), MPI_UINT16_T, comm);
    }
    if (rc != MPI_SUCCESS) return MpiError("MPI_Alltoallv (fp16 compression)", rc, name);
    SumHalfBlocks(recv, p, mine, divide_by, block);
    if (p2p) {   // my summed block out to every rank, block r in from rank r
      std::memcpy(send + displs[me], block, mine * 2);
      rc = ExchangeSleeping(
          comm, MPI_UINT16_T, 3, [&](int r) { return std::make_pair(send + displs[r], counts[r]); },
          [&](int) { return std::make_pair(block, mine); });
    } else {
      rc = MPI_Allgatherv(block, mine, MPI_UINT16_T, send, counts.data(), displs.data(),
                          MPI_UINT16_T, comm);
    }
    if (rc != MPI_SUCCESS) return MpiError("MPI_Allgatherv (fp16 compression)", rc, name);
    if (out == nullptr) continue;
    char* dst = static_cast<char*>(out) + off * esize;
    if (dtype == kFloat32) {
      HalfToFloat(send, reinterpret_cast<float*>(dst), len);
    } else {
      HalfToDouble(send, reinterpret_cast<double*>(dst), len);
    }
  }
  return "";
}

std::string Name(const Unit& u) {
  if (u.members.empty()) return std::string(OpName(u.op)) + " (stand-in of a joined rank)";
  if (u.members.size() == 1) return u.members[0]->desc;
  return "fused(" + std::to_string(u.members.size()) + ") " + u.members[0]->desc + " ...";
}

// Members' inputs one after another (the reduction's identity when standing
// in for a joined rank).
void Pack(const Unit& u, char* buf, int esize) {
  if (u.joined) {
    FillIdentity(buf, u.total, u.dtype, u.flags);
    return;
  }
  for (const Request* r : u.members) {
    for (const Part& part : r->parts) {
      std::memcpy(buf, part.in, part.count * esize);
      buf += part.count * esize;
    }
  }
}

void Unpack(Unit* u, const char* buf, int esize) {
  for (Request* r : u->members) {
    for (Part& part : r->parts) {
      std::memcpy(part.out, buf, part.count * esize);
      buf += part.count * esize;
    }
  }
}

// ---------------------------------------------------------------- per kind
std::string RunAllreduce(MPI_Comm comm, Unit* u, Scratch* s, const Transfer& t) {
  const int esize = DTypeSize(u->dtype);
  const std::string name = Name(*u);
  const bool average = (u->flags & kAverage) != 0;
  const bool compress = (u->flags & kCompressFp16) != 0 &&
                        (u->dtype == kFloat32 || u->dtype == kFloat64);
  if (u->to >= 0) {
    // One piece of a pre-emptible allreduce (one array, no compression): the
    // stand-in of a joined rank contributes the identity for the piece alone.
    const int64_t len = u->to - u->from;
    if (u->joined) {
      char* buf = s->Get(&s->a, static_cast<size_t>(len) * esize);
      FillIdentity(buf, len, u->dtype, u->flags);
      return ReduceChunked(comm, buf, buf, len, u->dtype, u->flags, t, s, name);
    }
    Part& part = u->members[0]->parts[0];
    const char* in = static_cast<const char*>(part.in) + u->from * esize;
    char* out = static_cast<char*>(part.out) + u->from * esize;
    std::string err = ReduceChunked(comm, part.in == part.out ? out : in, out, len, u->dtype,
                                    u->flags, t, s, name);
    if (err.empty() && average) Divide(out, len, u->dtype, u->active);
    return err;
  }
  if (u->members.size() == 1 && u->members[0]->parts.size() == 1 && !u->joined) {
    Part& part = u->members[0]->parts[0];
    if (compress) {
      return CompressedSum(comm, part.in, part.out, part.count, u->dtype,
                           average ? u->active : 1, UseP2p(t, comm, part.count, esize), s, name);
    }
    std::string err = ReduceChunked(comm, part.in, part.out, part.count, u->dtype, u->flags,
                                    t, s, name);
    if (err.empty() && average) Divide(part.out, part.count, u->dtype, u->active);
    return err;
  }
  // Several arrays (or none, standing in): one buffer, one collective.
  if (compress) {
    // Packed into `d`: CompressedSum works in a, b and c.
    char* packed = s->Get(&s->d, static_cast<size_t>(u->total) * esize);
    Pack(*u, packed, esize);
    std::string err = CompressedSum(comm, packed, packed, u->total, u->dtype,
                                    average ? u->active : 1, UseP2p(t, comm, u->total, esize), s,
                                    name);
    if (err.empty() && !u->joined) Unpack(u, packed, esize);
    return err;
  }
  char* buf = s->Get(&s->a, static_cast<size_t>(u->total) * esize);
  Pack(*u, buf, esize);
  std::string err = ReduceChunked(comm, buf, buf, u->total, u->dtype, u->flags, t, s, name);
  if (!err.empty() || u->joined) return err;
  if (average) Divide(buf, u->total, u->dtype, u->active);
  Unpack(u, buf, esize);
  return "";
}

std::string RunBroadcast(MPI_Comm comm, Unit* u, Scratch* s, int64_t chunk_bytes) {
  const int esize = DTypeSize(u->dtype);
  const std::string name = Name(*u);
  void* buf = nullptr;
  if (u->joined) {
    buf = s->Get(&s->a, static_cast<size_t>(u->total) * esize);
  } else {
    Part& part = u->members[0]->parts[0];
    int me = 0;
    MPI_Comm_rank(comm, &me);
    if (me == u->root && part.in != part.out) std::memcpy(part.out, part.in, part.count * esize);
    buf = part.out;
  }
  const int64_t step = ChunkElems(chunk_bytes, esize);
  for (int64_t off = 0; off < u->total; off += step) {
    const int len = static_cast<int>(std::min(step, u->total - off));
    const int rc = MPI_Bcast(static_cast<char*>(buf) + off * esize, len, MpiType(u->dtype),
                             u->root, comm);
    if (rc != MPI_SUCCESS) return MpiError("MPI_Bcast", rc, name);
  }
  return "";
}

// A datatype of one first-dimension row, so counts stay within int.
struct RowType {
  MPI_Datatype t = MPI_DATATYPE_NULL;
  RowType(int64_t row, int dtype) {
    MPI_Type_contiguous(static_cast<int>(row), MpiType(dtype), &t);
    MPI_Type_commit(&t);
  }
  ~RowType() { MPI_Type_free(&t); }
};

std::string ToInts(const std::vector<int64_t>& v, std::vector<int>* out, std::vector<int>* displs,
                   const std::string& name) {
  out->resize(v.size());
  displs->resize(v.size());
  int64_t at = 0;
  for (size_t i = 0; i < v.size(); ++i) {
    if (v[i] < 0 || v[i] > INT_MAX || at > INT_MAX)
      return "mxnet_mpi: '" + name + "' moves more than 2^31 rows";
    (*out)[i] = static_cast<int>(v[i]);
    (*displs)[i] = static_cast<int>(at);
    at += v[i];
  }
  return "";
}

std::string RunAllgather(MPI_Comm comm, Unit* u, Scratch* s) {
  const std::string name = Name(*u);
  if (u->row > INT_MAX) return "mxnet_mpi: rows of '" + name + "' are too large";
  int p = 1;
  MPI_Comm_size(comm, &p);
  Part* part = u->joined ? nullptr : &u->members[0]->parts[0];
  const int64_t my_rows = part ? part->count / u->row : 0;
  std::vector<int64_t> rows(p);
  int rc = MPI_Allgather(&my_rows, 1, MPI_INT64_T, rows.data(), 1, MPI_INT64_T, comm);
  if (rc != MPI_SUCCESS) return MpiError("MPI_Allgather (sizes)", rc, name);
  int64_t total_rows = 0;
  for (int64_t r : rows) total_rows += r;
  std::vector<int> counts, displs;
  std::string err = ToInts(rows, &counts, &displs, name);
  if (!err.empty()) return err;
  const size_t bytes = static_cast<size_t>(total_rows * u->row) * DTypeSize(u->dtype);
  if (part && part->out_count != total_rows * u->row)
    return "MPIKVStoreError: mxnet_mpi: the output of '" + name + "' has " +
           std::to_string(part->out_count / u->row) + " rows, but the ranks send " +
           std::to_string(total_rows) + " (the sizes given do not match the ranks' arrays)";
  void* out = part ? part->out : s->Get(&s->a, bytes + 1);
  RowType rt(u->row, u->dtype);
  rc = MPI_Allgatherv(part ? part->in : out, static_cast<int>(my_rows), rt.t, out,
                      counts.data(), displs.data(), rt.t, comm);
  return rc == MPI_SUCCESS ? "" : MpiError("MPI_Allgatherv", rc, name);
}

std::string RunAlltoall(MPI_Comm comm, Unit* u, Scratch* s) {
  const std::string name = Name(*u);
  if (u->row > INT_MAX) return "mxnet_mpi: rows of '" + name + "' are too large";
  int p = 1;
  MPI_Comm_size(comm, &p);
  Request* r = u->joined ? nullptr : u->members[0];
  std::vector<int64_t> send_rows = r ? r->splits : std::vector<int64_t>(p, 0);
  std::vector<int64_t> recv_rows(p);
  int rc = MPI_Alltoall(send_rows.data(), 1, MPI_INT64_T, recv_rows.data(), 1, MPI_INT64_T, comm);
  if (rc != MPI_SUCCESS) return MpiError("MPI_Alltoall (splits)", rc, name);
  std::vector<int> scounts, sdispls, rcounts, rdispls;
  std::string err = ToInts(send_rows, &scounts, &sdispls, name);
  if (err.empty()) err = ToInts(recv_rows, &rcounts, &rdispls, name);
  if (!err.empty()) return err;
  int64_t total_rows = 0;
  for (int64_t x : recv_rows) total_rows += x;
  const size_t bytes = static_cast<size_t>(total_rows * u->row) * DTypeSize(u->dtype);
  if (r && r->parts[0].out_count != total_rows * u->row)
    return "MPIKVStoreError: mxnet_mpi: the output of '" + name + "' has " +
           std::to_string(r->parts[0].out_count / u->row) + " rows, but the ranks send " +
           std::to_string(total_rows) + " (the splits given do not match the ranks' arrays)";
  void* out = r ? r->parts[0].out : s->Get(&s->a, bytes + 1);
  RowType rt(u->row, u->dtype);
  rc = MPI_Alltoallv(r ? r->parts[0].in : out, scounts.data(), sdispls.data(), rt.t, out,
                     rcounts.data(), rdispls.data(), rt.t, comm);
  if (rc != MPI_SUCCESS) return MpiError("MPI_Alltoallv", rc, name);
  if (r && r->parts.size() > 1 && r->parts[1].out) {  // received splits, as int32
    int32_t* rs = static_cast<int32_t*>(r->parts[1].out);
    for (int i = 0; i < p; ++i) rs[i] = static_cast<int32_t>(recv_rows[i]);
  }
  return "";
}

std::string RunReduceScatter(MPI_Comm comm, Unit* u, Scratch* s) {
  const std::string name = Name(*u);
  int p = 1, me = 0;
  MPI_Comm_size(comm, &p);
  MPI_Comm_rank(comm, &me);
  const int64_t rows = u->total / u->row;
  std::vector<int64_t> per(p);
  for (int r = 0; r < p; ++r) per[r] = (rows / p + (r < rows % p ? 1 : 0)) * u->row;
  std::vector<int> counts, displs;
  std::string err = ToInts(per, &counts, &displs, name);
  if (!err.empty()) return err;
  const int esize = DTypeSize(u->dtype);
  const void* in = nullptr;
  void* out = nullptr;
  if (u->joined) {
    char* zeros = s->Get(&s->a, static_cast<size_t>(u->total) * esize + 1);
    FillIdentity(zeros, u->total, u->dtype, u->flags);
    in = zeros;
    out = s->Get(&s->b, static_cast<size_t>(per[me]) * esize + 1);
  } else {
    in = u->members[0]->parts[0].in;
    out = u->members[0]->parts[0].out;
  }
  const int rc = MPI_Reduce_scatter(in, out, counts.data(), MpiType(u->dtype),
                                    ReduceOp(u->dtype, u->flags), comm);
  if (rc != MPI_SUCCESS) return MpiError("MPI_Reduce_scatter", rc, name);
  if (!u->joined && (u->flags & kAverage)) Divide(out, per[me], u->dtype, u->active);
  return "";
}

}  // namespace

void PreciseSleeps() {
  thread_local bool done = false;
  if (done) return;
  done = true;
  prctl(PR_SET_TIMERSLACK, 1000UL);   // ns; a refusal leaves the default
}

int WaitAllSleeping(int n, MPI_Request* reqs) {
  PreciseSleeps();
  const auto start = std::chrono::steady_clock::now();
  auto nap = std::chrono::microseconds(10);
  for (;;) {
    int done = 0;
    const int rc = MPI_Testall(n, reqs, &done, MPI_STATUSES_IGNORE);
    if (rc != MPI_SUCCESS || done) return rc;
    // a few microseconds of polling catch peers that are already there
    if (std::chrono::steady_clock::now() - start < std::chrono::microseconds(20)) continue;
    std::this_thread::sleep_for(nap);
    nap = std::min(nap * 2, std::chrono::microseconds(200));
  }
}

std::string RunUnit(MPI_Comm comm, Unit* u, Scratch* s, const Transfer& t) {
  if (u->total == 0 && u->op != OpKind::kAllgather && u->op != OpKind::kAlltoall) return "";
  switch (u->op) {
    case OpKind::kAllreduce: return RunAllreduce(comm, u, s, t);
    case OpKind::kBroadcast: return RunBroadcast(comm, u, s, t.chunk_bytes);
    case OpKind::kAllgather: return RunAllgather(comm, u, s);
    case OpKind::kAlltoall: return RunAlltoall(comm, u, s);
    case OpKind::kReduceScatter: return RunReduceScatter(comm, u, s);
  }
  return "mxnet_mpi: unknown collective";
}

}  // namespace mxnet_mpi
