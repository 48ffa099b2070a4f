// Gradients by finite differences in f64 of the reductions (grad_reduce.cpp), matmul (grad_linalg.cpp) and
// softmax (grad_softmax.cpp), indexing and joining (grad_index.cpp), views and copies (grad_views.cpp) and
// the Tensor methods, on contiguous and non-contiguous leaves; composite models; and gradcheck's own
// failures.
#include "tests/autograd/gradcheck_helpers.h"

namespace frugal {
namespace {

using testing::expect_error;
using testing::expect_grads_match_f64;
using testing::expect_grads_ok;
using testing::GradFn;
using testing::grads_of;
using testing::kLayouts;
using testing::Layout;
using testing::layout_name;
using testing::leaf;
using testing::signed_leaf;
using testing::tol_for;
using testing::uniform;

using Reduce = std::function<Tensor(const Tensor&, const Shape&, bool)>;

TEST(GradcheckReduce, EveryOpDimsKeepdimAndLayout) {
  const std::pair<const char*, Reduce> ops[] = {
      {"sum", [](const Tensor& x, const Shape& d, bool k) { return sum(x, d, k); }},
      {"mean", [](const Tensor& x, const Shape& d, bool k) { return mean(x, d, k); }},
      // Random values: no ties, and the gap to the runner-up is far above eps.
      {"max", [](const Tensor& x, const Shape& d, bool k) { return max(x, d, k); }},
      {"min", [](const Tensor& x, const Shape& d, bool k) { return min(x, d, k); }},
      {"var(c=0)", [](const Tensor& x, const Shape& d, bool k) { return var(x, d, 0, k); }},
      {"var(c=1)", [](const Tensor& x, const Shape& d, bool k) { return var(x, d, 1, k); }},
  };
  const Shape dim_sets[] = {{}, {0}, {1}, {2}, {-1}, {0, 2}, {-3, 1}, {0, 1, 2}};
  for (const auto& op : ops)  // not a structured binding: clang before 16 cannot capture one in a lambda
    for (const Shape& dims : dim_sets)
      for (bool keepdim : {false, true})
        for (Layout layout : kLayouts) {
          const Tensor x = leaf({2, 3, 4}, -2, 2, 101, layout);
          expect_grads_ok([&](const std::vector<Tensor>& in) { return op.second(in[0], dims, keepdim); }, {x},
                          std::string(op.first) + " dims " + dims.str() + (keepdim ? " keepdim " : " ") +
                              layout_name(layout));
        }
}

TEST(GradcheckReduce, ZeroDimAndOneDimInputs) {
  const Tensor s = leaf({}, -2, 2, 102);
  const Tensor v = leaf({5}, -2, 2, 103, Layout::Strided);
  for (const Tensor& x : {s, v}) {
    const std::string what = x.shape().str();
    expect_grads_ok([](const std::vector<Tensor>& in) { return sum(in[0]); }, {x}, "sum " + what);
    expect_grads_ok([](const std::vector<Tensor>& in) { return mean(in[0]); }, {x}, "mean " + what);
    expect_grads_ok([](const std::vector<Tensor>& in) { return max(in[0]); }, {x}, "max " + what);
    expect_grads_ok([](const std::vector<Tensor>& in) { return min(in[0], {}, true); }, {x}, "min " + what);
  }
  expect_grads_ok([](const std::vector<Tensor>& in) { return var(in[0]); }, {v}, "var [5]");
}

// max / min send the gradient to the elements equal to the result, split evenly among ties (like
// torch.amax / amin; torch.max(x, dim) would send all of it to the one index it returns).
TEST(GradcheckReduce, MaxMinTiesSplitEvenly) {
  Tensor x = tensor<double>({3, 3, 1, 0, 2, 2, 2, 5}, {2, 4}).requires_grad_();
  sum(max(x, {1})).backward();
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{0.5, 0.5, 0, 0, 0, 0, 0, 1}));
  x.zero_grad();
  sum(min(x, {1}, true)).backward();
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{0, 0, 0, 1, 1. / 3, 1. / 3, 1. / 3, 0}));
  x.zero_grad();
  max(x).backward();
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{0, 0, 0, 0, 0, 0, 0, 1}));
  // Two tied maxima: the central difference measures 1/2 for each, so gradcheck passes only with the split.
  const Tensor y = tensor<double>({1, 4, 4, -1, 0, 2}, {2, 3}).requires_grad_();
  expect_grads_ok([](const std::vector<Tensor>& in) { return max(in[0], {1}); }, {y}, "max with a tie");
  expect_grads_ok([](const std::vector<Tensor>& in) { return max(in[0]); }, {y}, "max of all with a tie");
}

