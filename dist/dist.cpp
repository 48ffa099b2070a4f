// dist's processes, collectives and communication thread (Note [the communication thread], dist/dist.h).
#include "dist/dist.h"

#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <exception>
#include <mutex>
#include <string>
#include <thread>

#include "autograd/graph.h"
#include "core/device.h"
#include "core/device_collectives.h"
#include "core/error.h"

#if FRUGAL_HAVE_MPI
// The C API only: without these, OpenMPI's and MPICH's headers also pull in the removed C++ bindings.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#endif

namespace frugal::dist {

struct Work::State {
  std::mutex mutex;
  std::condition_variable cv;
  bool done = false;
  std::exception_ptr error;
  std::string what;  // the collective, for the timeout's message
  Tensor keep;       // the tensor an asynchronous collective works on, alive until it is done
};

namespace {

using Task = std::function<void()>;

struct World {
  std::mutex mutex;  // guards tasks and stop
  std::condition_variable cv;
  std::deque<std::pair<Task, std::shared_ptr<Work::State>>> tasks;
  bool stop = false;
  std::thread thread;

  bool initialized = false;
  bool finalized = false;
  bool mpi = false;  // MPI is running (a launched world)
  int rank = 0;
  int size = 1;
  double timeout_s = 300;
  // CUDA tensors' collectives (core/device_collectives.h): the table the backend registered, once looked
  // up, and whether this rank has joined its communicator.
  const DeviceCollectives* cuda = nullptr;
  bool cuda_joined = false;

