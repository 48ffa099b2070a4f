// frugal::save / frugal::load for modules and optimizers: their state dicts through safetensors, with a
// metadata key that tells an optimizer's file from a module's.
#include "io/serialize.h"

#include "io/safetensors.h"
#include "nn/quant.h"

namespace frugal {

namespace {
constexpr const char* kOptimizerKey = "optimizer";  // the same key the trainers' checkpoints use for it
}  // namespace

void save(const nn::Module& module, const std::string& path) {
  // A quantised model's int8 weights are written as I8 (Note [int8 as I8]).
  io::save_safetensors(path, module.state_dict(), {{"module", module.type_name()}},
                       nn::quant::int8_names(module));
}

void load(nn::Module& module, const std::string& path) {
  const io::SafetensorsFile file = io::load_safetensors(path);
  const auto saved_by = file.metadata.find(kOptimizerKey);
  FRUGAL_CHECK(saved_by == file.metadata.end(), "load: '", path, "' holds the state of the optimizer ",
               saved_by == file.metadata.end() ? std::string() : saved_by->second,
               ", not a module's weights; load it into an optimizer");
  try {
    module.load_state_dict(file.tensors, /*strict=*/true);
  } catch (const ShapeError& e) {
    throw ShapeError(detail::str_cat("load: '", path, "' does not fit the module: ", e.what()));
  }
}

void save(const optim::Optimizer& optimizer, const std::string& path) {
  io::save_safetensors(path, optimizer.state_dict(), {{kOptimizerKey, optimizer.name()}});
}

void load(optim::Optimizer& optimizer, const std::string& path) {
  const io::SafetensorsFile file = io::load_safetensors(path);
  const auto saved_by = file.metadata.find(kOptimizerKey);
  FRUGAL_CHECK(saved_by != file.metadata.end() && saved_by->second == optimizer.name(), "load: '", path,
               "' holds ",
               saved_by == file.metadata.end() ? std::string("no optimizer state (a module's weights?)")
                                               : "the state of the optimizer " + saved_by->second,
               " but this optimizer is ", optimizer.name());
  try {
    optimizer.load_state_dict(file.tensors);
  } catch (const Error& e) {
    throw Error(detail::str_cat("load: '", path, "' does not fit the optimizer: ", e.what()));
  }
}

}  // namespace frugal