// max / min along a dim with indices: f64 finite differences on random values (no ties), every dim,
// keepdim and layout; with ties, all of the gradient goes to the index returned (PyTorch's max(x, dim)).
TEST(GradcheckReduce, MaxMinAlongADimWithIndices) {
  for (int d = -1; d < 3; ++d)
    for (bool keepdim : {false, true})
      for (Layout layout : kLayouts) {
        const Tensor x = leaf({2, 3, 4}, -2, 2, 104, layout);
        const std::string what =
            "dim " + std::to_string(d) + (keepdim ? " keepdim " : " ") + layout_name(layout);
        expect_grads_ok([&](const std::vector<Tensor>& in) { return max(in[0], d, keepdim).values; }, {x},
                        "max " + what);
        expect_grads_ok([&](const std::vector<Tensor>& in) { return min(in[0], d, keepdim).values; }, {x},
                        "min " + what);
      }
  expect_grads_ok([](const std::vector<Tensor>& in) { return max(in[0], 0).values; }, {leaf({}, -2, 2, 105)},
                  "max of a 0-d tensor");
  Tensor x = tensor<double>({3, 3, 1, 0, 2, 2, 2, 5}, {2, 4}).requires_grad_();
  auto [values, indices] = max(x, 1);
  EXPECT_EQ(indices.to_vector<int64_t>(), (std::vector<int64_t>{0, 3}));
  EXPECT_FALSE(indices.requires_grad());
  sum(mul(values, tensor<double>({10, 20}))).backward();
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{10, 0, 0, 0, 0, 0, 0, 20}));
  x.zero_grad();
  sum(min(x, 1, true).values).backward();
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{0, 0, 0, 1, 1, 0, 0, 0}));
  EXPECT_STREQ(min(x, 0).values.grad_fn_name(), "min");
}

TEST(GradcheckMatmul, EveryShapeRuleEveryLayout) {
  const std::pair<Shape, Shape> shapes[] = {
      {{4}, {4}},                 // dot product: a 0-d result
      {{3, 4}, {4}},              // matrix-vector
      {{4}, {4, 2}},              // vector-matrix
      {{3, 4}, {4, 2}},           // matrix-matrix
      {{2, 3, 4}, {2, 4, 2}},     // batched
      {{2, 1, 3, 4}, {5, 4, 2}},  // batch dims broadcast both ways
      {{3, 4}, {2, 4, 5}},        // a matrix against a batch
      {{2, 3, 4}, {4, 2}},        // a batch against a matrix
      {{4}, {2, 4, 3}},           // a vector against a batch
      {{2, 3, 4}, {4}},           // a batch against a vector
      {{1, 3, 4}, {2, 1, 4, 2}},  // size-1 batch dims on both sides
  };
  for (const auto& [sa, sb] : shapes)
    for (Layout layout : kLayouts) {
      const std::string what = "matmul " + sa.str() + " @ " + sb.str() + " " + layout_name(layout);
      const Tensor a = leaf(sa, -1, 1, 111, layout);
      const Tensor b = leaf(sb, -1, 1, 112, layout);
      const GradFn fn = [](const std::vector<Tensor>& in) { return matmul(in[0], in[1]); };
      expect_grads_ok(fn, {a, b}, what);
      const std::vector<Tensor> g = grads_of(fn, {a, b});
      EXPECT_EQ(g[0].shape(), sa) << what;
      EXPECT_EQ(g[1].shape(), sb) << what;
    }
}

TEST(GradcheckSoftmax, EveryDimEveryLayout) {
  for (int64_t dim : {0, 1, 2, -1, -3})
    for (Layout layout : kLayouts) {
      const Tensor x = leaf({2, 3, 4}, -3, 3, 121, layout);
      const std::string what = "dim " + std::to_string(dim) + " " + layout_name(layout);
      expect_grads_ok([&](const std::vector<Tensor>& in) { return softmax(in[0], dim); }, {x},
                      "softmax " + what);
      expect_grads_ok([&](const std::vector<Tensor>& in) { return log_softmax(in[0], dim); }, {x},
                      "log_softmax " + what);
    }
  const Tensor v = leaf({6}, -3, 3, 122, Layout::Strided);
  expect_grads_ok([](const std::vector<Tensor>& in) { return softmax(in[0], 0); }, {v}, "softmax 1-d");
  expect_grads_ok([](const std::vector<Tensor>& in) { return log_softmax(in[0], -1); }, {v},
                  "log_softmax 1-d");
}

