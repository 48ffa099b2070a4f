// backward(): visits the nodes reachable from the root, newest first (a node's consumers are always newer, so
// each node runs once with its whole gradient), and releases each node's saved tensors as soon as its rule
// has run. Iterative: no recursion, whatever the depth.
#include <atomic>
#include <mutex>
#include <queue>
#include <unordered_map>
#include <unordered_set>

#include "amp/autocast.h"
#include "autograd/functions.h"
#include "autograd/graph.h"
#include "core/memory_history.h"

namespace frugal {
bool AutogradMeta::has_updating_hook() const {
  for (const autograd::GradReadyHook& h : grad_ready)
    if (h.kind == autograd::GradReadyKind::Updates) return true;
  return false;
}
}  // namespace frugal

namespace frugal::autograd {

namespace {

// Adds g into slot: in place when nothing else can see the slot's tensor and g has its shape and dtype (no
// new buffer), out of place otherwise (the tensor there may be shared, e.g. add's two input gradients).
void accumulate(Tensor& slot, const Tensor& g) {
  if (!slot.defined())
    slot = g;
  else if (slot.is_unique() && slot.shape() == g.shape() && slot.dtype() == g.dtype() &&
           slot.device() == g.device())
    ops::add_(slot, g);
  else
    slot = add(slot, g);
}

// A leaf's .grad is its own contiguous tensor, so in-place updates of it (clipping, optimizers) can touch no
// other gradient: the first gradient is taken over only when nothing else can see it, and copied otherwise.
// Its bytes are counted under the memory tag "gradients", wherever backward runs.
void accumulate_leaf(AutogradMeta& meta, Tensor g) {
  NoGradGuard guard;  // accumulating into .grad is not itself part of any graph
  if (meta.grad.defined())
    ops::add_(meta.grad, g);  // .grad is this leaf's own tensor: add in place, no new buffer
  else
    meta.grad = g.is_unique() && g.is_contiguous() ? std::move(g) : g.clone();
  static const uint32_t kGradientsTag = memory::intern_tag("gradients");
  meta.grad.storage()->retag(kGradientsTag);
}

struct Newest {
  bool operator()(const Node* a, const Node* b) const { return a->sequence < b->sequence; }
};

// Grad-ready hooks on leaves, in every thread (all; of kind Updates): while there are none, backward() does
// not look for them.
std::atomic<int64_t> g_ready_hooks{0};
std::atomic<int64_t> g_updating_hooks{0};

// A leaf with an Updates hook takes its gradient after a backward as that backward's alone.
void check_no_earlier_gradient(const AutogradMeta& leaf) {
  FRUGAL_CHECK(!(leaf.has_updating_hook() && leaf.grad.defined()),
               "backward: a parameter whose update runs in backward (a grad-ready hook: "
               "optim::StepInBackward) already has a gradient; gradients cannot accumulate over several "
               "backward calls then (each backward is a step): no gradient accumulation, or no "
               "StepInBackward");
}

void run_grad_ready_hooks(AutogradMeta& leaf) {
  // A hook may remove hooks (its owner's destructor, say): run a copy of the list.
  const std::vector<GradReadyHook> hooks = leaf.grad_ready;
  for (const GradReadyHook& h : hooks) h.fn();
}

// Note [grad-ready hooks]: for each leaf with a hook, how many edges of the graph below `first` will bring it
// a gradient; backward() counts them down as it goes and calls the hook at zero. One walk over the graph,
// only while some leaf has a hook.
struct PendingLeaf {
  int edges = 0;     // still to be processed
  bool got = false;  // a gradient arrived in this backward
};
std::unordered_map<AutogradMeta*, PendingLeaf> leaves_with_hooks(Node* first) {
  std::unordered_map<AutogradMeta*, PendingLeaf> pending;
  std::unordered_set<Node*> seen{first};
  std::vector<Node*> todo{first};
  while (!todo.empty()) {
    Node* n = todo.back();
    todo.pop_back();
    for (const Edge& e : n->inputs) {
      if (e.leaf && !e.leaf->grad_ready.empty()) {
        check_no_earlier_gradient(*e.leaf);
        ++pending[e.leaf.get()].edges;
      }
      if (e.fn && seen.insert(e.fn.get()).second) todo.push_back(e.fn.get());
    }
  }
  return pending;
}

// The backward-end hooks, by id: few, and called once a backward. While there are none (g_end_hook_count),
// backward() takes no lock for them.
std::mutex g_end_hooks_mutex;
std::vector<std::pair<int64_t, std::function<void()>>> g_end_hooks;
int64_t g_next_end_hook = 1;
std::atomic<int64_t> g_end_hook_count{0};

void run_backward_end_hooks() {
  if (g_end_hook_count.load(std::memory_order_relaxed) == 0) return;
  std::vector<std::pair<int64_t, std::function<void()>>> hooks;
  {
    std::lock_guard<std::mutex> lock(g_end_hooks_mutex);
    if (g_end_hooks.empty()) return;
    hooks = g_end_hooks;
  }
  for (const auto& h : hooks) h.second();
}

}  // namespace

void add_grad_ready_hook(const Tensor& leaf, const void* owner, GradReadyKind kind,
                         std::function<void()> hook) {
  FRUGAL_CHECK(leaf.defined() && leaf.autograd_meta() && leaf.autograd_meta()->requires_grad &&
                   !leaf.autograd_meta()->grad_fn,
               "add_grad_ready_hook: the tensor must be a leaf that requires grad (a parameter)");
  FRUGAL_CHECK(static_cast<bool>(hook), "add_grad_ready_hook: the hook is empty");
  leaf.autograd_meta()->grad_ready.push_back({owner, kind, std::move(hook)});
  g_ready_hooks.fetch_add(1, std::memory_order_relaxed);
  if (kind == GradReadyKind::Updates) g_updating_hooks.fetch_add(1, std::memory_order_relaxed);
}

void remove_grad_ready_hook(const Tensor& leaf, const void* owner) {
  if (!leaf.defined() || !leaf.autograd_meta()) return;
  auto& hooks = leaf.autograd_meta()->grad_ready;
  for (auto it = hooks.begin(); it != hooks.end();) {
    if (it->owner != owner) {
      ++it;
      continue;
    }
    g_ready_hooks.fetch_sub(1, std::memory_order_relaxed);
    if (it->kind == GradReadyKind::Updates) g_updating_hooks.fetch_sub(1, std::memory_order_relaxed);
    it = hooks.erase(it);
  }
}

void set_grad_ready_hook(const Tensor& leaf, std::function<void()> hook) {
  FRUGAL_CHECK(leaf.defined() && leaf.autograd_meta() && leaf.autograd_meta()->requires_grad &&
                   !leaf.autograd_meta()->grad_fn,
               "set_grad_ready_hook: the tensor must be a leaf that requires grad (a parameter)");
  remove_grad_ready_hook(leaf, nullptr);
  if (hook) add_grad_ready_hook(leaf, nullptr, GradReadyKind::Updates, std::move(hook));
}

bool grad_ready_hooks_exist() { return g_ready_hooks.load(std::memory_order_relaxed) > 0; }
bool updating_grad_ready_hooks_exist() { return g_updating_hooks.load(std::memory_order_relaxed) > 0; }

int64_t add_backward_end_hook(std::function<void()> hook) {
  FRUGAL_CHECK(static_cast<bool>(hook), "add_backward_end_hook: the hook is empty");
  std::lock_guard<std::mutex> lock(g_end_hooks_mutex);
  g_end_hooks.emplace_back(g_next_end_hook, std::move(hook));
  g_end_hook_count.store(int64_t(g_end_hooks.size()), std::memory_order_relaxed);
  return g_next_end_hook++;
}

void remove_backward_end_hook(int64_t id) {
  std::lock_guard<std::mutex> lock(g_end_hooks_mutex);
  std::erase_if(g_end_hooks, [id](const auto& h) { return h.first == id; });
  g_end_hook_count.store(int64_t(g_end_hooks.size()), std::memory_order_relaxed);
}

void backward(const Tensor& root, const Tensor& grad_in, bool retain_graph) {
  FRUGAL_CHECK(root.defined(), "backward: the tensor is undefined");
  memory::PhaseScope phase(memory::Phase::Backward);  // Note [memory phases]
  const auto& meta = root.autograd_meta();
  FRUGAL_CHECK(
      meta && (meta->requires_grad || meta->grad_fn), "backward: the tensor (shape ", root.shape(),
      ") does not require grad and has no grad_fn; call "
      "requires_grad_() on the leaves you want gradients for, and make sure no NoGradGuard was active "
      "when it was computed");
  Tensor grad = grad_in;
  if (!grad.defined()) {
    FRUGAL_CHECK_SHAPE(root.numel() == 1,
                       "backward: a gradient can be created implicitly only for a tensor of "
                       "one element, got shape ",
                       root.shape(), "; pass the gradient explicitly: y.backward(grad)");
    grad = ones_like(root);
  }
  FRUGAL_CHECK_SHAPE(grad.shape() == root.shape(), "backward: the gradient's shape ", grad.shape(),
                     " differs from the tensor's shape ", root.shape());
  FRUGAL_CHECK_DTYPE(grad.dtype() == root.dtype(), "backward: the gradient's dtype ",
                     dtype_name(grad.dtype()), " differs from the tensor's ", dtype_name(root.dtype()));
  FRUGAL_CHECK_T(DeviceError, grad.device() == root.device(), "backward: the gradient is on ", grad.device(),
                 " but the tensor is on ", root.device());

  if (!meta->grad_fn) {  // a leaf
    check_no_earlier_gradient(*meta);
    accumulate_leaf(*meta, grad);
    run_grad_ready_hooks(*meta);
    run_backward_end_hooks();
    return;
  }

  // The rules run without recording (no create_graph): their ops only compute gradients. They run without
  // autocast too, in the dtypes their forward saw (Note [autocast policy], amp/autocast.h).
  NoGradGuard no_grad;
  amp::Autocast no_autocast(amp::autocast_dtype(), /*enabled=*/false);
  std::priority_queue<Node*, std::vector<Node*>, Newest> ready;
  // If a rule throws, the nodes still queued must not keep a half-summed gradient for the next backward.
  struct Drain {
    std::priority_queue<Node*, std::vector<Node*>, Newest>& q;
    ~Drain() {
      for (; !q.empty(); q.pop()) {
        q.top()->pending_grad = Tensor();
        q.top()->queued = false;
      }
    }
  } drain{ready};
  Node* first = meta->grad_fn.get();
  std::unordered_map<AutogradMeta*, PendingLeaf> pending_leaves;
  if (grad_ready_hooks_exist()) pending_leaves = leaves_with_hooks(first);
  // A leaf's last edge has been processed (with a gradient or without): its hook runs now, if this backward
  // gave it a gradient.
  auto edge_done = [&](AutogradMeta* leaf, bool got) {
    auto it = pending_leaves.find(leaf);
    if (it == pending_leaves.end()) return;
    it->second.got |= got;
    if (--it->second.edges > 0) return;
    const bool call = it->second.got;
    pending_leaves.erase(it);
    if (call) run_grad_ready_hooks(*leaf);
  };
  first->pending_grad = grad;
  first->queued = true;
  ready.push(first);
  Grads saved;  // reused for every node
  while (!ready.empty()) {
    Node* node = ready.top();
    ready.pop();
    const Tensor g = std::move(node->pending_grad);
    node->pending_grad = Tensor();
    node->queued = false;
    FRUGAL_CHECK(
        !node->released, "backward: trying to run backward through ", node->name,
        " a second time, but its saved tensors were already freed; pass retain_graph=true to the first "
        "backward() if you need to call backward twice");
    if (auto out = node->output.lock(); out && out->retains_grad) accumulate_leaf(*out, g);

    saved.clear();
    for (const auto& s : node->saved) saved.push_back(s.unpack(node->name));
    Grads grads;
    {
      // Note [op names in the history]: the rule's bytes and time are the node's; its input, the gradient.
      memory::OpScope op(node->name, g);
      grads = node->backward(saved, g);
    }
    saved.clear();
    if (!retain_graph) node->release();  // its saved activations go back to the arena now
    FRUGAL_ASSERT(grads.size() == node->inputs.size(), node->name, " returned ", grads.size(),
                  " gradients for ", node->inputs.size(), " inputs");

    for (size_t i = 0; i < grads.size(); ++i) {
      const Edge& e = node->inputs[i];
      if (e.leaf && !pending_leaves.empty()) {
        const bool got = grads[i].defined();
        if (got) accumulate_leaf(*e.leaf, std::move(grads[i]));
        edge_done(e.leaf.get(), got);
        continue;
      }
      if (!grads[i].defined() || (!e.fn && !e.leaf)) continue;
      if (e.leaf) {
        accumulate_leaf(*e.leaf, std::move(grads[i]));
        continue;
      }
      Node* next = e.fn.get();
      accumulate(next->pending_grad, grads[i]);
      if (!next->queued) {
        next->queued = true;
        ready.push(next);
      }
    }
  }
  // Leaves some of whose edges were never reached (every gradient above those was undefined): complete now.
  for (auto& [leaf, p] : pending_leaves)
    if (p.got) run_grad_ready_hooks(*leaf);
  run_backward_end_hooks();
}

}  // namespace frugal::autograd
