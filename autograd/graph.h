// The autograd graph: what a recorded op leaves behind. Each op whose inputs need a gradient records a Node
// holding its backward rule, the tensors that rule needs (SavedTensor), and an Edge per input saying where
// that input's gradient goes. Nodes are numbered in creation order (the tape order); backward visits them
// from the newest down (autograd/engine.cpp). A node lives as long as a tensor it produced or a later node
// needs it.
//
//   Tensor w = randn({3, 2}).requires_grad_();
//   Tensor loss = sum(relu(matmul(x, w)));
//   loss.backward();  // w.grad() now holds d loss / d w
#pragma once

#include <any>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "../core/tensor.h"

namespace frugal {

namespace autograd {
struct Node;
}

// A row-wise sparse gradient of a 2-D parameter [rows, dim] (Note [sparse gradients], autograd/sparse.h):
// the rows `indices` (i64 [nnz], unique, ascending) hold `values` ([nnz, dim]); every other row is zero.
struct SparseGrad {
  Tensor indices;
  Tensor values;
  int64_t rows = 0;
  bool defined() const { return indices.defined(); }
};

namespace autograd {
// What a grad-ready hook does with the finished gradient, which decides what it rules out.
enum class GradReadyKind {
  // Changes the gradient or the parameter (optim::StepInBackward's update, pruning's mask): the gradient must
  // be this backward's alone (no accumulation over several backward calls), and neither recompute segments
  // nor the loss scaler can run beside it (Note [stepping in backward], optim/step_in_backward.h).
  Updates,
  // Only reads it (dist::DistributedDataParallel hands it to a reduction): rules nothing out.
  Reads,
};
struct GradReadyHook {
  const void* owner;  // who added it, to remove it by
  GradReadyKind kind;
  std::function<void()> fn;
};
}  // namespace autograd

// What a tensor knows about autograd. A leaf has requires_grad and no grad_fn; an op's output has a grad_fn.
struct AutogradMeta {
  bool requires_grad = false;
  bool retains_grad = false;  // a non-leaf that keeps its .grad() (retain_grad())
  Tensor grad;
  SparseGrad sparse_grad;  // written by nn::Embedding with sparse(true) instead of grad
  std::shared_ptr<autograd::Node> grad_fn;
  std::vector<autograd::GradReadyHook> grad_ready;  // a leaf's hooks (autograd::add_grad_ready_hook)
  bool has_updating_hook() const;
};

namespace autograd {

// Where one input's gradient goes: into a node (the op that produced the input), or into a leaf's .grad.
// Both empty: that input needs no gradient.
struct Edge {
  std::shared_ptr<Node> fn;
  std::shared_ptr<AutogradMeta> leaf;
};

// A tensor kept for backward. In-place changes to it after saving are detected through the storage's version
// counter. With saved-tensor hooks active it is kept in packed form (see SavedTensorHooks).
class SavedTensor {
 public:
  SavedTensor() = default;
  // is_output: the op's own result; kept without its autograd metadata, which would otherwise point back at
  // the node that saves it (a reference cycle).
  SavedTensor(const Tensor& t, bool is_output);
  // The tensor, or an Error naming `op` when it was modified in place after saving.
  Tensor unpack(const char* op) const;
  // The node that produced the saved tensor (for releasing long graphs iteratively).
  std::shared_ptr<Node> producer() const;

 private:
  Tensor tensor_;    // when not packed
  std::any packed_;  // when packed by hooks
  std::function<Tensor(const std::any&)> unpack_;
  std::weak_ptr<Storage> storage_;
  uint64_t version_ = 0;
  bool defined_ = false;
};

// Gradients for each input of a node, in input order; an undefined Tensor means "no gradient".
using Grads = std::vector<Tensor>;
using BackwardFn = std::function<Grads(const Grads& saved, const Tensor& grad_out)>;

struct Node {
  const char* name = "";
  uint64_t sequence = 0;  // creation order: every consumer of a node has a larger number
  std::vector<Edge> inputs;
  std::vector<SavedTensor> saved;
  BackwardFn backward;                 // null once released
  std::weak_ptr<AutogradMeta> output;  // for retain_grad()
  bool released = false;
  // Used by backward() only: the gradient flowing into this node's output, summed over its consumers.
  Tensor pending_grad;
  bool queued = false;

  void save(const Tensor& input) { saved.emplace_back(input, false); }
  void save_output(const Tensor& output) { saved.emplace_back(output, true); }

