// safetensors: save and load named tensors in Hugging Face's format (readable by PyTorch, JAX, candle, ...).
// Saves are atomic (io/file.h); loads bound-check the whole header before allocating anything.
//
//   io::save_safetensors("mlp.safetensors", model->state_dict(), {{"epoch", "3"}});
//   io::SafetensorsFile f = io::load_safetensors("mlp.safetensors");
//   Tensor w = f.tensors.at("fc1.weight");  f.metadata.at("epoch") == "3";
//   io::SafetensorsFile m = io::map_safetensors("mlp.safetensors");  // views of the file, no copy
#pragma once

#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

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

// Note [int8 as I8]: frugal has no int8 dtype; int8 values (nn::quant's weights, nn/quant.h) live in U8
// tensors as their two's complement bytes. The tensors named in `int8_names` (each must be U8) are written
// with dtype "I8", the same bytes, so PyTorch's safetensors reads them as torch.int8; the layout places them
// where the reference places I8 (after I16/F16..., before U8). On load, an "I8" tensor becomes a U8 tensor
// holding the same bytes, and its name is listed in SafetensorsFile::int8_names.

// Writes `tensors` (any layout and device; written contiguous, on the cpu) to `path`.
void save_safetensors(const std::string& path, const StateDict& tensors,
                      const std::map<std::string, std::string>& metadata = {},
                      const std::set<std::string>& int8_names = {});

struct SafetensorsFile {
  StateDict tensors;
  std::map<std::string, std::string> metadata;
  std::set<std::string> int8_names;  // the tensors stored as "I8" (held here as U8: Note [int8 as I8])
};

// Reads a whole file into cpu tensors. Throws Error naming the file and the problem when it is missing,
// truncated or corrupt; never trusts a size it has not checked against the file's length.
SafetensorsFile load_safetensors(const std::string& path);

// The file's tensors without reading them: the file is mapped read-only and each tensor views its bytes
// in place (zero-copy; the page cache holds them and faults them in as they are used). The header is
// checked as load_safetensors checks it, against the file's length, before anything is mapped. The mapping
// lives as long as any of its tensors (or views of them) does, and its bytes (the file's length) count as
// the cpu's mapped bytes under the memory tag current at the call (Note [mapped bytes], core/memory.h).
// Ops refuse to write into the tensors (check_writable, core/tensor.h). Map only files nobody rewrites in
// place (io::InputFile::map).
//   auto f = io::map_safetensors("mlp.safetensors");
//   for (auto& [name, p] : model->named_parameters()) p.set_data(f.tensors.at(name));  // no copy
SafetensorsFile map_safetensors(const std::string& path);

// The metadata of a file whose header load_safetensors would accept (checked the same way, against the
// file's length), without reading any tensor.
std::map<std::string, std::string> load_safetensors_metadata(const std::string& path);

// The name of a dtype in the format ("F32", "BF16", "BOOL", ...) and back; the latter throws DTypeError.
const char* safetensors_dtype_name(DType t);
DType dtype_from_safetensors_name(const std::string& name);

class AtomicFile;
namespace detail {
// save_safetensors in two halves, for io::save_checkpoint (io/checkpoint.h): plan_safetensors checks the
// tensors and names and lays out the header without touching any file; write_safetensors writes a plan into
// an AtomicFile, which the caller commits.
struct SafetensorsPlan {
  std::string header;                                   // the JSON, padded; its length goes before it
  std::vector<std::pair<std::string, Tensor>> tensors;  // in layout order
};
SafetensorsPlan plan_safetensors(const std::string& path, const StateDict& tensors,
                                 const std::map<std::string, std::string>& metadata,
                                 const std::set<std::string>& int8_names = {});
void write_safetensors(AtomicFile& file, const SafetensorsPlan& plan);
}  // namespace detail

}  // namespace frugal::io