// Along the last dim of contiguous tensors the backward is one kernel (op_softmax_backward): it allocates the
// input's gradient and nothing of that size besides (the ops' formula made two temporaries as large), and
// gives that formula's result.
TEST(SoftmaxBackward, FusedAllocatesOnlyTheGradientAndMatchesTheFormula) {
  for (bool log : {false, true}) {
    const Tensor x = testing::uniform({64, 256}, -3, 3, DType::F32, 131).requires_grad_();
    const Tensor g = testing::uniform({64, 256}, -1, 1, DType::F32, 132);
    Tensor y = log ? log_softmax(x, -1) : softmax(x, -1);
    const Tensor yd = y.detach();
    const Tensor want =
        log ? sub(g, mul(exp(yd), sum(g, {1}, true))) : mul(yd, sub(g, sum(mul(g, yd), {1}, true)));
    const int64_t before = memory::stats().allocated.current;
    memory::reset_peak();
    y.backward(g);
    const int64_t bytes = 64 * 256 * 4;
    EXPECT_LE(memory::stats().allocated.peak - before, bytes + 4096) << (log ? "log_softmax" : "softmax");
    testing::expect_close(x.grad(), want.to_vector<double>(), {1e-6, 1e-6}, log ? "log_softmax" : "softmax");
  }
}

TEST(GradcheckIndex, IndexSelectRepeatedAndNegativeIndices) {
  struct Case {
    Shape x;
    int64_t dim;
    Tensor index;
  };
  const Case cases[] = {
      {{4, 5}, 0, tensor<int64_t>({2, 0, -1, 2})},  {{4, 5}, 1, tensor<int64_t>({4, 4, 0})},
      {{4, 5}, -1, tensor<int32_t>({-5, 1, 1, 1})}, {{2, 3, 4}, 1, tensor<int64_t>({2, -3, 2, 1, 0})},
      {{6}, 0, tensor<int64_t>({5, 0, 5, -6})},
  };
  for (const Case& c : cases)
    for (Layout layout : kLayouts) {
      const std::string what =
          "index_select " + c.x.str() + " dim " + std::to_string(c.dim) + " " + layout_name(layout);
      const Tensor x = leaf(c.x, -2, 2, 131, layout);
      expect_grads_ok([&](const std::vector<Tensor>& in) { return index_select(in[0], c.dim, c.index); }, {x},
                      what);
      EXPECT_EQ(
          grads_of([&](const std::vector<Tensor>& in) { return index_select(in[0], c.dim, c.index); }, {x})[0]
              .shape(),
          c.x)
          << what;
    }
  // A repeated index accumulates: element 2 of dim 0 is picked twice.
  Tensor x = leaf({4, 2}, -2, 2, 132);
  sum(index_select(x, 0, tensor<int64_t>({2, 0, -2}))).backward();
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{1, 1, 0, 0, 2, 2, 0, 0}));
}

TEST(GradcheckIndex, GatherEveryDimWithAnIndexSmallerThanX) {
  Generator gen(133);
  for (int d = 0; d < 3; ++d)
    for (Layout layout : kLayouts) {
      const Tensor x = leaf({3, 4, 2}, -2, 2, 134, layout);
      Shape is = x.shape();
      is[d] = 5;             // more picks than x has along dim: repeats
      is[(d + 1) % 3] -= 1;  // smaller than x elsewhere
      const Tensor index = randint(-x.shape()[d], x.shape()[d], is, DType::I64, &gen);
      const std::string what = "gather dim " + std::to_string(d) + " " + layout_name(layout);
      expect_grads_ok([&](const std::vector<Tensor>& in) { return gather(in[0], d, index); }, {x}, what);
      EXPECT_EQ(
          grads_of([&](const std::vector<Tensor>& in) { return gather(in[0], d, index); }, {x})[0].shape(),
          x.shape())
          << what;
    }
}

