// The CPU convolution's oneDNN plans (kernels/cpu/conv_onednn.h): building a primitive for a shape,
// direction and dtype under the layout and Winograd policies, caching it, and running it on the user's NCHW
// tensors with arena buffers for the reorders and the scratchpad.
#include <algorithm>
#include <atomic>
#include <string_view>
#include <unordered_map>

#include "core/error.h"
#include "core/parallel.h"
#include "core/tensor.h"
#include "kernels/cpu/conv_onednn.h"
#include "kernels/cpu/reference.h"
#include "kernels/cpu/workspace.h"

namespace frugal {

#ifdef FRUGAL_HAVE_ONEDNN
namespace cpu {
namespace {

using Direction = ConvDirection;
using DataType = dnnl::memory::data_type;

// Letting oneDNN pick its blocked layout (and reordering NCHW in and out) is the default: on the W2 shapes
// (bench/bench_conv.cpp, one thread, so that the host's other load does not count) it is 1.2-4x faster in
// every direction, e.g. conv 32->64 14x14 batch 64 forward 4.5 vs 6.4 ms, backward data 4.6 vs 9.0 ms, and
// conv 1->32 backward weight 0.55 vs 2.2 ms. On an oversubscribed host plain NCHW can win, as it runs one
// parallel region per call instead of up to four.
std::atomic<bool> g_any_layout{true};
// Note [Winograd convolutions]: with set_conv_onednn_winograd(true) the forward asks oneDNN for
// convolution_auto, which takes its Winograd F(4x4, 3x3) kernel where oneDNN's heuristic expects it to be
// faster (3x3, stride 1, f32, AVX-512, a large enough batch) and the direct one elsewhere; both backward
// directions then follow the forward's choice. It trades memory for time: a scratchpad for the transformed
// tiles (arena memory, counted by the dry run like every scratchpad) that oneDNN sizes from the machine's
// caches, not from the images, and a larger rounding error, within a few units of f32's rounding times the
// reduction length (Conv2d.WinogradMatchesReference). At W2's conv 32->64 14x14:
// - 2-core Zen 4 (2026-12-04), batch 64: forward 2.1 -> 1.6 ms, backward data 2.1 -> 1.5 ms, backward weight
//   2.4 -> 1.5 ms (oneDNN's auto keeps the direct kernel for backward weight, although Winograd is faster
//   there too), W2's step about 0.83x; scratchpads 7.1 MiB (forward, backward data), 9.3 MiB (weight).
// - 2-core Xeon (Intel family 6, model 207; 2 MiB of L2 a core), W2's step at batch 64 0.965x the direct
//   kernel's time for a peak 1.32x as high (41.3 against 31.3 MB), scratchpads 9.7 MiB and, at a micro-batch
//   of 32, 15.6 MiB (weight); its evaluation forward at batch 250 0.82x the time for 2.2x the working
//   memory (24.2 against 11.0 MB).
// The direct kernel is the default: this is a framework that trades time for memory, not the other way
// round, and the peers' CPU convolution runs the direct kernel too. A program that has the memory to spare
// turns Winograd on.
std::atomic<bool> g_winograd{false};

using ConvPlans = cpu::PlanCache<19, ConvPlan>;

using cpu::onednn_engine;
using DataType = dnnl::memory::data_type;

ConvPlans::Key key_of(const ConvArgs& a, Direction dir, bool any, bool winograd, DataType type) {
  const bool bias = dir == Direction::Forward ? a.bias != nullptr : a.dbias != nullptr;
  return {int64_t(dir), any,     bias,     a.n,           a.c,        a.h,     a.w,
          a.o,          a.kh,    a.kw,     a.stride_h,    a.stride_w, a.pad_h, a.pad_w,
          a.dil_h,      a.dil_w, a.groups, int64_t(type), winograd};
}

// Every user tensor has the dtype `type` (f32 or bf16); oneDNN accumulates bf16 in f32.
std::shared_ptr<const ConvPlan> build_plan(const ConvArgs& a, Direction dir, bool any, bool winograd,
                                           DataType type) {
  using tag = dnnl::memory::format_tag;
  using md = dnnl::memory::desc;
  const dnnl::memory::dims x_dims{a.n, a.c, a.h, a.w}, y_dims{a.n, a.o, a.oh, a.ow}, b_dims{a.o};
  const dnnl::memory::dims w_dims =
      a.groups > 1 ? dnnl::memory::dims{a.groups, a.o / a.groups, a.c / a.groups, a.kh, a.kw}
                   : dnnl::memory::dims{a.o, a.c, a.kh, a.kw};
  const tag w_tag = a.groups > 1 ? tag::goihw : tag::oihw;
  const md x_user(x_dims, type, tag::nchw), y_user(y_dims, type, tag::nchw);
  const md w_user(w_dims, type, w_tag), b_user(b_dims, type, tag::x);
  const md x_want = any ? md(x_dims, type, tag::any) : x_user;
  const md y_want = any ? md(y_dims, type, tag::any) : y_user;
  const md w_want = any ? md(w_dims, type, tag::any) : w_user;
  // oneDNN counts dilation from 0; PyTorch's right padding equals the left, and oneDNN accepts an output
  // size computed with floor division from it.
  const dnnl::memory::dims strides{a.stride_h, a.stride_w}, dilates{a.dil_h - 1, a.dil_w - 1},
      pad{a.pad_h, a.pad_w};
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  // No ReLU post-op for conv2d_relu: it took a NaN to 0 (Note [conv2d_relu keeps a NaN], conv.cpp).
  auto& eng = onednn_engine();

  const bool fwd_bias = dir == Direction::Forward && a.bias;
  // oneDNN's heuristic alone would take Winograd for W2's first layer too (1 input channel), where the tile
  // transforms dominate and it is 5x slower than direct: it is offered only with 16 channels or more on both
  // sides.
  const bool offer_winograd = winograd && a.c / a.groups >= 16 && a.o / a.groups >= 16;
  const auto fwd_algo =
      offer_winograd ? dnnl::algorithm::convolution_auto : dnnl::algorithm::convolution_direct;
  const dnnl::convolution_forward::desc fwd_desc(dnnl::prop_kind::forward_training, fwd_algo, x_want, w_want,
                                                 fwd_bias ? b_user : md(), y_want, strides, dilates, pad,
                                                 pad);
  const dnnl::convolution_forward::primitive_desc fwd_pd(fwd_desc, attr, eng);
  // The backward directions follow the forward's choice (Note [Winograd convolutions]); where oneDNN has no
  // Winograd kernel for one of them, it runs direct.
  const bool wino = std::string_view(fwd_pd.impl_info_str()).find("wino") != std::string_view::npos;
  auto backward_pd = [&](auto make) {
    if (wino) try {
        return make(dnnl::algorithm::convolution_winograd);
      } catch (const dnnl::error&) {
      }
    return make(dnnl::algorithm::convolution_direct);
  };

  auto plan = std::make_shared<ConvPlan>();
  auto add = [&](int arg, const md& user, const md& compute, bool output) {
    Operand op;
    op.arg = arg;
    op.output = output;
    op.user = user;
    op.compute = compute;
    if (user != compute)
      op.reorder = output ? dnnl::reorder(dnnl::reorder::primitive_desc(eng, compute, eng, user))
                          : dnnl::reorder(dnnl::reorder::primitive_desc(eng, user, eng, compute));
    plan->operands.push_back(std::move(op));
  };
  std::string impl;
  if (dir == Direction::Forward) {
    plan->primitive = dnnl::convolution_forward(fwd_pd);
    impl = fwd_pd.impl_info_str();
    plan->scratchpad = fwd_pd.scratchpad_desc();
    add(DNNL_ARG_SRC, x_user, fwd_pd.src_desc(), false);
    add(DNNL_ARG_WEIGHTS, w_user, fwd_pd.weights_desc(), false);
    if (a.bias) add(DNNL_ARG_BIAS, b_user, fwd_pd.bias_desc(), false);
    add(DNNL_ARG_DST, y_user, fwd_pd.dst_desc(), true);
  } else if (dir == Direction::BackwardData) {
    const auto pd = backward_pd([&](dnnl::algorithm algo) {
      const dnnl::convolution_backward_data::desc desc(algo, x_want, w_want, y_want, strides, dilates, pad,
                                                       pad);
      return dnnl::convolution_backward_data::primitive_desc(desc, attr, eng, fwd_pd);
    });
    plan->primitive = dnnl::convolution_backward_data(pd);
    impl = pd.impl_info_str();
    plan->scratchpad = pd.scratchpad_desc();
    add(DNNL_ARG_DIFF_DST, y_user, pd.diff_dst_desc(), false);
    add(DNNL_ARG_WEIGHTS, w_user, pd.weights_desc(), false);
    add(DNNL_ARG_DIFF_SRC, x_user, pd.diff_src_desc(), true);
  } else {
    const auto pd = backward_pd([&](dnnl::algorithm algo) {
      const dnnl::convolution_backward_weights::desc desc(algo, x_want, w_want, a.dbias ? b_user : md(),
                                                          y_want, strides, dilates, pad, pad);
      return dnnl::convolution_backward_weights::primitive_desc(desc, attr, eng, fwd_pd);
    });
    plan->primitive = dnnl::convolution_backward_weights(pd);
    impl = pd.impl_info_str();
    plan->scratchpad = pd.scratchpad_desc();
    add(DNNL_ARG_SRC, x_user, pd.src_desc(), false);
    add(DNNL_ARG_DIFF_DST, y_user, pd.diff_dst_desc(), false);
    add(DNNL_ARG_DIFF_WEIGHTS, w_user, pd.diff_weights_desc(), true);
    if (a.dbias) add(DNNL_ARG_DIFF_BIAS, b_user, pd.diff_bias_desc(), true);
  }
  // oneDNN's reference convolution is far slower in bf16 than widening to f32 for the f32 primitives.
  if (type == DataType::bf16 && impl.starts_with("ref")) return nullptr;
  plan->implementation = impl;
  plan->type = type;
  return plan;
}

// The multiply-adds of a's convolution (the direct algorithm's count, whatever oneDNN runs), and the count
// below which it runs on one thread under passive waiting, as a product of the same dtype does (Note [a
// product on one thread under passive waiting], core/parallel.cpp).
int64_t conv_macs(const ConvArgs& a) {
  return a.n * a.o * a.oh * a.ow * (a.c / std::max<int64_t>(a.groups, 1)) * a.kh * a.kw;
}
int64_t one_thread_below(DataType type) {
  return type == DataType::bf16 ? detail::kPassiveBf16Product : detail::kPassiveF32Product;
}

}  // namespace

std::shared_ptr<const ConvPlan> conv_plan(const ConvArgs& a, Direction dir, DataType type) {
  static ConvPlans plans(128);
  const bool any = g_any_layout.load(std::memory_order_relaxed);
  const bool winograd = g_winograd.load(std::memory_order_relaxed);
  return plans.get(key_of(a, dir, any, winograd, type), [&] {
    const detail::OneThreadProduct threads(conv_macs(a), one_thread_below(type));
    return build_plan(a, dir, any, winograd, type);
  });
}

namespace {

const void* user_pointer(const ConvArgs& a, int arg) {
  switch (arg) {
    case DNNL_ARG_SRC:
      return a.x;
    case DNNL_ARG_WEIGHTS:
      return a.weight;
    case DNNL_ARG_BIAS:
      return a.bias;
    case DNNL_ARG_DST:
      return a.y;
    case DNNL_ARG_DIFF_DST:
      return a.dy;
    case DNNL_ARG_DIFF_SRC:
      return a.dx;
    case DNNL_ARG_DIFF_WEIGHTS:
      return a.dweight;
    case DNNL_ARG_DIFF_BIAS:
      return a.dbias;
    default:
      FRUGAL_ASSERT(false, "conv2d: unexpected oneDNN argument ", arg);
      return nullptr;
  }
}

}  // namespace

void run_conv_plan(const ConvPlan& plan, const ConvArgs& a, const Prepared& prepared) {
  const detail::OneThreadProduct threads(conv_macs(a), one_thread_below(plan.type));
  auto& eng = onednn_engine();
  auto& stream = cpu::onednn_stream();
  std::vector<Tensor> buffers;  // alive until the stream is done
  std::unordered_map<int, dnnl::memory> args;
  std::vector<std::pair<const Operand*, dnnl::memory>> outputs;  // (operand, user memory) to reorder into
  for (const Operand& op : plan.operands) {
    if (prepared.dy && op.arg == DNNL_ARG_DIFF_DST) {
      args.emplace(op.arg, *prepared.dy);
      continue;
    }
    if (void* at = op.arg == DNNL_ARG_DST       ? prepared.y
                   : op.arg == DNNL_ARG_WEIGHTS ? const_cast<void*>(prepared.weights)
                                                : nullptr) {
      args.emplace(op.arg, dnnl::memory(op.compute, eng, at));
      continue;
    }
    dnnl::memory user(op.user, eng, const_cast<void*>(user_pointer(a, op.arg)));  // inputs are only read
    if (!op.reorder) {
      args.emplace(op.arg, user);
      continue;
    }
    buffers.push_back(workspace(int64_t(op.compute.get_size())));
    dnnl::memory compute(op.compute, eng, buffers.back().raw_data());
    if (op.output)
      outputs.emplace_back(&op, user);
    else
      op.reorder->execute(stream, user, compute);
    args.emplace(op.arg, compute);
  }
  buffers.push_back(cpu::add_scratchpad(plan.scratchpad, args));
  plan.primitive.execute(stream, args);
  for (auto& [op, user] : outputs) op->reorder->execute(stream, args.at(op->arg), user);
  stream.wait();
}

void conv_plan_meta(const ConvPlan& plan, const Prepared& prepared) {
  std::vector<Tensor> buffers;
  for (const Operand& op : plan.operands)
    if (op.reorder && !(prepared.dy && op.arg == DNNL_ARG_DIFF_DST) &&
        !(prepared.y && op.arg == DNNL_ARG_DST) && !(prepared.weights && op.arg == DNNL_ARG_WEIGHTS))
      buffers.push_back(cpu::meta_workspace(int64_t(op.compute.get_size())));
  if (const size_t bytes = plan.scratchpad.get_size()) buffers.push_back(cpu::meta_workspace(int64_t(bytes)));
}

Tensor shared_weights(const std::vector<const ConvPlan*>& plans, const ConvArgs& a, bool meta) {
  auto weights_of = [](const ConvPlan& plan) -> const Operand& {
    for (const Operand& op : plan.operands)
      if (op.arg == DNNL_ARG_WEIGHTS) return op;
    FRUGAL_ASSERT(false, "shared_weights: a plan without weights");
    return plan.operands.front();
  };
  if (plans.size() < 2) return {};
  const Operand& first = weights_of(*plans.front());
  if (!first.reorder) return {};
  for (const ConvPlan* p : plans)
    if (weights_of(*p).compute != first.compute) return {};
  const int64_t bytes = int64_t(first.compute.get_size());
  if (meta) return cpu::meta_workspace(bytes);
  const detail::OneThreadProduct threads(conv_macs(a), one_thread_below(plans.front()->type));
  Tensor buffer = workspace(bytes);
  auto& eng = onednn_engine();
  dnnl::memory user(first.user, eng, const_cast<void*>(a.weight)),
      packed(first.compute, eng, buffer.raw_data());
  first.reorder->execute(cpu::onednn_stream(), user, packed);
  cpu::onednn_stream().wait();
  return buffer;
}

const dnnl::memory::desc& conv_plan_dst_desc(const ConvPlan& plan) {
  for (const Operand& op : plan.operands)
    if (op.arg == DNNL_ARG_DST) return op.compute;
  FRUGAL_ASSERT(false, "conv_plan_dst_desc: not a forward plan");
  return plan.operands.front().compute;
}

}  // namespace cpu
#endif  // FRUGAL_HAVE_ONEDNN

void set_conv_onednn_any_layout([[maybe_unused]] bool any) {
#ifdef FRUGAL_HAVE_ONEDNN
  cpu::g_any_layout.store(any, std::memory_order_relaxed);
#endif
}
void set_conv_onednn_winograd([[maybe_unused]] bool winograd) {
#ifdef FRUGAL_HAVE_ONEDNN
  cpu::g_winograd.store(winograd, std::memory_order_relaxed);
#endif
}
std::array<std::string, 3> conv2d_onednn_implementations([[maybe_unused]] const ConvArgs& a,
                                                         [[maybe_unused]] DType dtype) {
  std::array<std::string, 3> names;
#ifdef FRUGAL_HAVE_ONEDNN
  using DataType = dnnl::memory::data_type;
  const DataType type = dtype == DType::BF16 ? DataType::bf16 : DataType::f32;
  for (auto dir :
       {cpu::ConvDirection::Forward, cpu::ConvDirection::BackwardData, cpu::ConvDirection::BackwardWeight})
    if (const auto plan = cpu::conv_plan(a, dir, type)) names[size_t(dir)] = plan->implementation;
#endif
  return names;
}

}  // namespace frugal