  // Stops the communication thread (nothing queued is lost: it empties the queue first).
  void stop_thread() {
    if (!thread.joinable()) return;
    {
      std::lock_guard<std::mutex> lock(mutex);
      stop = true;
    }
    cv.notify_one();
    thread.join();
  }
  // A process that never called finalize(): its thread must not outlive it (a joinable std::thread at exit
  // ends the process with std::terminate). MPI then reports a rank that ended without finalizing.
  ~World() { stop_thread(); }
};

World& world() {
  static World w;
  return w;
}

// The launchers' environment: OpenMPI's mpirun, MPICH's hydra, PMIx.
bool launched() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"})
    if (std::getenv(name)) return true;
  return false;
}

double timeout_from_env() {
  const char* v = std::getenv("FRUGAL_DIST_TIMEOUT");
  if (!v || !*v) return 300;
  char* end = nullptr;
  const double s = std::strtod(v, &end);
  FRUGAL_CHECK(end && *end == '\0' && s > 0,
               "dist: FRUGAL_DIST_TIMEOUT must be a positive number of seconds, got '", v, "'");
  return s;
}

[[noreturn]] void stop_everything(int code, const std::string& message) {
  std::fflush(stdout);
  std::fprintf(stderr, "frugal: dist: rank %d of %d: %s\n", world().rank, world().size, message.c_str());
  std::fflush(stderr);
  // Without finalize: the launcher sees a rank end with a non-zero status and stops every other rank.
  std::_Exit(code);
}

void wait_state(Work::State& st) {
  std::unique_lock<std::mutex> lock(st.mutex);
  const auto limit = std::chrono::duration<double>(world().timeout_s);
  if (!st.cv.wait_for(lock, limit, [&] { return st.done; }))
    stop_everything(1, frugal::detail::str_cat("waited ", world().timeout_s, " s for ", st.what,
                                               " to finish; another rank is gone or stuck (the limit is "
                                               "FRUGAL_DIST_TIMEOUT seconds); stopping every rank"));
  if (st.error) std::rethrow_exception(st.error);
}

// Hands fn to the communication thread (Note [the communication thread]).
std::shared_ptr<Work::State> submit(Task fn, std::string what, Tensor keep = {}) {
  World& w = world();
  auto st = std::make_shared<Work::State>();
  st->what = std::move(what);
  st->keep = std::move(keep);
  {
    std::lock_guard<std::mutex> lock(w.mutex);
    w.tasks.emplace_back(std::move(fn), st);
  }
  w.cv.notify_one();
  return st;
}

void run(Task fn, std::string what) { wait_state(*submit(std::move(fn), std::move(what))); }

void comm_loop() {
  World& w = world();
  for (;;) {
    std::pair<Task, std::shared_ptr<Work::State>> job;
    {
      std::unique_lock<std::mutex> lock(w.mutex);
      w.cv.wait(lock, [&] { return w.stop || !w.tasks.empty(); });
      if (w.tasks.empty()) return;  // stop, and nothing left
      job = std::move(w.tasks.front());
      w.tasks.pop_front();
    }
    std::exception_ptr error;
    try {
      job.first();
    } catch (...) {
      error = std::current_exception();
    }
    Work::State& st = *job.second;
    {
      std::lock_guard<std::mutex> lock(st.mutex);
      st.done = true;
      st.error = error;
      st.keep = Tensor();
    }
    st.cv.notify_all();
  }
}

void check_ready(const char* op) {
  FRUGAL_CHECK(world().initialized && !world().finalized, "dist::", op,
               ": call dist::init() (or make a dist::Guard) first",
               world().finalized ? "; dist::finalize() has run" : "");
}

void check_tensor(const Tensor& t, const char* op) {
  FRUGAL_CHECK(t.defined(), "dist::", op, ": the tensor is undefined");
  FRUGAL_CHECK_T(DeviceError, t.device().is_cpu() || t.device().is_cuda(), "dist::", op,
                 ": the tensor is on ", t.device(),
                 "; collectives take CPU tensors (MPI) and CUDA tensors (NCCL)");
  FRUGAL_CHECK(t.is_contiguous(), "dist::", op, ": the tensor (shape ", t.shape(),
               ") is not contiguous; pass t.contiguous()");
}

void check_cpu(const Tensor& t, const char* op) {
  FRUGAL_CHECK_T(DeviceError, t.device().is_cpu(), "dist::", op, ": the tensor is on ", t.device(),
                 "; this collective takes CPU tensors only");
}

void check_float(const Tensor& t, const char* op) {
  const DType d = t.dtype();
  FRUGAL_CHECK_DTYPE(d == DType::F32 || d == DType::F64 || d == DType::F16 || d == DType::BF16, "dist::", op,
                     ": reduces f32, f64, f16 and bf16 tensors, got ", dtype_name(d));
}

// A signature of what this rank is about to do: equal on every rank, or the ranks disagree.
int64_t signature(const char* op, const Tensor& t, int64_t extra) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](uint64_t v) { h = (h ^ v) * 1099511628211ull; };
  for (const char* c = op; *c; ++c) mix(uint64_t(*c));
  mix(uint64_t(t.dtype()));
  mix(uint64_t(t.dim()));
  for (int64_t s : t.shape()) mix(uint64_t(s));
  mix(uint64_t(extra));
  return int64_t(h >> 1);
}

#if FRUGAL_HAVE_MPI
void mpi_check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  throw Error(frugal::detail::str_cat("dist: ", what, " failed: ", std::string(text, size_t(len))));
}

MPI_Datatype mpi_type(DType d) {
  switch (d) {
    case DType::F32:
      return MPI_FLOAT;
    case DType::F64:
      return MPI_DOUBLE;
    default:
      throw DTypeError(frugal::detail::str_cat("dist: no MPI type for ", dtype_name(d)));
  }
}

MPI_Op mpi_op(ReduceOp op) { return op == ReduceOp::Max ? MPI_MAX : MPI_SUM; }

int as_count(int64_t n, const char* op) {
  FRUGAL_CHECK(n <= INT_MAX, "dist::", op, ": ", n, " elements is more than one MPI call takes (", INT_MAX,
               "); split the tensor");
  return int(n);
}

// On the communication thread: every rank's signature equal, or an Error on every rank.
void agree(int64_t sig, const char* op, const Shape& shape) {
  int64_t mine[2] = {sig, -sig};
  int64_t lo[2];
  mpi_check(MPI_Allreduce(mine, lo, 2, MPI_INT64_T, MPI_MIN, MPI_COMM_WORLD), "MPI_Allreduce");
  FRUGAL_CHECK(lo[0] == -lo[1], "dist::", op,
               ": the ranks passed tensors of different shapes or dtypes (this rank's shape ", shape,
               "), or called different collectives; every rank must make the same calls in the same order");
}