TEST(GradcheckIndex, ScatterAddGradientsForXAndSrc) {
  struct Case {
    Shape x, src;
    int64_t dim;
    Tensor index;
  };
  const Case cases[] = {
      {{3, 5}, {3, 4}, 1, tensor<int64_t>({0, 0, 4, -1, 1, 2, 2, 2, 3, 3, 0, 1}, {3, 4})},
      // src larger than the index: only the index's part of src is used, the rest gets a zero gradient.
      {{2, 3}, {2, 3}, 0, tensor<int64_t>({1, 0, 1}, {1, 3})},
      {{4, 3}, {3, 4}, -2, tensor<int64_t>({3, 0, 3, 1, 1, 2}, {2, 3})},
  };
  for (const Case& c : cases)
    for (Layout layout : kLayouts) {
      const std::string what =
          "scatter_add " + c.x.str() + " dim " + std::to_string(c.dim) + " " + layout_name(layout);
      const Tensor x = leaf(c.x, -2, 2, 141, layout);
      const Tensor src = leaf(c.src, -2, 2, 142, layout);
      const GradFn fn = [&](const std::vector<Tensor>& in) {
        return mul(scatter_add(in[0], c.dim, c.index, in[1]), in[0]);  // x twice: the paths add
      };
      expect_grads_ok(fn, {x, src}, what);
      const std::vector<Tensor> g = grads_of(fn, {x, src});
      EXPECT_EQ(g[0].shape(), c.x) << what;
      EXPECT_EQ(g[1].shape(), c.src) << what;
    }
}

TEST(GradcheckIndex, CatOfDifferentSizesAndStack) {
  for (Layout layout : kLayouts) {
    const std::string l = layout_name(layout);
    const Tensor a = leaf({2, 3}, -2, 2, 151, layout), b = leaf({4, 3}, -2, 2, 152, layout);
    const Tensor c = leaf({1, 3}, -2, 2, 153, layout);
    expect_grads_ok([](const std::vector<Tensor>& in) { return cat(in, 0); }, {a, b, c}, "cat dim 0 " + l);
    const Tensor d = leaf({3, 2}, -2, 2, 154, layout), e = leaf({3, 4}, -2, 2, 155, layout);
    const Tensor f = leaf({3, 1}, -2, 2, 156, layout);
    expect_grads_ok([](const std::vector<Tensor>& in) { return cat(in, -1); }, {d, e, f}, "cat dim -1 " + l);
    const Tensor g = leaf({2, 2, 3}, -2, 2, 157, layout), h = leaf({2, 1, 3}, -2, 2, 158, layout);
    expect_grads_ok([](const std::vector<Tensor>& in) { return cat(in, 1); }, {g, h}, "cat dim 1 " + l);
    // One input outside the graph: the others still get theirs, of their own shapes.
    expect_grads_ok([](const std::vector<Tensor>& in) { return cat(in, 0); }, {a, b.detach(), c},
                    "cat mixed " + l);
    const std::vector<Tensor> grads =
        grads_of([](const std::vector<Tensor>& in) { return cat(in, 0); }, {a, b, c});
    EXPECT_EQ(grads[0].shape(), a.shape());
    EXPECT_EQ(grads[1].shape(), b.shape());
    EXPECT_EQ(grads[2].shape(), c.shape());

    const Tensor p = leaf({3, 4}, -2, 2, 159, layout), q = leaf({3, 4}, -2, 2, 160, layout);
    const Tensor r = leaf({3, 4}, -2, 2, 161, layout);
    for (int64_t dim : {0, 1, 2, -1})
      expect_grads_ok([&](const std::vector<Tensor>& in) { return stack(in, dim); }, {p, q, r},
                      "stack dim " + std::to_string(dim) + " " + l);
  }
}

// A view and the leaf shape it applies to; every one is checked on every layout.
struct ViewCase {
  const char* name;
  Shape shape;
  std::function<Tensor(const Tensor&)> f;
};

