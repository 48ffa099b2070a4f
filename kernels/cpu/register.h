// Helpers for the CPU kernel files' registration blocks.
#pragma once

namespace frugal::cpu {

// Calls f(T{}) for each listed element type: for_types<float, double>([](auto t) { ...decltype(t)... }).
template <typename... Ts, typename F>
void for_types(F f) {
  (f(Ts{}), ...);
}

}  // namespace frugal::cpu