  Node() = default;
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;
  // Releasing a node can release the nodes behind it; done iteratively, so a 100,000-op chain cannot overflow
  // the stack.
  ~Node();
  void release();  // drops the saved tensors and the rule (after backward without retain_graph)
};

// Calls `hook` in each backward() once this leaf's gradient for that backward is complete: after the last
// of the graph's contributions to it has been added to .grad (a leaf used several times gets one call).
// optim::StepInBackward updates and frees the gradient there. A leaf's hooks run in the order they were
// added. Throws Error for a tensor that is not a leaf requiring grad.
void add_grad_ready_hook(const Tensor& leaf, const void* owner, GradReadyKind kind,
                         std::function<void()> hook);
// Removes the hooks `owner` added to leaf (none: a no-op).
void remove_grad_ready_hook(const Tensor& leaf, const void* owner);
// The leaf's one anonymous Updates hook (owner nullptr: StepInBackward's, pruning's), replaced; an empty
// hook removes it.
void set_grad_ready_hook(const Tensor& leaf, std::function<void()> hook);

// True while some leaf, in any thread, has a grad-ready hook (of either kind; of kind Updates).
bool grad_ready_hooks_exist();
bool updating_grad_ready_hooks_exist();

// Calls `hook` at the end of every backward() that completes, in the thread that ran it, after every
// grad-ready hook: where dist::DistributedDataParallel waits for its reductions. Returns an id for
// remove_backward_end_hook.
int64_t add_backward_end_hook(std::function<void()> hook);
void remove_backward_end_hook(int64_t id);

// Grad mode: recording happens only while it is on (the default) and some input requires grad.
bool grad_mode_enabled();
void set_grad_mode(bool enabled);
bool inference_mode_enabled();

// Packs each saved tensor when saved and unpacks it in backward, while the guard is alive (this thread), e.g.
// to keep activations in bf16 or on another device. Guards nest; the innermost is used.
class SavedTensorHooks {
 public:
  using Pack = std::function<std::any(const Tensor&)>;
  using Unpack = std::function<Tensor(const std::any&)>;
  SavedTensorHooks(Pack pack, Unpack unpack);
  ~SavedTensorHooks();
  SavedTensorHooks(const SavedTensorHooks&) = delete;
  SavedTensorHooks& operator=(const SavedTensorHooks&) = delete;
};

// True when grad mode is on and some defined input requires grad (as a leaf or through its grad_fn).
bool needs_grad(std::initializer_list<const Tensor*> inputs);
bool needs_grad(const std::vector<Tensor>& inputs);

// Records `output` as produced by a new node `name` over `inputs` and returns the node so the caller can save
// tensors and set the rule. The output must be a fresh tensor (no autograd metadata yet).
Node& record(const char* name, std::initializer_list<const Tensor*> inputs, Tensor& output);
Node& record(const char* name, const std::vector<Tensor>& inputs, Tensor& output);

// record() when needs_grad(inputs), else nullptr: `if (Node* n = recorded("exp", {&x}, y)) { ...rule... }`.
Node* recorded(const char* name, std::initializer_list<const Tensor*> inputs, Tensor& output);

// Runs fn with recording off: for user code that the tape itself calls (saved-tensor hooks' pack and
// unpack). A differentiable op needs no such wrapper around core's forward, which calls ops:: only and
// never records (checked by the test_core_no_tape ctest).
template <typename F>
auto forward_only(F&& fn) {
  const bool prev = grad_mode_enabled();
  set_grad_mode(false);
  struct Restore {
    bool prev;
    ~Restore() { set_grad_mode(prev); }
  } restore{prev};
  return fn();
}

// Throws when an in-place op would write into a tensor autograd tracks (grad mode on, requires grad).
void check_inplace(const Tensor& self, const char* op);

// Reduces a gradient of a broadcast result back to an input's shape (sums the broadcast dims).
Tensor sum_to(const Tensor& grad, const Shape& shape);

}  // namespace autograd

// Recording off for the guard's lifetime (this thread). Use it for optimizer updates and evaluation.
class NoGradGuard {
 public:
  NoGradGuard() : prev_(autograd::grad_mode_enabled()) { autograd::set_grad_mode(false); }
  ~NoGradGuard() { autograd::set_grad_mode(prev_); }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool prev_;
};

// Recording back on inside a NoGradGuard (not inside InferenceMode, which cannot be re-enabled).
class EnableGradGuard {
 public:
  EnableGradGuard() : prev_(autograd::grad_mode_enabled()) { autograd::set_grad_mode(true); }
  ~EnableGradGuard() { autograd::set_grad_mode(prev_); }
  EnableGradGuard(const EnableGradGuard&) = delete;
  EnableGradGuard& operator=(const EnableGradGuard&) = delete;

 private:
  bool prev_;
};

// Pure inference: nothing is recorded and grad mode cannot be turned back on inside it.
class InferenceMode {
 public:
  InferenceMode();
  ~InferenceMode();
  InferenceMode(const InferenceMode&) = delete;
  InferenceMode& operator=(const InferenceMode&) = delete;

 private:
  bool prev_grad_, prev_inference_;
};

}  // namespace frugal