// agree() alone, before a collective that does not run on the communication thread (NCCL's).
void agree_first(int64_t sig, const char* op, const Shape& shape) {
  run([&] { agree(sig, op, shape); }, op);
}
#endif

// The CUDA collectives for t (a CUDA tensor, in a world of more than one), with this rank in their
// communicator: joined on the first call (every rank makes the same calls, so they join together).
const DeviceCollectives& cuda_for(const Tensor& t, const char* op) {
  World& w = world();
  // Loading the backend registers its table (kernels/cuda/nccl.cu).
  const bool loaded = load_backend(DeviceType::CUDA);
  w.cuda = device_collectives(DeviceType::CUDA);
  FRUGAL_CHECK_T(DeviceError, w.cuda != nullptr, "dist::", op, ": CUDA tensors need NCCL, ",
                 loaded ? "which this build's CUDA backend does not have (reconfigure where CMake finds the "
                          "CUDA toolkit's NCCL, with MPI)"
                        : "from the CUDA backend, which is not loaded",
                 "; or copy the tensor to the CPU");
  if (!w.cuda_joined) {
#if FRUGAL_HAVE_MPI
    // Rank 0's id, or -1 as its size when rank 0 could not make one: then every rank throws, none waits.
    std::vector<uint8_t> id;
    std::string why;
    if (w.rank == 0) {
      try {
        id = w.cuda->make_id();
      } catch (const std::exception& e) {
        why = e.what();
      }
    }
    int64_t n = why.empty() ? int64_t(id.size()) : -1;
    run([&] { mpi_check(MPI_Bcast(&n, 1, MPI_INT64_T, 0, MPI_COMM_WORLD), "MPI_Bcast"); },
        "the NCCL id's size");
    FRUGAL_CHECK_T(DeviceError, n >= 0, "dist::", op, ": rank 0 could not make a NCCL communicator",
                   why.empty() ? "" : ": ", why);
    id.resize(size_t(n));
    run([&] { mpi_check(MPI_Bcast(id.data(), int(n), MPI_BYTE, 0, MPI_COMM_WORLD), "MPI_Bcast"); },
        "the NCCL id");
    w.cuda->join(id, w.rank, w.size, t.device().index);
    w.cuda_joined = true;
#endif
  }
  return *w.cuda;
}

// The f32 (or f64) tensor a reduction works on: t itself, or a copy of an f16/bf16 t.
Tensor wide(const Tensor& t) { return t.dtype() == DType::F64 ? t : t.to(DType::F32); }

}  // namespace

void init() {
  World& w = world();
  if (w.initialized) return;
  FRUGAL_CHECK(!w.finalized, "dist::init: dist::finalize() has run; a process initialises once");
  w.timeout_s = timeout_from_env();
  if (!launched()) {  // a world of one: no MPI, collectives copy
    w.initialized = true;
    return;
  }
#if FRUGAL_HAVE_MPI
  w.stop = false;
  w.thread = std::thread(comm_loop);
  try {
    run(
        [&w] {
          int provided = 0;
          mpi_check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
          MPI_Comm_rank(MPI_COMM_WORLD, &w.rank);
          MPI_Comm_size(MPI_COMM_WORLD, &w.size);
          MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
        },
        "MPI_Init");
  } catch (...) {
    w.stop_thread();
    throw;
  }
  w.mpi = true;
  w.initialized = true;
#else
  throw Error(
      "dist::init: this process was started by an MPI launcher (mpirun), but frugal was built without MPI; "
      "install libopenmpi-dev and reconfigure (scripts/setup.sh does both)");
#endif
}

void finalize() {
  World& w = world();
  if (!w.initialized) return;
#if FRUGAL_HAVE_MPI
  if (w.cuda_joined) {
    w.cuda->leave();
    w.cuda_joined = false;
  }
  if (w.mpi) {
    run([] { mpi_check(MPI_Finalize(), "MPI_Finalize"); }, "MPI_Finalize");
    w.stop_thread();
    w.mpi = false;
  }
#endif
  w.initialized = false;
  w.finalized = true;
}

