// The user's own core/ folder: its headers live beside frugal's names (core/, nn/, io/) without clashing.
#pragma once

namespace app {
inline const char* name() { return "consumer"; }
}  // namespace app
