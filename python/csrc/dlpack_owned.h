// Handing memory the core allocated to Python without a copy: a DLPack capsule that owns a std::vector. Outputs
// whose size only the kernel knows (the rows a backward pass touched) leave the core this way;
// torch.utils.dlpack.from_dlpack turns the capsule into a tensor that frees the vector when it dies.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <vector>

namespace ember::binding {

/// A "dltensor" capsule of a contiguous CPU tensor of `shape` over `values` (moved in). Freed with the consumer's
/// tensor, or with the capsule if nothing consumed it.
pybind11::capsule owned_dlpack(std::vector<int64_t>&& values, std::vector<int64_t> shape);
pybind11::capsule owned_dlpack(std::vector<float>&& values, std::vector<int64_t> shape);
pybind11::capsule owned_dlpack(std::vector<double>&& values, std::vector<int64_t> shape);

}  // namespace ember::binding
