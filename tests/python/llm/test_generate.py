"""ember.llm.optimize against Hugging Face's own model: greedy tokens identical in float32 over 256 new tokens for
every family, left-padded batches, beam search, sampling and streamers through ``generate``, the forward with a
cache carried by hand, every ISA path; bf16 logits at autocast's level of error."""

from __future__ import annotations

import copy

import pytest
import torch
from llm_models import FAMILIES, causal_lm, pair, prompt

import ember

pytest.importorskip("transformers")


def greedy(model: torch.nn.Module, ids: torch.Tensor, new: int, **kwargs: object) -> torch.Tensor:
    return model.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0, **kwargs)


@pytest.mark.parametrize("family", FAMILIES)
def test_float32_greedy_tokens_are_hugging_faces_over_256_tokens(family: str) -> None:
    stock, optimized = pair(family)
    ids = prompt(1, 11)
    assert torch.equal(greedy(optimized, ids, 256), greedy(stock, ids, 256))


@pytest.mark.parametrize("family", FAMILIES)
def test_left_padded_batch_matches(family: str) -> None:
    stock, optimized = pair(family)
    ids = prompt(3, 13)
    mask = torch.ones_like(ids)
    mask[0, :6] = 0
    mask[2, :12] = 0  # a one-token prompt
    want = greedy(stock, ids, 40, attention_mask=mask)
    assert torch.equal(greedy(optimized, ids, 40, attention_mask=mask), want)


def test_beam_search_matches() -> None:
    stock, optimized = pair("llama")
    ids = prompt(2, 9)
    assert torch.equal(greedy(optimized, ids, 24, num_beams=4), greedy(stock, ids, 24, num_beams=4))


def test_sampling_with_a_seed_matches() -> None:
    stock, optimized = pair("qwen2")
    ids = prompt(2, 5)
    outs = []
    for model in (stock, optimized):
        torch.manual_seed(7)
        outs.append(model.generate(ids, max_new_tokens=30, do_sample=True, top_k=20, temperature=0.9, pad_token_id=0))
    assert torch.equal(outs[0], outs[1])


def test_a_streamer_sees_every_token() -> None:
    from transformers.generation.streamers import BaseStreamer

    class Collect(BaseStreamer):
        def __init__(self) -> None:
            self.tokens: list[int] = []

        def put(self, value: torch.Tensor) -> None:
            self.tokens += value.flatten().tolist()

        def end(self) -> None:
            pass

    _, optimized = pair("llama")
    ids = prompt(1, 6)
    streamer = Collect()
    out = greedy(optimized, ids, 12, streamer=streamer)
    assert streamer.tokens == out[0].tolist()


def test_generation_on_every_isa_path(isa_level: str) -> None:
    stock, optimized = pair("mistral")
    ids = prompt(2, 30)  # past the sliding window (24) from the start
    assert torch.equal(greedy(optimized, ids, 20), greedy(stock, ids, 20))


@pytest.mark.parametrize("family", FAMILIES)
def test_forward_with_the_cache_carried_by_hand(family: str) -> None:
    """The prompt in three pieces, each continuing the cache the last returned: the logits of a whole prefill."""
    stock, optimized = pair(family)
    ids = prompt(2, 40)
    with torch.no_grad():
        want = stock(ids).logits
        cache = None
        pieces = []
        for a, b in ((0, 17), (17, 18), (18, 40)):
            out = optimized(ids[:, a:b], past_key_values=cache, use_cache=True)
            cache = out.past_key_values
            pieces.append(out.logits)
    assert isinstance(cache, ember.llm.KVCache)
    assert cache.get_seq_length() == 40
    torch.testing.assert_close(torch.cat(pieces, dim=1), want, rtol=1e-4, atol=1e-4)


def test_a_cache_of_hugging_faces_runs_the_models_own_forward() -> None:
    from transformers import DynamicCache

    stock, optimized = pair("llama")
    ids = prompt(1, 9)
    with torch.no_grad():
        cache = DynamicCache()
        got = optimized(ids, past_key_values=cache, use_cache=True).logits
        assert cache.get_seq_length() == 9  # filled by the model's own attention
    torch.testing.assert_close(got, stock(ids).logits)