TEST(GradcheckViews, EveryViewEveryLayout) {
  const ViewCase cases[] = {
      {"view split last",
       {3, 4},
       [](const Tensor& x) {
         return view(x, {3, 2, 2});
       }},
      {"view new dim",
       {3, 4},
       [](const Tensor& x) {
         return x.view({3, 1, 4});
       }},
      {"reshape",
       {3, 4},
       [](const Tensor& x) {
         return reshape(x, {2, 6});
       }},
      {"reshape -1", {2, 3, 2}, [](const Tensor& x) { return x.reshape({-1}); }},
      {"flatten", {2, 3, 2}, [](const Tensor& x) { return flatten(x); }},
      {"flatten 1", {2, 3, 2}, [](const Tensor& x) { return x.flatten(1); }},
      {"flatten 0..1", {2, 3, 2}, [](const Tensor& x) { return flatten(x, 0, 1); }},
      {"transpose", {2, 3, 4}, [](const Tensor& x) { return transpose(x, 0, 1); }},
      {"transpose -1 0", {2, 3, 4}, [](const Tensor& x) { return x.transpose(-1, 0); }},
      {"permute",
       {2, 3, 4},
       [](const Tensor& x) {
         return permute(x, {2, 0, 1});
       }},
      {"permute negative",
       {2, 3, 4},
       [](const Tensor& x) {
         return x.permute({-2, -1, 0});
       }},
      {"narrow", {4, 5}, [](const Tensor& x) { return narrow(x, 1, 1, 3); }},
      {"narrow negative start", {4, 5}, [](const Tensor& x) { return x.narrow(-2, -3, 2); }},
      {"slice step 2", {4, 5}, [](const Tensor& x) { return slice(x, 1, 0, 5, 2); }},
      {"slice step 3", {7, 3}, [](const Tensor& x) { return x.slice(0, 1, 7, 3); }},
      {"slice negative", {4, 5}, [](const Tensor& x) { return x.slice(-1, -4, -1); }},
      {"select", {3, 4}, [](const Tensor& x) { return select(x, 0, 1); }},
      {"select negative", {2, 3, 4}, [](const Tensor& x) { return x.select(-1, -1); }},
      {"expand",
       {3, 1},
       [](const Tensor& x) {
         return expand(x, {3, 4});
       }},
      {"expand leading",
       {4},
       [](const Tensor& x) {
         return x.expand({2, 3, 4});
       }},
      {"expand -1",
       {2, 1, 3},
       [](const Tensor& x) {
         return x.expand({2, 2, 4, -1});
       }},
      {"expand_as",
       {1, 4},
       [](const Tensor& x) {
         return x.expand_as(zeros({3, 4}));
       }},
      {"squeeze", {3, 1, 4}, [](const Tensor& x) { return squeeze(x); }},
      {"squeeze dim", {3, 1, 4}, [](const Tensor& x) { return x.squeeze(-2); }},
      {"unsqueeze 0", {3, 4}, [](const Tensor& x) { return unsqueeze(x, 0); }},
      {"unsqueeze -1", {3, 4}, [](const Tensor& x) { return x.unsqueeze(-1); }},
      {"contiguous", {3, 4}, [](const Tensor& x) { return contiguous(x); }},
      {"clone", {3, 4}, [](const Tensor& x) { return clone(x); }},
      {"x.t()", {3, 4}, [](const Tensor& x) { return x.t(); }},
      {"chain",
       {4, 6},
       [](const Tensor& x) {
         return x.t().slice(0, 1, 6, 2).unsqueeze(0).expand({2, 3, 4}).select(2, -2);
       }},
  };
  for (const ViewCase& c : cases)
    for (Layout layout : kLayouts) {
      const std::string what = std::string(c.name) + " " + layout_name(layout);
      const Tensor x = leaf(c.shape, -2, 2, 171, layout);
      const GradFn fn = [&](const std::vector<Tensor>& in) { return c.f(in[0]); };
      expect_grads_ok(fn, {x}, what);
      // The same view inside a computation (the gradient flowing into the view is not all ones).
      expect_grads_ok([&](const std::vector<Tensor>& in) { return exp(c.f(in[0])) * c.f(in[0]); }, {x},
                      what + " in a product");
      EXPECT_EQ(grads_of(fn, {x})[0].shape(), c.shape) << what;
    }
}

// reshape is a view when the strides allow and a copy otherwise; both have the same gradient.
TEST(GradcheckViews, ReshapeAsViewAndAsCopy) {
  const Tensor x = leaf({3, 4}, -2, 2, 181);
  const Tensor xt = leaf({3, 4}, -2, 2, 182, Layout::Transposed);
  ASSERT_EQ(reshape(x, {12}).storage(), x.storage());    // a view
  ASSERT_NE(reshape(xt, {12}).storage(), xt.storage());  // a copy
  for (const Tensor& t : {x, xt})
    expect_grads_ok(
        [](const std::vector<Tensor>& in) {
          return reshape(in[0], {2, 6}) * 3.0;
        },
        {t}, "reshape " + std::string(t.is_contiguous() ? "view" : "copy"));
}

