// The op table: one table per op, keyed by (device type, dtype), filled in by the kernel libraries when they
// load (kernels/cpu, kernels/cuda). A missing entry is an error naming op, device and dtype, never a
// fallback.
//
// This header holds the table itself and the elementwise ops' tables; every other family's argument structs
// and tables sit in its own core/op_table_<family>.h (reduce, linalg, softmax, index, conv, norm, attention,
// optim, sparse, copy), included only where that family is used.
//
// Adding an op (STYLE.md rule 1): an elementwise op is its line in core/op_list.h (Note [adding an
// elementwise op] there); another op is its own table in its family's header, its CPU kernel, its CUDA
// kernel, its public function in core/ops.h, its backward rule, its test.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "device.h"
#include "dtype.h"
#include "loop.h"
#include "op_list.h"

namespace frugal {

// Kernel signatures. Kernels never allocate and never know about autograd.
using ElementwiseKernel = void(const Loop& loop, const OpArgs& args);

[[noreturn]] void throw_missing_kernel(const char* op, Device device, DType dtype, const void* const* row);

namespace detail {
// The work a dry run stands for (Note [counted work in a dry run], core/estimate.cpp): every meta kernel an
// op fetches counts as one call, and the ops whose kernels multiply matrices (GEMMs, linear layers,
// convolutions, attention) add their FLOPs and the bytes of the operands they read when they run on the meta
// device.
void note_meta_kernel();
void note_meta_product(double flops, double operand_bytes);
inline void count_flops(Device device, double flops, double operand_bytes) {
  if (device.type == DeviceType::Meta) note_meta_product(flops, operand_bytes);
}
}  // namespace detail

// One device type's kernels of a table, one per dtype, with their type erased (any function pointer converts
// to void (*)() and back unchanged).
using ErasedKernelRow = std::array<void (*)(), kNumDTypes>;

// A table seen without its kernel type, for code that sweeps every table (the dtype-coverage test, the test
// suites' stand-in GPUs).
//   copy_row(table, from, to): device type `to` takes the kernel of every dtype that `from` has (none where
//                              `from` has none); returns `to`'s kernels from before, for set_row to restore.
struct OpTableRef {
  const char* name = nullptr;
  void* table = nullptr;
  bool (*has)(const void* table, Device device, DType dtype) = nullptr;
  ErasedKernelRow (*copy_row)(void* table, DeviceType from, DeviceType to) = nullptr;
  void (*set_row)(void* table, DeviceType device, const ErasedKernelRow& row) = nullptr;
};
// Every table that has had a kernel set so far (tables note themselves on their first set), by name.
std::vector<OpTableRef> op_tables();
void note_op_table(const OpTableRef& ref);

// The meta device's kernel of every table (Note [the meta device], core/device.h): no arithmetic. A table
// whose cpu kernel takes working memory from the arena (kernels/cpu/workspace.h) sets a meta kernel of its
// own that takes the same bytes, so that the dry run sees them too.
template <typename Fn>
struct MetaKernel;
template <typename... Args>
struct MetaKernel<void(Args...)> {
  static void run(Args...) {}
};

template <typename Fn>
class OpTable {
 public:
  explicit constexpr OpTable(const char* name) : name_(name) {}
  const char* name() const { return name_; }
  void set(DeviceType device, DType dtype, Fn* fn) {
    if (!noted_) {
      note_op_table(
          {name_, this,
           [](const void* t, Device d, DType dt) { return static_cast<const OpTable*>(t)->has(d, dt); },
           [](void* t, DeviceType from, DeviceType to) {
             OpTable& table = *static_cast<OpTable*>(t);
             const ErasedKernelRow old = table.erased_row(to);
             table.set_erased_row(to, table.erased_row(from));
             return old;
           },
           [](void* t, DeviceType d, const ErasedKernelRow& row) {
             static_cast<OpTable*>(t)->set_erased_row(d, row);
           }});
      noted_ = true;
    }
    table_[int(device)][int(dtype)] = fn;
    // Every dtype the cpu has a kernel for is one the meta device takes, unless a meta kernel was set.
    if (device == DeviceType::CPU && !table_[int(DeviceType::Meta)][int(dtype)])
      table_[int(DeviceType::Meta)][int(dtype)] = &MetaKernel<Fn>::run;
  }
  bool has(Device device, DType dtype) const { return table_[int(device.type)][int(dtype)] != nullptr; }
  Fn* get(Device device, DType dtype) const {
    Fn* fn = table_[int(device.type)][int(dtype)];
    if (device.type == DeviceType::Meta) detail::note_meta_kernel();
    if (!fn) [[unlikely]] {
      const void* row[kNumDTypes];
      for (int i = 0; i < kNumDTypes; ++i)
        row[i] = reinterpret_cast<const void*>(table_[int(device.type)][i]);
      throw_missing_kernel(name_, device, dtype, row);
    }
    return fn;
  }

