// Reading and writing a slot's parameter whatever its storage (optim_kernels.h): plain fp32 or bf16 storage, or
// the two halves of a split-BF16 value. Included inside an anonymous namespace of each kernel file, after the
// vector types. T is one of the *Pointers<S> structs.
template <typename V, typename T>
inline typename V::Reg load_param(const T& t, int64_t i) {
  if constexpr (T::Storage::kSplit) {
    return V::join(t.param + i, t.bottom + i);
  } else {
    return V::load(t.param + i);
  }
}

template <typename V, typename T>
inline void store_param(const T& t, int64_t i, typename V::Reg p) {
  if constexpr (T::Storage::kSplit) {
    V::split(t.param + i, t.bottom + i, p);
  } else {
    V::store(t.param + i, p);
  }
}