// squeeze of a dim that is not 1, and transpose of a dim with itself, leave the shape as it is.
TEST(GradcheckViews, NoOpViews) {
  for (Layout layout : kLayouts) {
    const Tensor x = leaf({3, 4}, -2, 2, 183, layout);
    expect_grads_ok([](const std::vector<Tensor>& in) { return squeeze(in[0], 1) * 2.0; }, {x}, "squeeze(1)");
    expect_grads_ok([](const std::vector<Tensor>& in) { return squeeze(in[0]) * 2.0; }, {x}, "squeeze()");
    expect_grads_ok([](const std::vector<Tensor>& in) { return transpose(in[0], 1, 1) * 2.0; }, {x},
                    "transpose(1, 1)");
    expect_grads_ok(
        [](const std::vector<Tensor>& in) {
          return permute(in[0], {0, 1}) * 2.0;
        },
        {x}, "permute identity");
  }
  const Tensor s = leaf({}, -2, 2, 184);
  expect_grads_ok([](const std::vector<Tensor>& in) { return squeeze(in[0], 0) * 2.0; }, {s}, "squeeze 0-d");
  expect_grads_ok([](const std::vector<Tensor>& in) { return unsqueeze(in[0], 0) * 2.0; }, {s},
                  "unsqueeze 0-d");
  expect_grads_ok([](const std::vector<Tensor>& in) { return flatten(in[0]) * 2.0; }, {s}, "flatten 0-d");
}

TEST(GradcheckMethods, TensorMethodsRecord) {
  for (Layout layout : kLayouts) {
    const std::string l = layout_name(layout);
    const Tensor x = leaf({3, 4}, -2, 2, 191, layout), w = leaf({4, 2}, -2, 2, 192, layout);
    expect_grads_ok([](const std::vector<Tensor>& in) { return in[0].t() * in[0].t(); }, {x}, "t() " + l);
    expect_grads_ok([](const std::vector<Tensor>& in) { return in[0].sum() * in[0].mean(); }, {x},
                    "sum() mean() " + l);
    expect_grads_ok(
        [](const std::vector<Tensor>& in) { return in[0].mean({1}) * in[0].sum({0}, true).sum(); }, {x},
        "mean({1}) sum({0}, true) " + l);
    expect_grads_ok([](const std::vector<Tensor>& in) { return in[0].matmul(in[1]); }, {x, w}, "matmul " + l);
    expect_grads_ok([](const std::vector<Tensor>& in) { return -in[0].contiguous().clone(); }, {x},
                    "-contiguous().clone() " + l);
  }
  // t() of a 1-D tensor is the tensor itself.
  const Tensor v = leaf({4}, -2, 2, 193);
  EXPECT_TRUE(v.t().is_same(v));
}

// A two-layer MLP's loss (cross-entropy through log_softmax and gather), checked over every parameter.
TEST(GradcheckComposite, MlpLoss) {
  const Tensor x = uniform({4, 3}, -1, 1, DType::F64, 201);
  const Tensor targets = tensor<int64_t>({2, 0, 1, 2}, {4, 1});
  const Tensor w1 = leaf({3, 5}, -1, 1, 202), b1 = leaf({5}, -0.5, 0.5, 203);
  const Tensor w2 = leaf({5, 3}, -1, 1, 204, Layout::Transposed), b2 = leaf({3}, -0.5, 0.5, 205);
  const GradFn loss = [&](const std::vector<Tensor>& p) {
    const Tensor h = relu(matmul(x, p[0]) + p[1]);
    const Tensor logits = matmul(h, p[2]) + p[3];
    return -mean(gather(log_softmax(logits, -1), 1, targets));
  };
  // No pre-activation within eps of relu's kink.
  const Tensor pre = matmul(x, w1.detach()) + b1.detach();
  EXPECT_GT(min(abs(pre)).item<double>(), 1e-4);
  expect_grads_ok(loss, {w1, b1, w2, b2}, "mlp");
  expect_grads_ok(loss, {w1.detach(), b1, w2.detach(), b2}, "mlp (biases only)");
}