bool is_initialized() { return world().initialized; }
int rank() { return world().rank; }
int world_size() { return world().size; }
bool built_with_mpi() {
#if FRUGAL_HAVE_MPI
  return true;
#else
  return false;
#endif
}

void abort(int code, const std::string& message) { stop_everything(code, message); }

Guard::Guard() { init(); }

Guard::~Guard() {
  if (std::uncaught_exceptions() > 0 && world().size > 1)
    stop_everything(1, "an exception is leaving the dist::Guard's scope; stopping every rank");
  try {
    finalize();
  } catch (const std::exception& e) {
    stop_everything(1, e.what());
  }
}

void all_reduce(Tensor& t, ReduceOp op) {
  check_ready("all_reduce");
  check_tensor(t, "all_reduce");
  check_float(t, "all_reduce");
  check_writable(t, "dist::all_reduce");
  NoGradGuard no_grad;
  if (world().size == 1) return;
#if FRUGAL_HAVE_MPI
  Tensor buf = wide(t);
  const int64_t sig = signature("all_reduce", t, int64_t(op));
  if (t.device().is_cuda()) {
    agree_first(sig, "all_reduce", t.shape());
    cuda_for(t, "all_reduce").all_reduce(buf.raw_data(), buf.numel(), buf.dtype(), op == ReduceOp::Max);
  } else {
    const int n = as_count(buf.numel(), "all_reduce");
    run(
        [&] {
          agree(sig, "all_reduce", t.shape());
          mpi_check(MPI_Allreduce(MPI_IN_PLACE, buf.raw_data(), n, mpi_type(buf.dtype()), mpi_op(op),
                                  MPI_COMM_WORLD),
                    "MPI_Allreduce");
        },
        "all_reduce");
  }
  if (op == ReduceOp::Average) buf.div_(double(world().size));
  if (!buf.is_same(t)) t.copy_(buf);
#endif
}

void broadcast(Tensor& t, int root) {
  check_ready("broadcast");
  check_tensor(t, "broadcast");
  FRUGAL_CHECK(root >= 0 && root < world().size, "dist::broadcast: root ", root,
               " is not a rank of a world of ", world().size);
  if (world().rank != root) check_writable(t, "dist::broadcast");
  if (world().size == 1) return;
#if FRUGAL_HAVE_MPI
  const int64_t sig = signature("broadcast", t, root);
  if (t.device().is_cuda()) {
    agree_first(sig, "broadcast", t.shape());
    cuda_for(t, "broadcast").broadcast(t.raw_data(), t.nbytes(), root);
    return;
  }
  run(
      [&] {
        agree(sig, "broadcast", t.shape());
        // In pieces of at most 1 GiB: MPI counts in int.
        char* p = static_cast<char*>(t.raw_data());
        for (int64_t done = 0, total = t.nbytes(); done < total;) {
          const int64_t piece = std::min<int64_t>(total - done, int64_t(1) << 30);
          mpi_check(MPI_Bcast(p + done, int(piece), MPI_BYTE, root, MPI_COMM_WORLD), "MPI_Bcast");
          done += piece;
        }
      },
      "broadcast");
#endif
}

Tensor all_gather(const Tensor& t) {
  check_ready("all_gather");
  check_tensor(t, "all_gather");
  Shape shape = t.dim() == 0 ? Shape{1} : t.shape();
  const Tensor in = t.reshape(shape);
  shape[0] *= world().size;
  Tensor out = empty(shape, t.options());
  if (world().size == 1) {
    out.copy_(in);
    return out;
  }
#if FRUGAL_HAVE_MPI
  const int64_t sig = signature("all_gather", t, 0);
  if (t.device().is_cuda()) {
    agree_first(sig, "all_gather", t.shape());
    cuda_for(t, "all_gather").all_gather(in.raw_data(), out.raw_data(), in.nbytes());
    return out;
  }
  const int n = as_count(in.nbytes(), "all_gather");
  run(
      [&] {
        agree(sig, "all_gather", t.shape());
        mpi_check(MPI_Allgather(in.raw_data(), n, MPI_BYTE, out.raw_data(), n, MPI_BYTE, MPI_COMM_WORLD),
                  "MPI_Allgather");
      },
      "all_gather");
#endif
  return out;
}

