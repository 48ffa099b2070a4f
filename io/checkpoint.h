// Checkpoints: a model's weights and the training state that goes with them (optimizer, loss scaler, step,
// RNG), saved and loaded as one unit so that a resumed run never continues from one save's weights and
// another's state. Not a format of its own: two safetensors files.
//
//   io::save_checkpoint("run.safetensors", model->state_dict(), {{"model", "mlp"}},
//                       state, {{"optimizer", "Adam"}});
//   io::Checkpoint c = io::load_checkpoint("run.safetensors");  // refuses files of two different saves
//   model->load_state_dict(c.weights.tensors);  c.state.metadata.at("optimizer") == "Adam";
#pragma once

#include <map>
#include <string>

#include "safetensors.h"

namespace frugal::io {

// Note [checkpoint pairs]
// A checkpoint is two files: the weights at `path` (a plain safetensors file that any tool reads) and the
// training state at `path`.state. The metadata of both holds the same "checkpoint_id", 128 random bits in
// hex, new for every save, and a load takes only a state whose id is the weights' id: from `path`.state, or
// else from `path`.state.next. A save renames three times, each rename fsynced before the next step:
//   1. the new state to `path`.state.next    (each file written to a temporary first, as in io/file.h)
//   2. the new weights over `path`            <- the commit point
//   3. `path`.state.next over `path`.state
// The invariant: the weights' id is always that of `path`.state or of `path`.state.next. Step 1 changes
// neither the weights nor `path`.state; step 2 gives the weights the id `path`.state.next already has; step 3
// moves that file to `path`.state. Step 1 would break it when `path`.state.next holds the current state (a
// save stopped between its steps 2 and 3), so a save first does that save's step 3 (one rename; the
// checkpoint stays the same). Hence wherever saves stop, failing or killed or by a power loss, even one
// after another, a load gets exactly the old checkpoint (stopped before step 2) or exactly the new one (after
// it); a state.next of an unfinished save has an id no weights carry, and the next save overwrites it. What
// the saves alone cannot leave, weights with no state of their id, comes only from outside them: two runs
// saving to one path at once, or files copied, restored or deleted one at a time. The load refuses that
// with a message saying so, and refuses weights without an id (a plain weights file). A killed save also
// leaves its temporaries (`path`.tmp.*, `path`.state.next.tmp.*), as any killed writer does; nothing reads
// them, and they may be deleted when no save runs.

struct Checkpoint {
  SafetensorsFile weights, state;  // each with its metadata as saved, without "checkpoint_id"
  std::string id;                  // the save's checkpoint_id
};

// Saves `weights` to `path` and `state` to `path`.state as one checkpoint (Note [checkpoint pairs]). The
// metadata may not use the key "checkpoint_id". Throws Error saying which step failed and which checkpoint
// a load now gets (the old one, or the new one when only the last rename failed).
void save_checkpoint(const std::string& path, const StateDict& weights,
                     const std::map<std::string, std::string>& weights_metadata, const StateDict& state,
                     const std::map<std::string, std::string>& state_metadata);

// Reads the checkpoint at `path`: both files, checked to be of one save, before anything is returned, so a
// caller that gets one can apply it without finding a mismatch halfway. Throws Error naming the files and
// what is wrong (missing, corrupt, of different saves).
Checkpoint load_checkpoint(const std::string& path);

// The name of the state file beside the weights at `path`: `path`.state.
std::string checkpoint_state_path(const std::string& path);

}  // namespace frugal::io
