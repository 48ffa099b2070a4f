// Nodes, saved tensors, grad mode and recording.
#include "autograd/graph.h"

#include <atomic>

#include "autograd/functions.h"
#include "core/memory_history.h"

namespace frugal::autograd {

namespace {
thread_local bool t_grad_mode = true;
thread_local bool t_inference = false;
thread_local std::vector<std::pair<SavedTensorHooks::Pack, SavedTensorHooks::Unpack>> t_hooks;
std::atomic<uint64_t> g_sequence{0};

// Nodes waiting to be released by the outermost ~Node on this thread (see Node::~Node).
thread_local std::vector<std::shared_ptr<Node>> t_release;
thread_local bool t_releasing = false;

// A view of t's data without its autograd metadata.
Tensor data_alias(const Tensor& t) {
  return Tensor(t.storage(), t.byte_offset(), t.shape(), t.strides(), t.dtype());
}
}  // namespace

bool grad_mode_enabled() { return t_grad_mode; }
// Note [memory phases] (core/memory_history.h): outside a phase scope, grad mode decides forward or other;
// core keeps a mirror of it, told at every change.
void set_grad_mode(bool enabled) {
  t_grad_mode = enabled && !t_inference;
  memory::detail::set_thread_grad_mode(t_grad_mode);
}
bool inference_mode_enabled() { return t_inference; }

SavedTensorHooks::SavedTensorHooks(Pack pack, Unpack unpack) {
  t_hooks.emplace_back(std::move(pack), std::move(unpack));
}
SavedTensorHooks::~SavedTensorHooks() { t_hooks.pop_back(); }

SavedTensor::SavedTensor(const Tensor& t, bool is_output) {
  if (!t.defined()) return;
  defined_ = true;
  storage_ = t.storage();
  version_ = t.storage()->version();
  const Tensor kept = is_output ? data_alias(t) : t;
  if (!t_hooks.empty()) {
    // The hooks run without recording: packing (a cast, a copy) is not part of the model.
    // Named copies, not a structured binding: clang before 16 cannot capture those in a lambda.
    const SavedTensorHooks::Pack pack = t_hooks.back().first;
    packed_ = forward_only([&] { return pack(kept); });
    unpack_ = t_hooks.back().second;
  } else {
    tensor_ = kept;
  }
}

Tensor SavedTensor::unpack(const char* op) const {
  if (!defined_) return Tensor();
  if (auto s = storage_.lock())
    FRUGAL_CHECK(s->version() == version_, "backward of ", op,
                 ": a tensor it saved was modified by an in-place op after it was saved (version ", version_,
                 " then ", s->version(),
                 "); use an out-of-place op (e.g. add instead of add_) or clone() the "
                 "tensor before modifying it");
  if (unpack_) return forward_only([&] { return unpack_(packed_); });
  return tensor_;
}

std::shared_ptr<Node> SavedTensor::producer() const {
  if (tensor_.defined() && tensor_.autograd_meta()) return tensor_.autograd_meta()->grad_fn;
  return nullptr;
}

void Node::release() {
  saved.clear();
  backward = nullptr;
  released = true;
}

Node::~Node() {
  for (auto& e : inputs)
    if (e.fn) t_release.push_back(std::move(e.fn));
  for (auto& s : saved)
    if (auto p = s.producer()) t_release.push_back(std::move(p));
  inputs.clear();
  saved.clear();
  if (t_releasing) return;
  t_releasing = true;
  while (!t_release.empty()) {
    std::shared_ptr<Node> n = std::move(t_release.back());
    t_release.pop_back();
    n.reset();  // may run another ~Node, which only queues its inputs
  }
  t_releasing = false;
}

namespace {
bool requires_grad(const Tensor& t) {
  if (!t.defined()) return false;
  const auto& m = t.autograd_meta();
  return m && (m->requires_grad || m->grad_fn);
}

Edge edge_of(const Tensor& t) {
  Edge e;
  if (!requires_grad(t)) return e;
  const auto& m = t.autograd_meta();
  if (m->grad_fn)
    e.fn = m->grad_fn;
  else
    e.leaf = m;
  return e;
}

template <typename Range>
Node& record_impl(const char* name, const Range& inputs, Tensor& output) {
  FRUGAL_ASSERT(!output.autograd_meta(), "record(", name, "): the output already has autograd metadata");
  auto node = std::make_shared<Node>();
  node->name = name;
  node->sequence = g_sequence.fetch_add(1, std::memory_order_relaxed);
  node->inputs.reserve(inputs.size());
  for (const auto& t : inputs) node->inputs.push_back(edge_of(t));
  auto meta = std::make_shared<AutogradMeta>();
  meta->grad_fn = node;
  node->output = meta;
  output.set_autograd_meta(std::move(meta));
  return *node;
}

struct Deref {
  std::initializer_list<const Tensor*> ptrs;
  struct It {
    const Tensor* const* p;
    const Tensor& operator*() const { return **p; }
    It& operator++() {
      ++p;
      return *this;
    }
    bool operator!=(const It& o) const { return p != o.p; }
  };
  It begin() const { return {ptrs.begin()}; }
  It end() const { return {ptrs.end()}; }
  size_t size() const { return ptrs.size(); }
};
}  // namespace

bool needs_grad(std::initializer_list<const Tensor*> inputs) {
  if (!t_grad_mode) return false;
  for (const Tensor* t : inputs)
    if (requires_grad(*t)) return true;
  return false;
}

bool needs_grad(const std::vector<Tensor>& inputs) {
  if (!t_grad_mode) return false;
  for (const Tensor& t : inputs)
    if (requires_grad(t)) return true;
  return false;
}

Node& record(const char* name, std::initializer_list<const Tensor*> inputs, Tensor& output) {
  return record_impl(name, Deref{inputs}, output);
}
Node& record(const char* name, const std::vector<Tensor>& inputs, Tensor& output) {
  return record_impl(name, inputs, output);
}

Node* recorded(const char* name, std::initializer_list<const Tensor*> inputs, Tensor& output) {
  return needs_grad(inputs) ? &record(name, inputs, output) : nullptr;
}

void check_inplace(const Tensor& self, const char* op) {
  FRUGAL_CHECK(!(t_grad_mode && requires_grad(self)), op,
               ": in-place ops on a tensor that requires grad are not recorded by autograd (shape ",
               self.shape(),
               "); use the out-of-place op, or wrap the update in NoGradGuard (as optimizers do)");
}

Tensor sum_to(const Tensor& grad, const Shape& shape) {
  if (!grad.defined() || grad.shape() == shape) return grad;
  const int lead = grad.dim() - shape.size();
  FRUGAL_ASSERT(lead >= 0, "sum_to: gradient of shape ", grad.shape(), " cannot reduce to ", shape);
  Shape dims;
  for (int d = 0; d < grad.dim(); ++d)
    if (d < lead || (shape[d - lead] == 1 && grad.shape()[d] != 1)) dims.push_back(d);
  Tensor r = dims.empty() ? grad : frugal::sum(grad, dims, true);
  return r.reshape(shape);
}

}  // namespace frugal::autograd

namespace frugal {
InferenceMode::InferenceMode() : prev_grad_(autograd::t_grad_mode), prev_inference_(autograd::t_inference) {
  autograd::t_inference = true;
  autograd::t_grad_mode = false;
  memory::detail::set_thread_grad_mode(false);
}
InferenceMode::~InferenceMode() {
  autograd::t_inference = prev_inference_;
  autograd::t_grad_mode = prev_grad_;
  memory::detail::set_thread_grad_mode(prev_grad_);
}
}  // namespace frugal
