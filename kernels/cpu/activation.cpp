// CPU kernels of the activations' gradients that run as one pass (op_gelu_backward, op_gelu_tanh_backward,
// op_relu_backward, and op_gelu_and_backward for gelu_linear's backward; formulas in core/op_table.h)
// instead of several elementwise ops. The math is one Eigen array expression, so contiguous f32/f64 runs use
// Eigen's vectorised erf, exp and tanh (Eigen's float erf is a clamped rational approximation accurate to a
// few ulps, the same the forward gelu uses); other runs (strided, f16/bf16) pass through small buffers in the
// compute type. Their reference is the gradient autograd derives from the composite forms
// (tests/kernels/test_gelu.cpp).
#include <Eigen/Core>
#include <algorithm>
#include <unsupported/Eigen/SpecialFunctions>

#include "core/op_table.h"
#include "kernels/cpu/gelu_forms.h"
#include "kernels/cpu/map.h"
#include "kernels/cpu/register.h"

namespace frugal {
namespace {

using cpu::In;
using cpu::Out;

// dx, dy, x as Eigen maps, in L1-sized pieces: the rules below are two statements.
template <typename T, typename F>
void map_backward(const Loop& loop, F f) {
  cpu::map_kernel<T, 2, /*Chunked=*/true>(loop, f);
}

// dx = dy (Phi(x) + x phi(x)): Phi(x) = (1 + erf(x / sqrt 2)) / 2, phi(x) = exp(-x^2 / 2) / sqrt(2 pi)
template <typename T>
void gelu_backward_cpu(const Loop& loop, const OpArgs&) {
  using C = acc_t<T>;
  map_backward<T>(loop, [](Out<C>& dx, const In<C>& dy, const In<C>& x) {
    dx = cpu::gelu_backward_form<C>(dy, x, cpu::gelu_erf<C>(x));
  });
}

// dx = dy ((1 + t) / 2 + x (1 - t^2) k (1 + 3 c x^2) / 2), t = tanh(k (x + c x^3))
template <typename T>
void gelu_tanh_backward_cpu(const Loop& loop, const OpArgs&) {
  using C = acc_t<T>;
  map_backward<T>(loop, [](Out<C>& dx, const In<C>& dy, const In<C>& x) {
    constexpr C k = C(0.79788456080286535588), c = C(0.044715);
    dx = (k * x * (C(1) + c * x.square())).tanh();  // t, computed once (an expression would recompute it)
    dx = dy * C(0.5) * (C(1) + dx + x * (C(1) - dx.square()) * k * (C(1) + C(3) * c * x.square()));
  });
}

// Note [gelu_linear's backward in one pass over x] (autograd/grad_linear.cpp): y = gelu(x) and dy <- dy
// gelu'(x) with one read of x, from the forms gelu's and gelu_backward's kernels use (kernels/cpu/
// gelu_forms.h), in pieces that give the whole run's results (Note [pieces of a run, bit for bit]; y and dy
// equally aligned, as fresh tensors are), so that both results are those two ops' bit for bit. The elements
// Eigen assigns by packets share one erf; those it assigns one by one (a run's unaligned head, the tail after
// its last whole packet; all of them in f64, which has no packet erf) compute erf inside each form, as the
// two ops do: the compiler may contract a scalar erf's last operations with what follows it there and not
// when it is shared (1 of 35 elements differed in its last bit). e: scratch for the shared erf.
template <typename C>
void gelu_and_backward_piece(C* dy_p, C* y_p, const C* x_p, C* e_p, int64_t m, int64_t packets) {
  if (packets > 0) {
    Out<C> dy(dy_p, packets), y(y_p, packets), e(e_p, packets);
    In<C> x(x_p, packets);
    e = cpu::gelu_erf<C>(x);
    y = cpu::gelu_form<C>(x, e);
    dy = cpu::gelu_backward_form<C>(dy, x, e);
  }
  if (packets < m) {
    Out<C> dy(dy_p + packets, m - packets), y(y_p + packets, m - packets);
    In<C> x(x_p + packets, m - packets);
    y = cpu::gelu_form<C>(x, cpu::gelu_erf<C>(x));
    dy = cpu::gelu_backward_form<C>(dy, x, cpu::gelu_erf<C>(x));
  }
}

// Operands: dy (read, then written with dx), y, x.
template <typename T>
void gelu_and_backward_cpu(const Loop& loop, const OpArgs&) {
  using C = acc_t<T>;
  constexpr int64_t kSize = int64_t(sizeof(T));
  constexpr int64_t kPacketBytes = int64_t(sizeof(typename Eigen::internal::packet_traits<C>::type));
  constexpr int64_t kPacket = kPacketBytes / int64_t(sizeof(C));  // elements
  // Where Eigen has no packet erf (f64), it assigns every element one by one.
  constexpr bool kPacketErf =
      Eigen::internal::functor_traits<Eigen::internal::scalar_erf_op<C>>::PacketAccess;
  auto whole_packets = [](int64_t m) { return kPacketErf ? m / kPacket * kPacket : 0; };
  for_each_run(loop, [&](char* const* p, const int64_t* s, int64_t n) {
    alignas(64) C e[cpu::kMapChunk];
    if constexpr (std::is_same_v<T, C>) {
      if (s[0] == kSize && s[1] == kSize && s[2] == kSize) {
        // Pieces as the two ops cut runs over fresh outputs, which y is: by y's alignment. Where dy is not
        // aligned as y, a piece's d x is made in `dx` (aligned as y's piece) and copied over dy.
        C* const dy = reinterpret_cast<C*>(p[0]);
        C* const y = reinterpret_cast<C*>(p[1]);
        const C* const x = reinterpret_cast<const C*>(p[2]);
        const bool together = (reinterpret_cast<uintptr_t>(dy) - reinterpret_cast<uintptr_t>(y)) % 64 == 0;
        alignas(64) C dx[cpu::kMapChunk];
        for (int64_t i = 0, m = cpu::first_piece(y, n); i < n; i += m, m = std::min(cpu::kMapChunk, n - i)) {
          // Only an aligned piece has packets (and fits in e: a longer first piece, of a y not even aligned
          // to its elements, has none).
          const int64_t packets =
              reinterpret_cast<uintptr_t>(y + i) % kPacketBytes == 0 ? whole_packets(m) : 0;
          C* const out = together || packets == 0 ? dy + i : std::copy_n(dy + i, m, dx) - m;
          gelu_and_backward_piece(out, y + i, x + i, e, m, packets);
          if (out != dy + i) std::copy_n(dx, m, dy + i);
        }
        return;
      }
    }
    alignas(64) C dy[cpu::kMapChunk], y[cpu::kMapChunk], x[cpu::kMapChunk];
    for (int64_t i = 0; i < n; i += cpu::kMapChunk) {
      const int64_t m = std::min(cpu::kMapChunk, n - i);
      cpu::load<T>(p[0] + i * s[0], s[0], m, dy);
      cpu::load<T>(p[2] + i * s[2], s[2], m, x);
      gelu_and_backward_piece(dy, y, x, e, m, whole_packets(m));
      cpu::store<T>(p[0] + i * s[0], s[0], m, dy);
      cpu::store<T>(p[1] + i * s[1], s[1], m, y);
    }
  });
}

// dx = y > 0 ? dy : 0 (y is ReLU's output; a select, so the values are exactly where(y > 0, dy, 0)'s)
template <typename T>
void relu_backward_cpu(const Loop& loop, const OpArgs&) {
  using C = acc_t<T>;
  map_backward<T>(loop,
                  [](Out<C>& dx, const In<C>& dy, const In<C>& y) { dx = (y > C(0)).select(dy, C(0)); });
}

const bool kRegistered = [] {
  cpu::for_types<float, double, Half, BFloat16>([](auto t) {
    using T = decltype(t);
    op_gelu_backward.set(DeviceType::CPU, dtype_v<T>, gelu_backward_cpu<T>);
    op_gelu_tanh_backward.set(DeviceType::CPU, dtype_v<T>, gelu_tanh_backward_cpu<T>);
    op_relu_backward.set(DeviceType::CPU, dtype_v<T>, relu_backward_cpu<T>);
    op_gelu_and_backward.set(DeviceType::CPU, dtype_v<T>, gelu_and_backward_cpu<T>);
  });
  return true;
}();

}  // namespace
}  // namespace frugal
