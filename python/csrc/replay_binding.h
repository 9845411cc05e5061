#pragma once

#include <pybind11/pybind11.h>

namespace ember::binding {
/// Adds Replay, a recorded sequence of kernel calls run again in one call (replay_binding.cpp), to the module.
void bind_replay(pybind11::module_& m);
}  // namespace ember::binding