Tensor reduce_scatter(const Tensor& t, ReduceOp op) {
  check_ready("reduce_scatter");
  check_tensor(t, "reduce_scatter");
  check_float(t, "reduce_scatter");
  const int size = world().size;
  FRUGAL_CHECK_SHAPE(t.dim() >= 1 && t.size(0) % size == 0,
                     "dist::reduce_scatter: the first dimension (shape ", t.shape(),
                     ") must be a multiple of the world size ", size);
  NoGradGuard no_grad;
  Shape shape = t.shape();
  shape[0] /= size;
  if (size == 1) return t.clone();
#if FRUGAL_HAVE_MPI
  const Tensor in = wide(t);
  Tensor out = empty(shape, in.options());
  const int64_t sig = signature("reduce_scatter", t, int64_t(op));
  if (t.device().is_cuda()) {
    agree_first(sig, "reduce_scatter", t.shape());
    cuda_for(t, "reduce_scatter")
        .reduce_scatter(in.raw_data(), out.raw_data(), out.numel(), in.dtype(), op == ReduceOp::Max);
  } else {
    const int n = as_count(out.numel(), "reduce_scatter");
    run(
        [&] {
          agree(sig, "reduce_scatter", t.shape());
          mpi_check(MPI_Reduce_scatter_block(in.raw_data(), out.raw_data(), n, mpi_type(in.dtype()),
                                             mpi_op(op), MPI_COMM_WORLD),
                    "MPI_Reduce_scatter_block");
        },
        "reduce_scatter");
  }
  if (op == ReduceOp::Average) out.div_(double(size));
  return out.to(t.dtype());
#else
  return t.clone();
#endif
}

