// Reading the attention mask (ember/attention.h) and the values a masked score takes, shared by the vector body, the
// few-query path and the AMX path. Included inside the anonymous namespace of each attention translation unit, after
// the scalar vector type (ScalarF), so each ISA's compilation has its own copy.

// A masked score, and the lowest finite float: a row's maximum below it means every score so far was masked.
constexpr float kNegInf = -__builtin_inff();
constexpr float kLowest = -3.40282347e38f;

// Bytes of one mask element.
int64_t mask_element_bytes(MaskKind kind) {
  return kind == MaskKind::additive_f32    ? static_cast<int64_t>(sizeof(float))
         : kind == MaskKind::additive_bf16 ? static_cast<int64_t>(sizeof(uint16_t))
                                           : static_cast<int64_t>(sizeof(bool));
}

// The value a mask of kind Kind adds to a score, element `at` of one query's mask row: a float or bf16 bias, or for
// a bool mask 0 where the key is kept and -inf where it is masked. The kernels' loops over a row take the kind once,
// outside the loop (a switch per score cost 5 ns a score, more than the scores' product at d = 64).
template <MaskKind Kind>
float mask_element(const void* row, int64_t at) {
  if constexpr (Kind == MaskKind::additive_f32) {
    return static_cast<const float*>(row)[at];
  } else if constexpr (Kind == MaskKind::additive_bf16) {
    return ScalarF::load(static_cast<const uint16_t*>(row) + at);
  } else {
    return static_cast<const bool*>(row)[at] ? 0.0f : kNegInf;
  }
}

// fn(std::integral_constant<MaskKind, K>{}) for the mask kind K of a call that has a mask (nothing for none): how
// the kernels' loops over a mask row take the kind once, as a template argument.
template <typename Fn>
void with_mask_kind(MaskKind kind, Fn&& fn) {
  switch (kind) {
    case MaskKind::additive_f32: fn(std::integral_constant<MaskKind, MaskKind::additive_f32>{}); break;
    case MaskKind::additive_bf16: fn(std::integral_constant<MaskKind, MaskKind::additive_bf16>{}); break;
    case MaskKind::keep_bool: fn(std::integral_constant<MaskKind, MaskKind::keep_bool>{}); break;
    case MaskKind::none: break;
  }
}

// mask_element for key j of a row, its kind read from the call (0 without a mask).
float mask_value(const AttentionArgs& a, const void* row, int64_t j) {
  float value = 0.0f;
  with_mask_kind(a.mask_kind, [&](auto kind) { value = mask_element<decltype(kind)::value>(row, j * a.mask_sj); });
  return value;
}
