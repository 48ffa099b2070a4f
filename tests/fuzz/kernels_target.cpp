// The "kernels" fuzz target (tests/fuzz/targets.h), a differential one: the input is a little program of op
// calls with valid arguments, and each result is compared with a naive computation in f64 written here from
// the op's definition. The arguments are where the fast kernels have their special cases: shapes (a few
// rows, widths past a vector's, empty dims, 3x3 convolutions that oneDNN runs with Winograd), memory layouts
// (contiguous, transposed, a padded last dim at an offset, every other slice of dim 0), the four floating
// dtypes and bf16 autocast. Gradients are compared too (the backward of sum(y * r) for an r the program
// chooses). A result outside its error bound throws std::logic_error naming the op, its arguments and the
// element: a finding, where the "ops" target looks for crashes and undefined behaviour only.
//
// Element values are multiples of 1/4 in [-2, 2]: exact in every dtype, so that a GEMM or a convolution
// accumulated in f32 is exact whatever its order, and its only rounding is its output's. The bound of an
// element (expect()) is 8 (len + 2) u_c * mag + 2 u_o * rmag: u_c the unit roundoff of the compute type
// (f64's for f64, f32's otherwise), u_o the output's, mag the sum of the |terms| that make the element, len
// how many there are, rmag the magnitude of what is rounded last. A wrong element (a term missed, read from
// the wrong place, or from the padding, which holds NaN) is far outside it.
//
// The program, byte by byte (a missing byte reads as 0): up to kMaxSteps steps, each an op (mod the ops'
// count) and the bytes that op reads, in order, for its dtype, sizes, options and each operand's layout and
// values. Every byte is read in its own statement, so that the program means the same under every compiler.
//
// Here: the program's op dispatch and the seeds. tests/fuzz/kernels_check.h: operands, bounds, checks and the
// shared references; the ops' runners by kind in kernels_gemm.cpp, kernels_conv.cpp and kernels_rows.cpp.
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

#include "frugal.h"
#include "tests/fuzz/kernels_check.h"
#include "tests/fuzz/program.h"
#include "tests/fuzz/targets.h"

namespace frugal::fuzz {
namespace {

constexpr int kMaxSteps = 6;

}  // namespace

void run_kernels(const uint8_t* data, size_t size) {
  struct Limit {  // as the ops target's: a bound on what one program may take
    int64_t before = memory::memory_limit(kCPU);
    Limit() { memory::set_memory_limit(kCPU, int64_t(256) << 20); }
    ~Limit() { memory::set_memory_limit(kCPU, before); }
  } limit;
  Program p(data, size);
  for (int s = 0; s < kMaxSteps && !p.done(); ++s) {
    try {
      switch (p.in(0, 16)) {
        case 0:
          kernels::run_matmul(p);
          break;
        case 1:
          kernels::run_linear(p);
          break;
        case 2:
          kernels::run_conv(p);
          break;
        case 3:
          kernels::run_pool(p);
          break;
        case 4:
          kernels::run_reduce(p);
          break;
        case 5:
          kernels::run_softmax(p);
          break;
        case 6:
          kernels::run_layer_norm(p);
          break;
        case 7:
          kernels::run_binary(p);
          break;
        case 8:
          kernels::run_copy(p);
          break;
        case 9:
          kernels::run_fused_linear(p);
          break;
        case 10:
          kernels::run_cross_entropy(p);
          break;
        case 11:
          kernels::run_embedding(p);
          break;
        case 12:
          kernels::run_attention(p);
          break;
        case 13:
          kernels::run_batch_norm(p);
          break;
        case 14:
          kernels::run_unary(p);
          break;
        case 15:
          kernels::run_quant_linear(p);
          break;
        default:
          kernels::run_quant_conv(p);
          break;
      }
    } catch (const Error&) {
      // A combination frugal refuses (a dtype an op does not take on the CPU): not what this target checks.
    }
  }
}

// A few programs: each op with each dtype, from a fixed stream of bytes.
void seeds_kernels(const std::string& dir) {
  for (int op = 0; op < 17; ++op)
    for (int dt = 0; dt < 4; ++dt) {
      std::string b{char(op), char(dt)};
      for (int i = 0; i < 600; ++i) b += char((op * 31 + dt * 17 + i * 29 + (i * i) % 7) % 256);
      std::ofstream(std::filesystem::path(dir) / ("op" + std::to_string(op) + "-" + std::to_string(dt)),
                    std::ios::binary)
          << b;
    }
}

}  // namespace frugal::fuzz
