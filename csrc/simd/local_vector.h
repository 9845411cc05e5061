// LocalVector<T>: std::vector for code compiled with ISA flags (a kernel family's per-ISA compilation, a *_avx2.cpp,
// *_avx512*.cpp or *_amx.cpp file), whose out-of-line members no other translation unit can end up calling.
//
// Why not std::vector: its members that the compiler does not inline (_M_default_append behind resize(), the base's
// destructor under ASan's -O1 inlining) are weak symbols, one copy per translation unit that uses them, and the
// linker keeps any one of those copies for the whole library. A copy compiled with -mavx512bw is as good as any
// other to the linker: on an AVX2-only CPU the AVX2 attention kernel's scratch resize ran the AVX-512 compilation's
// _M_default_append and died on vmovdqu8 (SIGILL; seen on a Zen 3 in the sanitized build). FBGEMM's issue #46 is the
// same trap.
//
// How: the allocator is declared in an unnamed namespace, so every translation unit that includes this header has a
// type of its own, and std::vector<T, LocalAllocator<T>> with all its members has internal linkage there: each ISA
// compilation calls its own copy. The allocator calls the global operator new and delete (plain functions, not
// templates), so it instantiates nothing shared either. tests/cpp/CMakeLists.txt's IsaObjectsShareNoCode test checks
// the built library for weak code in ISA-flagged objects whose name does not carry that ISA.
#pragma once

#include <cstddef>
#include <new>
#include <vector>

namespace ember::simd {
namespace {  // NOLINT(cert-dcl59-cpp,google-build-namespaces): one allocator type per translation unit is the point

template <typename T>
struct LocalAllocator {
  static_assert(alignof(T) <= __STDCPP_DEFAULT_NEW_ALIGNMENT__, "LocalAllocator takes operator new's alignment");
  using value_type = T;

  LocalAllocator() noexcept = default;
  template <typename U>
  LocalAllocator(const LocalAllocator<U>& /*other*/) noexcept {}  // NOLINT(google-explicit-constructor): rebinding

  T* allocate(std::size_t n) { return static_cast<T*>(::operator new(n * sizeof(T))); }
  void deallocate(T* p, std::size_t /*n*/) noexcept { ::operator delete(static_cast<void*>(p)); }

  template <typename U>
  bool operator==(const LocalAllocator<U>& /*other*/) const noexcept {
    return true;
  }
  template <typename U>
  bool operator!=(const LocalAllocator<U>& /*other*/) const noexcept {
    return false;
  }
};

}  // namespace

/// std::vector with members of internal linkage in the including translation unit (see the file's comment).
template <typename T>
using LocalVector = std::vector<T, LocalAllocator<T>>;

}  // namespace ember::simd
