// Autocast: inside an enabled amp::Autocast guard, GEMM-like ops run in a 16-bit float dtype and numerically
// sensitive ops in f32 (Note [autocast policy]); the state is per thread and guards nest. The policy has its
// one home here: which op is in which list (cast_policy, its table in amp/autocast.cpp) and the casts it
// makes (amp::autocast, one call at the top of each differentiable op). Not here: loss scaling
// (optim/grad_scaler.h).
//
//   Tensor loss;
//   {
//     amp::Autocast guard(DType::BF16);
//     loss = F::cross_entropy(model->forward(x), y);  // the Linear layers in bf16, the loss in f32
//     {
//       amp::Autocast off(DType::BF16, /*enabled=*/false);  // f32 as usual inside
//     }
//   }
//   loss.backward();  // the gradients reach the f32 parameters in f32
//
// Note [autocast policy]: which dtype an op runs in under an enabled guard of dtype L (f16 or bf16), as
// PyTorch's documented autocast lists; the lists are the table of cast_policy (amp/autocast.cpp), applied by
// one call amp::autocast(op, inputs...) at the top of each differentiable op (the wrappers in autograd/ and
// nn::functional), with grad mode on or off alike.
//   - L (GEMM-like): matmul (so the attention products q k^T and p v), F::linear, conv2d. Their floating
//     inputs other than f64 are cast to L.
//   - f32 (numerically sensitive): softmax, log_softmax, sum, mean, var, exp, log, pow, rsqrt, softplus,
//     layer_norm, batch_norm and every loss (cross_entropy, nll_loss, mse_loss, l1_loss, kl_div,
//     binary_cross_entropy_with_logits). Their f16/bf16 inputs are cast to f32, so they return f32. (The
//     table takes the elementwise ops' rows from the autocast column of core/op_list.h.)
//   - every other op: the widest input dtype (the usual promotion; add(f32, bf16) is f32).
// Where this differs from PyTorch: its CUDA list does not put mean, var and batch_norm in f32 (its kernels
// accumulate those in f32 anyway; here the composite layers are built from them), and its CPU list keeps
// softmax, log_softmax, layer_norm, sum, exp, log and pow in bf16; we follow the CUDA list, the safer one,
// for both devices. Two fused ops that already compute in f32 internally take L inputs without a cast, with
// the same numbers and without an f32 copy of their input: cross_entropy's fused kernel (loss rows in f32,
// the loss returned in f32 as a loss in the f32 list must be) and attention_scores_softmax, which returns
// its input's dtype (the widest-input rule) so that the [B, H, T, T] probabilities, the largest activation
// of a transformer, stay in L for the product with v that follows (as PyTorch's scaled_dot_product_attention
// is in its L list).
// What the f32 ops keep for backward under autocast is not always f32: layer_norm keeps x-hat = (x - mean)
// rstd in L (and rstd) instead of its f32 input (PyTorch keeps the f32 input); in a transformer that input is
// the f32 residual stream, which nothing else keeps, so this halves the bytes of 2 of the 9 activations of a
// block (the forward's result is the same bit for bit; Note [layer norm saves x-hat] in
// autograd/grad_norm.cpp says why x-hat may be rounded and x may not). Where a Linear follows the norm
// (F::layer_norm_linear: nn::TransformerBlock's two norms, nn::GPT's last), that x-hat is all the pair keeps,
// not the Linear's input as well: the norm's output is made from the rounded x-hat, so the backward can make
// it again (Note [layer norm before a Linear under autocast], autograd/grad_linear.cpp). The fused
// self_attention keeps only each row's softmax statistics on the CPU, and where it keeps its probabilities
// (CUDA) keeps them in L when its qkv is in L (nn/attention.h). The casts are recorded by autograd, so
// gradients flow back through them to f32 parameters in f32. A cast of a leaf that requires grad (a weight)
// is cached while the outermost enabled guard lives: a weight used twice is cast once. Backward runs with
// autocast off (each rule computes in the dtypes its forward saw), and a recompute segment replays its
// forward under the autocast state it first ran with (autograd/recompute.h).
#pragma once

#include <array>
#include <cstdint>
#include <type_traits>

#include "../core/tensor.h"

namespace frugal::amp {

// The autocast state of this thread.
struct AutocastState {
  bool enabled = false;
  DType dtype = DType::BF16;  // f16 or bf16
};
AutocastState autocast_state();
bool is_autocast_enabled();
DType autocast_dtype();  // the dtype of the innermost guard, bf16 when there is none

// Sets this thread's autocast state for its lifetime and restores the previous one after. dtype must be f16
// or bf16; enabled=false turns autocast off inside an enabled region.
class Autocast {
 public:
  explicit Autocast(DType dtype = DType::BF16, bool enabled = true);
  explicit Autocast(const AutocastState& state) : Autocast(state.dtype, state.enabled) {}
  ~Autocast();
  Autocast(const Autocast&) = delete;
  Autocast& operator=(const Autocast&) = delete;

 private:
  AutocastState prev_;
  bool counted_;  // this guard enabled autocast (the cache lives while such a guard does)
};

// The lists of Note [autocast policy]: how an op's floating inputs are cast under an enabled guard.
enum class CastPolicy {
  Lower,  // GEMM-like: floating inputs other than f64 to the guard's dtype
  F32,    // numerically sensitive: f16/bf16 inputs to f32, so the op returns f32
  Keep,   // the fused ops that compute in f32 themselves: no cast (every op not listed keeps its inputs too)
};
// The list of the op named `op` (the name of its differentiable function: "matmul", "softmax", "mse_loss");
// an InternalError for a name the table does not hold (a call site with a typo).
CastPolicy cast_policy(const char* op);

namespace detail {
// x cast as `policy` says under the enabled guard of this thread (x itself when it needs no cast): a
// recorded, differentiable cast; a weight's cast down cached while the outermost enabled guard lives.
Tensor autocast_input(const Tensor& x, CastPolicy policy);
}  // namespace detail

// op's inputs as it runs them under the policy: with autocast off each input itself, else cast as
// cast_policy(op) says. The one call into the policy at the top of each differentiable op:
//   const auto ab = amp::autocast("matmul", a_in, b_in);  // ab[0], ab[1]: a and b, in bf16 under the guard
template <typename... Ts>
std::array<Tensor, sizeof...(Ts)> autocast(const char* op, const Ts&... inputs) {
  static_assert((std::is_same_v<Ts, Tensor> && ...), "amp::autocast: the inputs are tensors");
  if (!is_autocast_enabled()) return {inputs...};
  const CastPolicy policy = cast_policy(op);
  return {detail::autocast_input(inputs, policy)...};
}

// Casts cached on this thread now (for tests and diagnostics).
int64_t cached_casts();

}  // namespace frugal::amp
