// Must NOT compile (Note [forward by value], nn/module.h): a module whose forward takes its tensor by value
// hides Module::forward. The ctests nn_forward_by_value_{holder,register,push_back} compile one case each and
// pass when the compiler refuses it with the message saying what to write.
#include "nn/containers.h"
#include "nn/layers.h"

namespace {
using frugal::Tensor;
namespace nn = frugal::nn;

struct NetImpl : nn::Module {
  Tensor forward(Tensor x) { return x; }
};

#if FRUGAL_CASE == 1
FRUGAL_MODULE(Net);
#elif FRUGAL_CASE == 2
struct ParentImpl : nn::Module {
  ParentImpl() { register_module("net", std::make_shared<NetImpl>()); }
  Tensor forward(const Tensor& x) override { return x; }
};
ParentImpl parent;
#else
void build() {
  nn::Sequential seq;
  seq->push_back(std::make_shared<NetImpl>());
}
#endif
}  // namespace