 private:
  ErasedKernelRow erased_row(DeviceType device) const {
    ErasedKernelRow row;
    for (int i = 0; i < kNumDTypes; ++i) row[i] = reinterpret_cast<void (*)()>(table_[int(device)][i]);
    return row;
  }
  void set_erased_row(DeviceType device, const ErasedKernelRow& row) {
    for (int i = 0; i < kNumDTypes; ++i) table_[int(device)][i] = reinterpret_cast<Fn*>(row[i]);
  }

  const char* name_;
  bool noted_ = false;
  Fn* table_[kNumDeviceTypes][kNumDTypes] = {};
};

// The elementwise ops, from core/op_list.h: X(name, ...) for each, a table op_<name> each. The ops with
// parameters (FRUGAL_UNARY_PARAM_OP_LIST) read them from OpArgs a and b.
#define FRUGAL_UNARY_OPS(X) FRUGAL_UNARY_OP_LIST(X) FRUGAL_UNARY_PARAM_OP_LIST(X)
#define FRUGAL_BINARY_OPS(X) FRUGAL_BINARY_OP_LIST(X)
#define FRUGAL_COMPARE_OPS(X) FRUGAL_COMPARE_OP_LIST(X)

#define FRUGAL_DECLARE_TABLE(name, ...) extern OpTable<ElementwiseKernel> op_##name;
FRUGAL_UNARY_OPS(FRUGAL_DECLARE_TABLE)
FRUGAL_BINARY_OPS(FRUGAL_DECLARE_TABLE)
FRUGAL_COMPARE_OPS(FRUGAL_DECLARE_TABLE)
#undef FRUGAL_DECLARE_TABLE

extern OpTable<ElementwiseKernel> op_where;  // operands: out, cond (bool), a, b; keyed by a's dtype
extern OpTable<ElementwiseKernel> op_cast;  // operands: out, in; keyed by the OUTPUT dtype; args.a = in dtype
extern OpTable<ElementwiseKernel> op_fill;  // operands: out; args.a = the value
// add of an f32 and a 16-bit tensor (autocast's residual adds) without a cast first: operands out (f32), a
// (f32), b (f16/bf16, the table's key); out = a + f32(b), add's values bit for bit (the widening is exact).
extern OpTable<ElementwiseKernel> op_add_widened;

// GELU's gradient in one pass (autograd/grad_elementwise.cpp): operands out (dx), dy, x, all of x's dtype
// (the table's key), f16/bf16 computing in f32. With Phi and phi the standard normal CDF and density:
//   gelu_backward:      dx = dy (Phi(x) + x phi(x))
//   gelu_tanh_backward: dx = dy ((1 + t) / 2 + x (1 - t^2) k (1 + 3 c x^2) / 2),
//                       t = tanh(k (x + c x^3)), k = sqrt(2 / pi), c = 0.044715
extern OpTable<ElementwiseKernel> op_gelu_backward;
// ReLU's gradient from its output in one pass: operands out (dx), dy, y, all of y's dtype (the table's key);
// dx = y > 0 ? dy : 0, the values where(y > 0, dy, 0) selects (a NaN y gives 0).
extern OpTable<ElementwiseKernel> op_relu_backward;
extern OpTable<ElementwiseKernel> op_gelu_tanh_backward;
// GELU's output and gradient in one pass over x (gelu_linear's backward; Note [gelu_linear's backward in one
// pass over x] in autograd/grad_linear.cpp): operands dy (read, then overwritten with dx), y (written), x,
// all of x's dtype (the table's key); y = gelu(x) and dx = gelu_backward's, bit for bit, erf computed once.
extern OpTable<ElementwiseKernel> op_gelu_and_backward;

}  // namespace frugal