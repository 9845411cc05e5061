// Picking a kernel per slot by its storage (fp32, bf16, split-BF16): the kernels for all three storages are chosen
// once per call for the active ISA, and each piece of work calls the one its slot needs.
#pragma once

#include <cstdint>
#include <type_traits>
#include <utility>

#include "ember/isa.h"
#include "optim_kernels.h"

namespace ember::optim::detail {

/// Fn<S> of a kernel family for each storage S, and the ISA they were chosen for.
template <template <typename> class Fn>
struct StorageKernels {
  Fn<kernels::Fp32Storage> fp32;
  Fn<kernels::Bf16Storage> bf16;
  Fn<kernels::SplitStorage> split;
  Isa isa;

  template <typename S>
  Fn<S> get() const {
    if constexpr (std::is_same_v<S, kernels::Fp32Storage>) {
      return fp32;
    } else if constexpr (std::is_same_v<S, kernels::Bf16Storage>) {
      return bf16;
    } else {
      return split;
    }
  }
};

/// The kernels of one family at `level` from its per-storage dispatch tables (lists ordered widest ISA first).
template <template <typename> class Fn, size_t N>
StorageKernels<Fn> select_storage_kernels(const IsaImpl<Fn<kernels::Fp32Storage>> (&fp32)[N],
                                          const IsaImpl<Fn<kernels::Bf16Storage>> (&bf16)[N],
                                          const IsaImpl<Fn<kernels::SplitStorage>> (&split)[N], Isa level) {
  const auto& chosen = select_impl(fp32, level);
  return {chosen.fn, select_impl(bf16, level).fn, select_impl(split, level).fn, chosen.isa};
}

/// A slot's parameter, its bottom half (split-BF16 only) and its gradient, with their storage.
struct ParamSlot {
  void* param = nullptr;
  uint16_t* bottom = nullptr;
  const void* grad = nullptr;
  kernels::StorageKind storage = kernels::StorageKind::fp32;

  /// Pointers<S> (AdamPointers, SgdPointers, ...) with the parameter part filled in and `state` after it.
  template <template <typename> class Pointers, typename S, typename... State>
  Pointers<S> pointers(State... state) const {
    return {static_cast<typename S::Param*>(param), bottom, static_cast<const typename S::Grad*>(grad), state...};
  }
};

/// Calls f(S{}) with the storage type S that `kind` names.
template <typename F>
void with_storage(kernels::StorageKind kind, F&& f) {
  switch (kind) {
    case kernels::StorageKind::fp32: std::forward<F>(f)(kernels::Fp32Storage{}); return;
    case kernels::StorageKind::bf16: std::forward<F>(f)(kernels::Bf16Storage{}); return;
    case kernels::StorageKind::split: std::forward<F>(f)(kernels::SplitStorage{}); return;
  }
}

}  // namespace ember::optim::detail