void barrier() {
  check_ready("barrier");
  if (world().size == 1) return;
#if FRUGAL_HAVE_MPI
  run([] { mpi_check(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier"); }, "barrier");
#endif
}

namespace {
void check_counts(const Tensor& flat, const std::vector<int64_t>& counts, const char* op) {
  check_tensor(flat, op);
  FRUGAL_CHECK(int(counts.size()) == world().size, "dist::", op, ": ", counts.size(),
               " counts for a world of ", world().size);
  int64_t total = 0;
  for (int64_t c : counts) {
    FRUGAL_CHECK(c >= 0, "dist::", op, ": a negative count");
    total += c;
  }
  FRUGAL_CHECK_SHAPE(total == flat.numel(), "dist::", op, ": the counts add up to ", total,
                     ", the tensor has ", flat.numel(), " elements");
}
}  // namespace

void reduce_scatter_flat(const Tensor& flat, Tensor& part, const std::vector<int64_t>& counts, ReduceOp op) {
  check_ready("reduce_scatter_flat");
  check_counts(flat, counts, "reduce_scatter_flat");
  check_tensor(part, "reduce_scatter_flat");
  check_cpu(flat, "reduce_scatter_flat");
  check_cpu(part, "reduce_scatter_flat");
  FRUGAL_CHECK_DTYPE(
      flat.dtype() == part.dtype() && (flat.dtype() == DType::F32 || flat.dtype() == DType::F64),
      "dist::reduce_scatter_flat: f32 or f64 tensors of one dtype");
  const int r = world().rank;
  FRUGAL_CHECK_SHAPE(part.numel() == counts[size_t(r)], "dist::reduce_scatter_flat: the part has ",
                     part.numel(), " elements, this rank's count is ", counts[size_t(r)]);
  check_writable(part, "dist::reduce_scatter_flat");
  NoGradGuard no_grad;
  int64_t offset = 0;
  for (int i = 0; i < r; ++i) offset += counts[size_t(i)];
  if (world().size == 1) {
    part.copy_(flat.reshape({-1}).narrow(0, offset, part.numel()).reshape(part.shape()));
    return;
  }
#if FRUGAL_HAVE_MPI
  std::vector<int> ints;
  for (int64_t c : counts) ints.push_back(as_count(c, "reduce_scatter_flat"));
  const int64_t sig = signature("reduce_scatter_flat", flat, int64_t(op));
  run(
      [&] {
        agree(sig, "reduce_scatter_flat", flat.shape());
        mpi_check(MPI_Reduce_scatter(flat.raw_data(), part.raw_data(), ints.data(), mpi_type(flat.dtype()),
                                     mpi_op(op), MPI_COMM_WORLD),
                  "MPI_Reduce_scatter");
      },
      "reduce_scatter_flat");
  if (op == ReduceOp::Average) part.div_(double(world().size));
#endif
}

void all_gather_flat(Tensor& flat, const std::vector<int64_t>& counts) {
  check_ready("all_gather_flat");
  check_counts(flat, counts, "all_gather_flat");
  check_cpu(flat, "all_gather_flat");
  check_writable(flat, "dist::all_gather_flat");
  if (world().size == 1) return;
#if FRUGAL_HAVE_MPI
  // In elements of a type the size of flat's elements (counts in int).
  const int64_t esize = flat.element_size();
  MPI_Datatype type = esize == 8   ? MPI_INT64_T
                      : esize == 4 ? MPI_INT32_T
                      : esize == 2 ? MPI_INT16_T
                                   : MPI_BYTE;
  std::vector<int> ints, displs;
  int64_t offset = 0;
  for (int64_t c : counts) {
    ints.push_back(as_count(c, "all_gather_flat"));
    displs.push_back(as_count(offset, "all_gather_flat"));
    offset += c;
  }
  const int64_t sig = signature("all_gather_flat", flat, 0);
  run(
      [&] {
        agree(sig, "all_gather_flat", flat.shape());
        mpi_check(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, flat.raw_data(), ints.data(),
                                 displs.data(), type, MPI_COMM_WORLD),
                  "MPI_Allgatherv");
      },
      "all_gather_flat");
#endif
}

void Work::wait() {
  if (!state_) return;
  std::shared_ptr<State> st = std::move(state_);
  wait_state(*st);
}

Work all_reduce_async(Tensor t, ReduceOp op) {
  check_ready("all_reduce_async");
  check_tensor(t, "all_reduce_async");
  FRUGAL_CHECK_DTYPE(t.dtype() == DType::F32 || t.dtype() == DType::F64,
                     "dist::all_reduce_async: f32 or f64 tensors, got ", dtype_name(t.dtype()));
  check_writable(t, "dist::all_reduce_async");
  Work work;
  const int size = world().size;
  if (size == 1) {
    work.state_ = std::make_shared<Work::State>();
    work.state_->done = true;
    return work;
  }
#if FRUGAL_HAVE_MPI
  if (t.device().is_cuda()) {  // synchronous on the device's stream: no overlap with backward yet
    all_reduce(t, op);
    work.state_ = std::make_shared<Work::State>();
    work.state_->done = true;
    return work;
  }
  const int n = as_count(t.numel(), "all_reduce_async");
  void* data = t.raw_data();
  const MPI_Datatype type = mpi_type(t.dtype());
  const bool is64 = t.dtype() == DType::F64;
  const int64_t sig = signature("all_reduce", t, int64_t(op));
  const Shape shape = t.shape();
  work.state_ = submit(
      [data, n, type, op, size, is64, sig, shape] {
        agree(sig, "all_reduce_async", shape);
        mpi_check(MPI_Allreduce(MPI_IN_PLACE, data, n, type, mpi_op(op), MPI_COMM_WORLD), "MPI_Allreduce");
        if (op != ReduceOp::Average) return;
        // The mean here, on the communication thread, in plain loops: frugal's div_ would start an OpenMP
        // team of this thread's own beside the one backward is using.
        if (is64)
          for (double *p = static_cast<double*>(data), *e = p + n; p < e; ++p) *p /= size;
        else
          for (float *p = static_cast<float*>(data), *e = p + n; p < e; ++p) *p /= float(size);
      },
      "a gradient bucket's all_reduce", std::move(t));
#endif
  return work;
}

}  // namespace frugal::dist
