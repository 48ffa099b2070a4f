// dist: several processes training one model, over MPI (launched by mpirun; Debian's OpenMPI). A process is a
// rank; the ranks of a run are its world. Collectives take frugal tensors:
//
//   dist::Guard guard;  // dist::init() ... dist::finalize(); a run not started by mpirun is a world of one
//   Tensor g = ...;
//   dist::all_reduce(g, dist::ReduceOp::Average);  // every rank holds the mean of the ranks' g
//   dist::broadcast(w, 0);                         // every rank holds rank 0's w
//   Tensor all = dist::all_gather(x);              // [world * x.size(0), ...]: the ranks' x, in rank order
//   Tensor mine = dist::reduce_scatter(all, dist::ReduceOp::Sum);  // the sum's rows of this rank
//
// Run: mpirun -np 2 build/examples/train_fmnist --ddp (as root, OpenMPI also wants
// OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1).
//
// Note [the communication thread]: every MPI call of a process runs on one thread of dist's own, started by
// init(): the caller hands it a collective and waits for it. So the training thread can hand it a gradient
// bucket and go on with backward while the bucket is reduced (dist::DistributedDataParallel), MPI needs only
// MPI_THREAD_FUNNELED, and a wait can be bounded: a collective that has not finished after timeout seconds
// (FRUGAL_DIST_TIMEOUT, default 300) means a rank is gone or stuck, and this rank prints which collective it
// waited for and exits with status 1, which makes mpirun stop the others. A rank that throws out of the
// Guard (or calls dist::abort) stops the whole run the same way, at once.
//
// Collectives take contiguous tensors of the same shape and dtype on every rank (checked: a rank whose shape
// or dtype differs gets an Error on every rank, before any data moves). f16 and bf16 are summed in f32 and
// rounded once. CPU tensors go through MPI; CUDA tensors through NCCL, from the CUDA backend
// (core/device_collectives.h: its communicator is made on the first CUDA collective, its id handed out by
// MPI), synchronously on the device's current stream (a DDP bucket of CUDA gradients is reduced at once, not
// overlapped with backward yet). A build whose CUDA backend has no NCCL says so (an Error).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

#include "../core/tensor.h"

namespace frugal::dist {

enum class ReduceOp { Sum, Average, Max };

// Starts the run's communication: MPI when a launcher (mpirun) started this process, else a world of one
// process whose collectives copy. Once per process; a second call is a no-op. Throws Error when launched by
// mpirun but built without MPI.
void init();
// Waits for every rank, then ends MPI; collectives are Errors after it. Called by ~Guard.
void finalize();
bool is_initialized();
// This process's rank in [0, world_size()), and the number of ranks; 0 and 1 before init().
int rank();
int world_size();
// Whether this build has MPI (a world larger than one needs it).
bool built_with_mpi();
// Stops every rank of the run with `code` after printing message on this one (MPI_Abort): for an error one
// rank cannot recover from while others may be waiting for it.
[[noreturn]] void abort(int code, const std::string& message);

// init() at construction; finalize() at destruction, or, when an exception is leaving the scope, abort(1)
// with its message, so that no rank waits for this one.
class Guard {
 public:
  Guard();
  ~Guard();
  Guard(const Guard&) = delete;
  Guard& operator=(const Guard&) = delete;
};

// In place: every rank's t becomes op over the ranks' t (f32, f64, f16, bf16).
void all_reduce(Tensor& t, ReduceOp op = ReduceOp::Sum);
// In place: every rank's t becomes root's (any dtype).
void broadcast(Tensor& t, int root = 0);
// The ranks' t concatenated along dim 0, in rank order (any dtype; 0-d tensors as [1]).
Tensor all_gather(const Tensor& t);
// op over the ranks' t, and of that the rows of this rank: t.size(0) must be a multiple of world_size(),
// rank r gets rows [r * n, (r + 1) * n) with n = t.size(0) / world_size() (f32, f64, f16, bf16).
Tensor reduce_scatter(const Tensor& t, ReduceOp op = ReduceOp::Sum);
void barrier();

// Collectives over a flat CPU tensor split unevenly between the ranks (what ZeroOptimizer's shards need):
// counts[r] elements from offset sum(counts[0..r)) are rank r's; sum(counts) == flat.numel().
// reduce_scatter_flat: the rank's part of op over the ranks' flat, into `part` (counts[rank()] elements).
// all_gather_flat: every rank's flat receives each rank's part in place (part r from rank r).
void reduce_scatter_flat(const Tensor& flat, Tensor& part, const std::vector<int64_t>& counts,
                         ReduceOp op = ReduceOp::Sum);
void all_gather_flat(Tensor& flat, const std::vector<int64_t>& counts);

// A collective handed to the communication thread without waiting (Note [the communication thread]).
class Work {
 public:
  Work() = default;
  // Waits (bounded by the timeout) and rethrows the collective's error, if any.
  void wait();
  bool defined() const { return state_ != nullptr; }
  struct State;

 private:
  friend Work all_reduce_async(Tensor t, ReduceOp op);
  std::shared_ptr<State> state_;
};
// all_reduce of a contiguous f32 or f64 tensor, started now (the ranks' shapes checked too); t must not be
// touched until wait() returns. CUDA tensors are reduced at once, before it returns.
Work all_reduce_async(Tensor t, ReduceOp op = ReduceOp::Sum);

}  // namespace frugal::dist
