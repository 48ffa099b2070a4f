// Checkpoints as one unit: the order of a save's renames and the load's choice of the state file
// (Note [checkpoint pairs] in io/checkpoint.h).
#include "io/checkpoint.h"

#include <cstdio>
#include <filesystem>
#include <optional>
#include <random>

#include "io/file.h"

namespace frugal::io {

namespace {

constexpr const char* kIdKey = "checkpoint_id";

// 128 random bits in hex: no two saves share one (the kernel's randomness, also across processes).
std::string new_checkpoint_id() {
  std::random_device random;
  char id[33];
  std::snprintf(id, sizeof id, "%08x%08x%08x%08x", unsigned(random()), unsigned(random()), unsigned(random()),
                unsigned(random()));
  return id;
}

bool exists(const std::string& path) {
  std::error_code ec;
  return std::filesystem::exists(std::filesystem::symlink_status(path, ec));
}

// The checkpoint_id in a file's header, if the file exists, reads and has one; never throws (a file that
// does not read is one no checkpoint can use).
std::optional<std::string> id_of(const std::string& path) {
  if (!exists(path)) return std::nullopt;
  try {
    const std::map<std::string, std::string> metadata = load_safetensors_metadata(path);
    const auto it = metadata.find(kIdKey);
    if (it != metadata.end()) return it->second;
  } catch (const Error&) {
  }
  return std::nullopt;
}

// True for what new_checkpoint_id() makes; anything else is never quoted (it could be of any length).
bool is_checkpoint_id(const std::string& s) {
  return s.size() == 32 && s.find_first_not_of("0123456789abcdef") == std::string::npos;
}

// What a candidate state file holds, for the message that refuses it.
std::string describe_state(const std::string& path, const std::optional<std::string>& id) {
  if (id)
    return "'" + path + "' has " +
           (is_checkpoint_id(*id) ? "checkpoint " + *id : "a malformed checkpoint id");
  try {
    load_safetensors_metadata(path);
    return "'" + path + "' has no checkpoint id";
  } catch (const Error& e) {
    return "'" + path + "' does not load (" + e.what() + ")";
  }
}

// Deletes the state a failed save wrote to `next` (it has the save's id, which no weights carry); never
// throws, and a failure is harmless (a load never picks it, the next save overwrites it).
void remove_unused_state(const std::string& next, const std::string& id) {
  if (id_of(next) == id) std::remove(next.c_str());
}

// Rethrows the exception being handled with `before` and `after` around its message, as the same kind of
// Error (an OutOfMemoryError stays one: the trainers give their advice for it). Anything else, a simulated
// crash among them, goes through untouched.
[[noreturn]] void rethrow_with_context(const std::string& before, const std::string& after) {
  try {
    throw;
  } catch (const OutOfMemoryError& e) {
    throw OutOfMemoryError(before + e.what() + after);
  } catch (const Error& e) {
    throw Error(before + e.what() + after);
  }
}

// Takes the checkpoint_id out of a file's metadata (the caller gets its metadata as it saved it).
std::optional<std::string> take_id(SafetensorsFile& file) {
  const auto it = file.metadata.find(kIdKey);
  if (it == file.metadata.end()) return std::nullopt;
  std::string id = it->second;
  file.metadata.erase(it);
  return id;
}

}  // namespace

std::string checkpoint_state_path(const std::string& path) { return path + ".state"; }

void save_checkpoint(const std::string& path, const StateDict& weights,
                     const std::map<std::string, std::string>& weights_metadata, const StateDict& state,
                     const std::map<std::string, std::string>& state_metadata) {
  const std::string where = "save_checkpoint('" + path + "'): ";
  const std::string state_path = checkpoint_state_path(path), next = state_path + ".next";
  for (const auto* metadata : {&weights_metadata, &state_metadata})
    FRUGAL_CHECK(!metadata->count(kIdKey), where, "the metadata key \"", kIdKey,
                 "\" is reserved: it ties the weights to their training state (Note [checkpoint pairs])");
  const std::string id = new_checkpoint_id();
  std::map<std::string, std::string> wm = weights_metadata, sm = state_metadata;
  wm[kIdKey] = id;
  sm[kIdKey] = id;
  // Both files are planned (names and strings checked) before either is touched.
  const detail::SafetensorsPlan weights_plan = detail::plan_safetensors(path, weights, wm);
  const detail::SafetensorsPlan state_plan = detail::plan_safetensors(next, state, sm);

  // A previous save that stopped between its steps 2 and 3 left the current checkpoint's state at `next`;
  // step 1 would overwrite it, so that save's step 3 is done first (the checkpoint stays the same one).
  if (const auto current = id_of(path); current && id_of(next) == current) {
    try {
      rename_durably(next, state_path);
    } catch (...) {
      rethrow_with_context(where + "finishing the previous save failed: ",
                           "; the previous checkpoint is unchanged (its state at '" + next + "')");
    }
  }

  // The message of a failure after the commit point: where the new checkpoint's state is.
  const auto in_place = [&] {
    return where + "the new checkpoint is in place ('" + path + "' with its state at '" +
           (exists(next) ? next + "', where load_checkpoint finds it" : state_path + "'") +
           "), but a step after the commit failed: ";
  };

  // 1. The new state to `next`. The old checkpoint stays whole whatever happens here.
  try {
    AtomicFile file(next);
    detail::write_safetensors(file, state_plan);
    file.commit();
  } catch (const detail::SimulatedCrash&) {
    throw;
  } catch (...) {
    remove_unused_state(next, id);  // when only the directory's fsync failed
    rethrow_with_context(where + "writing the training state failed: ",
                         "; the previous checkpoint ('" + path + "' and '" + state_path + "') is unchanged");
  }

  // 2. The new weights over `path`: the commit point.
  std::optional<AtomicFile> file;
  try {
    file.emplace(path);
    detail::write_safetensors(*file, weights_plan);
    file->commit();
  } catch (const detail::SimulatedCrash&) {
    throw;
  } catch (...) {
    if (file && file->renamed()) rethrow_with_context(in_place(), "");
    remove_unused_state(next, id);
    rethrow_with_context(where + "writing the weights failed: ",
                         "; the previous checkpoint ('" + path + "' and '" + state_path + "') is unchanged");
  }

  // 3. The state to its place beside the weights.
  try {
    rename_durably(next, state_path);
  } catch (...) {
    rethrow_with_context(in_place(), "");
  }
}

Checkpoint load_checkpoint(const std::string& path) {
  const std::string where = "load_checkpoint('" + path + "'): ";
  const std::string state_path = checkpoint_state_path(path), next = state_path + ".next";
  Checkpoint c;
  c.weights = load_safetensors(path);
  const std::optional<std::string> id = take_id(c.weights);
  FRUGAL_CHECK(!id || is_checkpoint_id(*id), where, "'", path, "' has a malformed \"", kIdKey,
               "\" in its metadata (32 hex digits expected); the file is corrupt");
  FRUGAL_CHECK(
      id, where, "'", path, "' has no \"", kIdKey,
      "\" in its metadata, so it is not the weights of a checkpoint written by io::save_checkpoint (a "
      "plain weights file, or a checkpoint of a frugal from before checkpoint ids); a training state "
      "cannot be matched to it");

  // The state of the same save: in its place, or where a save that stopped before its last rename left it
  // (`state` again last: a save running meanwhile may just have moved it there).
  std::string found;
  std::vector<std::string> seen;
  for (const std::string& candidate : {state_path, next, state_path}) {
    const std::optional<std::string> candidate_id = id_of(candidate);
    if (candidate_id == id) {
      found = candidate;
      break;
    }
    if (exists(candidate)) seen.push_back(describe_state(candidate, candidate_id));
  }
  if (found.empty()) {
    FRUGAL_CHECK(!seen.empty(), where, "no training state beside '", path, "': neither '", state_path,
                 "' nor '", next, "' exists");
    std::string list;
    for (const std::string& s : seen)
      if (list.find(s) == std::string::npos) list += (list.empty() ? "" : ", ") + s;
    FRUGAL_CHECK(
        false, where, "the training state was written by another save than the weights: '", path,
        "' has checkpoint ", *id, ", ", list,
        ". A save never leaves such a pair behind by itself (Note [checkpoint pairs]): two runs saved "
        "to this path at once, or the files were copied, restored or deleted separately. Refusing to "
        "resume from weights and a state of different saves");
  }
  c.state = load_safetensors(found);
  FRUGAL_CHECK(take_id(c.state) == id, where, "'", found,
               "' changed while being read (is another run saving to this path?)");
  c.id = *id;
  return c;
}

}  // namespace frugal::io
