// safetensors: save and load named tensors in Hugging Face's format (readable by PyTorch, JAX, candle, ...).
// Saves are atomic (io/file.h); loads bound-check the whole header before allocating anything.
//
//   io::save_safetensors("mlp.safetensors", model->state_dict(), {{"epoch", "3"}});
//   io::SafetensorsFile f = io::load_safetensors("mlp.safetensors");
//   Tensor w = f.tensors.at("fc1.weight");  f.metadata.at("epoch") == "3";
#pragma once

#include <map>
#include <string>

#include "../core/tensor.h"

namespace frugal::io {

// The file layout, as the reference implementation (huggingface/safetensors) writes it:
//   8 bytes      N, the header length, little-endian u64
//   N bytes      compact UTF-8 JSON: {"__metadata__":{...},"name":{"dtype":"F32","shape":[2,3],
//                "data_offsets":[begin,end]},...}, padded with spaces to a multiple of 8
//   the rest     the tensors' bytes, little-endian, C order, back to back with no gaps
// Note [safetensors order]: tensors are laid out by descending dtype alignment (the reference's dtype order:
// I64, F64, F32, I32, BF16, F16, U8, BOOL), then by name; the JSON lists "__metadata__" first (omitted when
// empty, its keys sorted), then the tensors in layout order. The reference does the same (its metadata map is
// unordered, so with more than one metadata key only the order of those keys may differ), so frugal's files
// are byte-identical to what safetensors.torch.save_file writes for the same tensors.

// Writes `tensors` (any layout and device; written contiguous, on the cpu) to `path`.
void save_safetensors(const std::string& path, const StateDict& tensors,
                      const std::map<std::string, std::string>& metadata = {});

struct SafetensorsFile {
  StateDict tensors;
  std::map<std::string, std::string> metadata;
};

// Reads a whole file into cpu tensors. Throws Error naming the file and the problem when it is missing,
// truncated or corrupt; never trusts a size it has not checked against the file's length.
SafetensorsFile load_safetensors(const std::string& path);

// The name of a dtype in the format ("F32", "BF16", "BOOL", ...) and back; the latter throws DTypeError.
const char* safetensors_dtype_name(DType t);
DType dtype_from_safetensors_name(const std::string& name);

}  // namespace frugal::io