def test_logits_to_keep_computes_only_those_positions() -> None:
    stock, optimized = pair("llama")
    assert optimized._supports_logits_to_keep()  # generate asks for the last position's logits only
    ids = prompt(2, 10)
    with torch.no_grad():
        full = stock(ids).logits
        torch.testing.assert_close(optimized(ids, logits_to_keep=3).logits, full[:, -3:], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(optimized(ids).logits, full, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("family", FAMILIES)
def test_bfloat16_logits_are_within_autocast_error(family: str) -> None:
    """Against the float32 model: ember's bf16 error no larger than twice stock bf16's."""
    reference = causal_lm(family)
    stock = copy.deepcopy(reference).to(torch.bfloat16)
    optimized = ember.llm.optimize(copy.deepcopy(reference), dtype=torch.bfloat16)
    ids = prompt(2, 50)
    with torch.no_grad():
        want = reference(ids).logits
        stock_error = (stock(ids).logits.float() - want).abs().max()
        ember_error = (optimized(ids).logits.float() - want).abs().max()
    assert ember_error <= 2 * stock_error + 1e-3


def test_state_dict_stays_hugging_faces() -> None:
    stock = causal_lm("qwen3")
    keys = {k: (v.shape, v.dtype) for k, v in stock.state_dict().items()}
    optimized = ember.llm.optimize(copy.deepcopy(stock), dtype=torch.float32)
    assert {k: (v.shape, v.dtype) for k, v in optimized.state_dict().items()} == keys
    fresh = causal_lm("qwen3")
    fresh.load_state_dict(optimized.state_dict())
    ids = prompt(1, 8)
    assert torch.equal(greedy(fresh, ids, 8), greedy(optimized, ids, 8))


def test_bfloat16_casts_the_models_parameters() -> None:
    optimized = ember.llm.optimize(causal_lm("llama"))
    assert {p.dtype for p in optimized.parameters()} == {torch.bfloat16}


def test_an_unknown_model_runs_unchanged_and_says_so() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(4, 4))
    forward = model.forward
    with pytest.warns(UserWarning, match="not a family ember knows"):
        assert ember.llm.optimize(model) is model
    assert model.forward == forward


def test_bad_arguments_raise() -> None:
    model = causal_lm("llama")
    with pytest.raises(TypeError, match="dtype"):
        ember.llm.optimize(model, dtype=torch.float16)
    with pytest.raises(ValueError, match="max_batch_size"):
        ember.llm.optimize(model, max_batch_size=0)
    with pytest.raises(TypeError, match=r"nn\.Module"):
        ember.llm.optimize("model")  # type: ignore[arg-type]


def test_the_replayed_decode_step_gives_the_call_by_call_results() -> None:
    """Decode steps after the first of each batch size run as one recorded replay: the same kernels in the same
    order, so the same bits as the forward made call by call."""
    _, optimized = pair("qwen3", torch.bfloat16)
    ids = prompt(3, 20)
    replays = optimized._ember_llm.decoder.replays
    with_replay = optimized.generate(ids, max_new_tokens=12, min_new_tokens=12, do_sample=False, pad_token_id=0,
                                     output_logits=True, return_dict_in_generate=True)  # fmt: skip
    assert isinstance(replays._replays[3], ember._C.Replay)
    replays.enabled = False
    without = optimized.generate(ids, max_new_tokens=12, min_new_tokens=12, do_sample=False, pad_token_id=0,
                                 output_logits=True, return_dict_in_generate=True)  # fmt: skip
    assert torch.equal(with_replay.sequences, without.sequences)
    for a, b in zip(with_replay.logits, without.logits):
        assert torch.equal(a, b)


def test_a_known_family_in_a_form_ember_does_not_build_runs_unchanged_and_says_so() -> None:
    """OPT-350m's post-norm layers: the model is left as it was (dtype included), with a warning naming why."""
    model = causal_lm("opt", do_layer_norm_before=False)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.warns(UserWarning, match="post-norm"):
        assert ember.llm.optimize(model) is model
    assert "forward" not in vars(model)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_falcon_with_alibi_runs_unchanged_and_says_so() -> None:
    model = causal_lm("falcon", alibi=True)
    with pytest.warns(UserWarning, match="ALiBi"):
        assert ember.llm.optimize(model) is model
    assert "forward" not in vars(model)
