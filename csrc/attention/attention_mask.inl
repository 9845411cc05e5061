// Reading the attention mask (ember/attention.h), shared by the vector body and the AMX path. Included inside the
// anonymous namespace of each attention translation unit, after the scalar vector type (ScalarF), so each ISA's
// compilation has its own copy.

// Bytes of one mask element.
int64_t mask_element_bytes(MaskKind kind) {
  return kind == MaskKind::additive_f32    ? static_cast<int64_t>(sizeof(float))
         : kind == MaskKind::additive_bf16 ? static_cast<int64_t>(sizeof(uint16_t))
                                           : static_cast<int64_t>(sizeof(bool));
}

// The value the mask adds to key j's score, in one query's mask row: a float or bf16 bias, or for a bool mask 0
// where the key is kept and -inf where it is masked.
float mask_value(const AttentionArgs& a, const void* row, int64_t j) {
  const int64_t at = j * a.mask_sj;
  switch (a.mask_kind) {
    case MaskKind::additive_f32: return static_cast<const float*>(row)[at];
    case MaskKind::additive_bf16: return ScalarF::load(static_cast<const uint16_t*>(row) + at);
    case MaskKind::keep_bool: return static_cast<const bool*>(row)[at] ? 0.0f : -__builtin_inff();
    case MaskKind::none: break;
  }
  return 0.0f;
}
