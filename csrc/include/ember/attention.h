// Scaled dot-product attention, computed block by block without the [Lq, Lk] score matrix in memory (the
// "flash attention" schedule: a running maximum and sum per query row rescale the partial output as each block of
// keys arrives). The one kernel behind graph mode's attention pass (torch's F.scaled_dot_product_attention and the
// matmul - scale - mask - softmax - matmul pattern of models that spell it out) and the LLM prefill.
//
// out[b, h, i, :] = softmax_j(scale · q[b, h, i, :] · k[b, g(h), j, :] + mask[b, h, i, j]) · v[b, g(h), j, :]
//
// with g(h) = h / (Hq / Hkv): grouped-query attention shares each key/value head among Hq / Hkv query heads, as
// torch's enable_gqa (repeat_interleave) does. Scores, the softmax and the output sums are float32 throughout;
// bfloat16 inputs are widened exactly, and the output is rounded once. A row whose every score is masked out
// (-inf, or False in a boolean mask) gets zeros, as torch's fused CPU kernel gives them, not NaN.
// Results do not depend on the thread count: a query row's arithmetic, the order of its key blocks included, is
// the same however the rows are shared out.
#pragma once

#include <cstdint>

#include "ember/isa.h"
#include "ember/kv_cache.h"
#include "ember/tensor_view.h"

namespace ember::attention {

/// The level of the implementation that runs under the current ISA cap.
Isa implementation();

/// out = attention(q, k, v) as above.
///   q: [B, Hq, Lq, E]; k: [B, Hkv, Lk, E]; v: [B, Hkv, Lk, Ev]; out: [B, Hq, Lq, Ev]. q, k, v and out share one
///      dtype, float32 or bfloat16; each has its last dimension of stride 1 and any other strides (a [B, L, H, E]
///      projection transposed to [B, H, L, E] is read where it lies). Hq a multiple of Hkv; E, Ev >= 1.
///   mask: null, or [B or 1, Hq or 1, Lq or 1, Lk] (broadcast dimensions of size 1 or stride 0), any strides:
///      float32 or bfloat16 is added to the scaled scores; bool keeps a score where True and masks it where False.
///   causal: also mask key j for query i where j > i (the upper triangle from the top-left corner, as torch's
///      is_causal); may be combined with a mask.
///   scale: finite; torch's default is 1 / sqrt(E).
///   softcap: 0, or > 0 (finite): each scaled score becomes softcap · tanh(score / softcap) before the mask is added
///      (Gemma 2's attention-logit soft cap).
/// out shares no memory with the inputs. Checked before anything is written.
void scaled_dot_product(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView* mask,
                        bool causal, double scale, const TensorView& out, double softcap = 0.0);

/// Attention of each sequence's newest tokens against its keys and values in a paged cache (ember/kv_cache.h): the
/// decode step of text generation, and the prefill of tokens that continue a cached sequence. A task is one
/// (sequence, key/value head, chunk of 256 keys) with every query of the head group, so a batch of one still spreads
/// over the cores along its keys; the chunks' partial results are merged in chunk order (results do not depend on the
/// thread count). Scores, the softmax and the sums are float32, as in scaled_dot_product.
///   q: [B, Hq, Lq, key_dim], the cache's dtype, the last dimension of stride 1; B = cache.sequences(), Hq a multiple
///      of the cache's heads (grouped-query attention). Efficient for a few queries a sequence (decode); any Lq runs.
///   key_limits: null, or int64 [B, Lq]: query (b, i) sees keys [limit - window, limit) of its sequence (from key 0
///      where window is 0), with 0 <= limit <= cache.visible_length(b). Null: the causal bound of the sequence's last
///      Lq tokens, limit = visible_length(b) - Lq + 1 + i (the tokens being decoded, written to the cache already).
///      A query that sees no key gets zeros.
///   window: 0, or the sliding window's keys (Mistral's, Gemma 2's local layers).
///   softcap: as scaled_dot_product's.
///   out: [B, Hq, Lq, value_dim], q's dtype, dense, sharing no memory with q or the cache.
/// Checked before anything is written.
void over_cache(const TensorView& q, const kv_cache::PagedCache& cache, int64_t layer, const TensorView* key_limits,
                int64_t window, double scale, const TensorView& out, double softcap = 0.0);

}  // namespace ember::attention
