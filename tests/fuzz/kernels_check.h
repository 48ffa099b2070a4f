// The kernels fuzz target's machinery (tests/fuzz/kernels_target.cpp has the Note on what the target checks,
// the bound of an element, and how a program is read): operands in their memory layouts with values read
// from the program, the checks of a result against what it should hold, the naive references that several
// kinds of op share, and the ops' runners, each kind in its file (kernels_gemm.cpp, kernels_conv.cpp,
// kernels_rows.cpp). Not an API: only the kernels target includes it.
#pragma once

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "frugal.h"
#include "tests/fuzz/program.h"

namespace frugal::fuzz::kernels {

namespace F = nn::functional;

inline constexpr DType kFloating[] = {DType::F32, DType::F64, DType::BF16, DType::F16};

double unit_roundoff(DType t);
// A size: mostly small (0 .. small), sometimes up to large.
int64_t size_of(Program& p, int64_t lo, int64_t small, int64_t large);
std::string shape_str(const Shape& s);

// One operand: the view the op reads, its values (row-major over its shape), and the storage it views,
// whose bytes outside the view hold NaN.
struct Input {
  Tensor t, storage;
  std::vector<double> v;
  std::vector<int64_t> sizes;
  int layout = 0;
  double at(std::initializer_list<int64_t> idx) const {
    int64_t flat = 0;
    size_t d = 0;
    for (const int64_t i : idx) flat = flat * sizes[d++] + i;
    return v[size_t(flat)];
  }
};

int64_t numel_of(const std::vector<int64_t>& sizes);
// Row-major strides of sizes.
std::vector<int64_t> strides_of(const std::vector<int64_t>& sizes);
// Layouts: 0 contiguous, 1 the last two dims transposed in memory, 2 the last dim padded (1 to 3 elements)
// and read from an offset, 3 every other slice of dim 0.
Input make(Program& p, std::vector<int64_t> sizes, DType dtype, bool layouts = true);
// An element of t at `offset` elements from its first, as a double.
double element(const Tensor& t, int64_t offset);
// t's values row-major, read through its strides (no frugal kernel in between).
std::vector<double> read(const Tensor& t);

// What an output should hold: each element's value, the sum of the magnitudes of its terms and the
// magnitude of what is rounded last (the Note in kernels_target.cpp).
struct Want {
  std::vector<double> v, mag, rmag;
  explicit Want(int64_t n) : v(size_t(n)), mag(size_t(n)), rmag(size_t(n)) {}
  void set(int64_t i, double value, double magnitude) {
    v[size_t(i)] = value, mag[size_t(i)] = magnitude, rmag[size_t(i)] = std::fabs(value);
  }
};

// The sum of term(l) over l < n and the sum of their magnitudes: a GEMM-like element and its mag.
struct Sum {
  double sum = 0, mag = 0;
};
template <typename Term>
Sum sum_of(int64_t n, Term term) {
  Sum s;
  for (int64_t l = 0; l < n; ++l) {
    const double t = term(l);
    s.sum += t, s.mag += std::fabs(t);
  }
  return s;
}
// max_pool2d(., 2) of what [planes, oh, ow] should hold: each window's largest value, and the largest bounds
// of its elements.
Want pool2_of(const Want& in, int64_t planes, int64_t oh, int64_t ow);

// Throws std::logic_error unless got has `sizes`, `dtype` and every element within its bound of want.
// u_o: the unit roundoff of the last rounding (the output dtype's, or autocast's). normwise: every element's
// accumulation term takes the largest magnitude of the output's, not its own (a Winograd convolution's
// transforms mix the elements of a tile, so that an element whose terms are all 0 comes out as a rounding of
// its neighbours': Note [Winograd convolutions]).
void expect(const std::string& what, const Tensor& got, const std::vector<int64_t>& sizes, DType dtype,
            const Want& want, double len, double u_c, double u_o, bool normwise = false);
// The NaNs around a view must still be there after an op wrote into it.
void expect_padding_kept(const std::string& what, const Input& in);
std::string describe(const char* op, DType dtype, bool autocast, std::initializer_list<const Input*> ins);

// The seed of a backward: r of y's shape and dtype, contiguous; backward of sum(y * r) gives d y = r.
Input seed_for(Program& p, const Tensor& y);
void backward_with(const Tensor& y, const Input& r);

// 1 to 3 sizes, each mostly small.
std::vector<int64_t> sizes_1_to_3(Program& p);

// Layer norm over the last dim of x [rows, d] in f64 (w, b: empty for none): y, x-hat, 1 / sqrt(var + eps)
// per row, and per row how x-hat's rounding grows where the row is nearly constant (1 + max |x| rstd).
struct LayerNormRef {
  std::vector<double> y, xhat, rstd, scale;
};
LayerNormRef layer_norm_ref(const std::vector<double>& x, int64_t rows, int64_t d,
                            const std::vector<double>& w, const std::vector<double>& b, double eps);
// The bound's magnitude of y's element e (column j).
double layer_norm_mag(const LayerNormRef& r, int64_t e, int64_t d, const std::vector<double>& w,
                      const std::vector<double>& b);
// d x from g = d y * w (rows x d), with each element's magnitude.
Want layer_norm_dx(const LayerNormRef& r, const std::vector<double>& g, int64_t rows, int64_t d);

// GELU, exact (erf) or its tanh form, and its derivative, in f64.
double gelu(double x, bool tanh_form);
double gelu_grad(double x, bool tanh_form);

// The runners: each reads one op call's arguments from the program, runs it (and its backward where it has
// one) and checks every result; their comments say what each covers.
void run_matmul(Program& p);  // kernels_gemm.cpp
void run_linear(Program& p);
void run_fused_linear(Program& p);
void run_attention(Program& p);
void run_quant_linear(Program& p);
void run_conv(Program& p);  // kernels_conv.cpp
void run_pool(Program& p);
void run_batch_norm(Program& p);
void run_quant_conv(Program& p);
void run_reduce(Program& p);  // kernels_rows.cpp
void run_softmax(Program& p);
void run_layer_norm(Program& p);
void run_cross_entropy(Program& p);
void run_embedding(Program& p);
void run_unary(Program& p);
void run_binary(Program& p);
void run_copy(Program& p);

}  // namespace frugal::fuzz::kernels