// Layer norm and attention written from primitives: many rules in one function.
TEST(GradcheckComposite, LayerNormAndAttention) {
  const Tensor x = leaf({2, 3, 4}, -2, 2, 211);
  const Tensor gamma = leaf({4}, 0.5, 1.5, 212), beta = leaf({4}, -0.5, 0.5, 213);
  expect_grads_ok(
      [](const std::vector<Tensor>& in) {
        const Tensor centred = in[0] - mean(in[0], {-1}, true);
        return centred * rsqrt(var(in[0], {-1}, 0, true) + 1e-5) * in[1] + in[2];
      },
      {x, gamma, beta}, "layer norm");

  const Tensor q = leaf({2, 3, 4}, -1, 1, 214), k = leaf({2, 3, 4}, -1, 1, 215, Layout::Transposed);
  const Tensor v = leaf({2, 3, 4}, -1, 1, 216, Layout::Strided);
  expect_grads_ok(
      [](const std::vector<Tensor>& in) {
        const Tensor scores = matmul(in[0], in[1].transpose(-2, -1)) / std::sqrt(4.0);
        return matmul(softmax(scores, -1), in[2]);
      },
      {q, k, v}, "attention");
}

// Gradients of f32 and bf16 leaves for these families: their own dtype and shape, and the f64 values within
// the dtype's tolerance (bf16 allowed twice tol_for's: a few roundings in a row).
TEST(GradcheckDTypes, LowPrecisionGradientsMatchF64) {
  struct Case {
    const char* name;
    GradFn f;
    std::vector<Tensor> inputs;
  };
  const Case cases[] = {
      {"sum dims",
       [](const std::vector<Tensor>& in) {
         return sum(in[0], {0, 2});
       },
       {leaf({2, 3, 4}, -1, 1, 221)}},
      {"mean",
       [](const std::vector<Tensor>& in) { return mean(in[0], {-1}, true); },
       {leaf({3, 4}, -1, 1, 222)}},
      {"max", [](const std::vector<Tensor>& in) { return max(in[0], {1}); }, {leaf({3, 4}, -1, 1, 223)}},
      {"var", [](const std::vector<Tensor>& in) { return var(in[0], {1}); }, {leaf({3, 4}, -1, 1, 224)}},
      {"matmul",
       [](const std::vector<Tensor>& in) { return matmul(in[0], in[1]); },
       {leaf({2, 3, 4}, -1, 1, 225), leaf({4, 2}, -1, 1, 226)}},
      {"softmax",
       [](const std::vector<Tensor>& in) { return softmax(in[0], -1); },
       {leaf({3, 4}, -2, 2, 227)}},
      {"log_softmax",
       [](const std::vector<Tensor>& in) { return log_softmax(in[0], 0); },
       {leaf({3, 4}, -2, 2, 228)}},
      {"index_select",
       [](const std::vector<Tensor>& in) {
         return index_select(in[0], 0, tensor<int64_t>({1, 1, 0}));
       },
       {leaf({3, 4}, -1, 1, 229)}},
      {"gather",
       [](const std::vector<Tensor>& in) {
         return gather(in[0], 1, tensor<int64_t>({0, 0, 3}, {1, 3}));
       },
       {leaf({3, 4}, -1, 1, 230)}},
      {"scatter_add",
       [](const std::vector<Tensor>& in) {
         return scatter_add(in[0], 1, tensor<int64_t>({1, 1, 0, 3, 0, 3}, {2, 3}), in[1]);
       },
       {leaf({2, 4}, -1, 1, 231), leaf({2, 3}, -1, 1, 232)}},
      {"cat",
       [](const std::vector<Tensor>& in) { return cat(in, 1); },
       {leaf({3, 2}, -1, 1, 233), leaf({3, 1}, -1, 1, 234)}},
      {"views",
       [](const std::vector<Tensor>& in) {
         return in[0].t().slice(0, 0, 4, 2).unsqueeze(0).expand({2, 2, 3});
       },
       {leaf({3, 4}, -1, 1, 235)}},
  };
  for (const Case& c : cases) {
    expect_grads_match_f64(c.f, c.inputs, DType::F32, tol_for(DType::F32), c.name);
    const testing::Tol bf16 = tol_for(DType::BF16);
    expect_grads_match_f64(c.f, c.inputs, DType::BF16, {2 * bf16.atol, 2 * bf16.rtol}, c.name);
  }
}

// A custom op whose rule is wrong: exp's forward with the identity as its gradient.
Tensor bad_exp(const Tensor& x) {
  Tensor y = ops::exp(x);
  autograd::Node& n = autograd::record("bad_exp", {&x}, y);
  n.backward = [](const autograd::Grads&, const Tensor& g) -> autograd::Grads { return {g}; };
  return y;
}

TEST(GradcheckItself, FailsOnAWrongRuleAndSaysWhere) {
  const Tensor x = leaf({3, 4}, -1, 1, 241);
  const autograd::GradcheckResult r =
      autograd::gradcheck([](const std::vector<Tensor>& in) { return bad_exp(in[0]); }, {x});
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.input, 0);
  EXPECT_GE(r.element, 0);
  EXPECT_LT(r.element, 12);
  // The numerical value is exp(x) v, the analytical one v: they differ by (exp(x) - 1) v.
  EXPECT_NEAR(r.numerical, std::exp(x.to_vector<double>()[size_t(r.element)]) * r.analytical, 1e-6);
  EXPECT_GT(r.worst_error, 1e-3);
  for (const char* part : {"FAILED", "input 0", "element", "analytical", "numerical"})
    EXPECT_NE(r.message.find(part), std::string::npos) << r.message;
  // The inputs are left as they were: values and (absent) gradient.
  EXPECT_EQ(x.to_vector<double>(), leaf({3, 4}, -1, 1, 241).to_vector<double>());
  EXPECT_FALSE(x.grad().defined());
}

TEST(GradcheckItself, NamesTheInputWithTheWrongGradient) {
  // mul whose rule is right for a and wrong (missing a factor of a) for b.
  const GradFn bad_mul = [](const std::vector<Tensor>& in) {
    Tensor y = ops::mul(in[0], in[1]);
    autograd::Node& n = autograd::record("bad_mul", {&in[0], &in[1]}, y);
    n.save(in[1]);
    n.backward = [](const autograd::Grads& s, const Tensor& g) -> autograd::Grads {
      return {mul(g, s[0]), g};
    };
    return y;
  };
  const Tensor a = leaf({2, 3}, 1.5, 2, 242), b = leaf({2, 3}, -1, 1, 243);
  const autograd::GradcheckResult r = autograd::gradcheck(bad_mul, {a, b});
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.input, 1) << r.message;
  EXPECT_NE(r.message.find("input 1"), std::string::npos) << r.message;
  // Checking a alone passes: the wrong rule for b is never compared.
  EXPECT_TRUE(autograd::gradcheck(bad_mul, {a, b.detach()}).ok);
}

TEST(GradcheckItself, CatchesSmallErrorsAndNan) {
  const Tensor x = leaf({4}, 0.5, 1, 244);
  // A rule off by 0.1%: far above the default tolerance.
  const GradFn scaled = [](const std::vector<Tensor>& in) {
    Tensor y = ops::mul(in[0], 2.0);
    autograd::record("scaled", {&in[0]}, y).backward =
        [](const autograd::Grads&, const Tensor& g) -> autograd::Grads { return {mul(g, 2.002)}; };
    return y;
  };
  EXPECT_FALSE(autograd::gradcheck(scaled, {x}).ok);
  // A function that is nan where checked fails rather than passing vacuously.
  EXPECT_FALSE(autograd::gradcheck([](const std::vector<Tensor>& in) { return log(in[0] - 2.0); }, {x}).ok);
  // Looser tolerances accept the 0.1% error.
  autograd::GradcheckOptions loose;
  loose.rtol = 1e-2;
  EXPECT_TRUE(autograd::gradcheck(scaled, {x}, loose).ok);
}

TEST(GradcheckItself, RejectsInputsItCannotCheck) {
  const Tensor f32 = uniform({3}, -1, 1, DType::F32, 245).requires_grad_();
  expect_error<DTypeError>(
      [&] { autograd::gradcheck([](const std::vector<Tensor>& in) { return exp(in[0]); }, {f32}); },
      {"gradcheck", "input 0", "f64", "f32"});
  const Tensor x = leaf({3}, -1, 1, 246);
  const Tensor not_leaf = exp(x);
  expect_error<Error>(
      [&] { autograd::gradcheck([](const std::vector<Tensor>& in) { return in[0]; }, {not_leaf}); },
      {"gradcheck", "leaf", "exp"});
  expect_error<Error>(
      [&] { autograd::gradcheck([](const std::vector<Tensor>&) { return ones({2}, DType::F64); }, {x}); },
      {"gradcheck", "does not require grad"});
  // An f32 input that does not require grad is a constant, not checked: no error.
  EXPECT_TRUE(autograd::gradcheck([](const std::vector<Tensor>& in) { return in[0] * in[1].to(DType::F64); },
                                  {x, uniform({3}, -1, 1, DType::F32, 247)})
                  .ok);
}

}  // namespace
}  // namespace frugal
