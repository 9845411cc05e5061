"""ember.optimize for training: split-BF16 master weights, the fused optimizer swap, and plain checkpoints."""

from __future__ import annotations

import copy
import io
import pickle

import pytest
import torch
from torch import nn

import ember
from ember.optim import AdamW, FusedOptimizer


class SmallNet(nn.Module):
    """Conv + BatchNorm + Linear, with a tied embedding/decoder pair and a frozen layer: every case of the
    parameter selection in one model."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3)
        self.bn = nn.BatchNorm2d(4)
        self.head = nn.Linear(4 * 6 * 6, 10)
        self.embed = nn.Embedding(10, 6)
        self.decode = nn.Linear(6, 10, bias=False)
        self.decode.weight = self.embed.weight  # tied
        self.frozen = nn.Linear(10, 10)
        self.frozen.requires_grad_(False)
        self.scale = nn.Parameter(torch.ones(10))  # a custom module's own parameter: stays float32

    def forward(self, x: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        h = self.head(torch.relu(self.bn(self.conv(x))).flatten(1))
        return self.frozen(h) * self.scale + self.decode(self.embed(tokens))


def make(seed: int = 0) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = SmallNet()
    optimizer = torch.optim.AdamW(
        [
            {"params": [p for n, p in model.named_parameters() if n.startswith("head")], "lr": 3e-3},
            {"params": [p for n, p in model.named_parameters() if not n.startswith(("head", "frozen"))]},
        ],
        lr=1e-3,
        weight_decay=0.05,
    )
    return model, optimizer


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(100 + step)
    return (
        torch.randn(8, 1, 8, 8, generator=gen),
        torch.randint(0, 10, (8,), generator=gen),
        torch.randint(0, 10, (8,), generator=gen),
    )


def train(model: nn.Module, optimizer: torch.optim.Optimizer, steps: range) -> list[float]:
    losses = []
    for step in steps:
        x, tokens, y = batch(step)
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(x, tokens), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def bits_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]) for k in a)


def test_bf16_training_converts_the_right_parameters() -> None:
    model, optimizer = make()
    original = copy.deepcopy(model.state_dict())
    model, optimizer = ember.optimize(model, optimizer=optimizer, dtype=torch.bfloat16, inplace=True)
    assert isinstance(optimizer, AdamW)
    dtypes = {name: p.dtype for name, p in model.named_parameters()}
    assert dtypes["conv.weight"] == dtypes["head.weight"] == dtypes["embed.weight"] == torch.bfloat16
    assert dtypes["frozen.weight"] == torch.bfloat16  # frozen: split too, its halves are never stepped
    assert dtypes["bn.weight"] == dtypes["scale"] == torch.float32
    assert model.decode.weight is model.embed.weight
    # The checkpoint is the fp32 model's, bit for bit, under the original keys.
    assert bits_equal(model.state_dict(), original)
    train(model, optimizer, range(3))
    assert all(v.dtype == original[k].dtype for k, v in model.state_dict().items())


def optimized(seed: int = 0, **flags) -> tuple[nn.Module, FusedOptimizer]:
    model, optimizer = make(seed)
    return ember.optimize(model, optimizer=optimizer, dtype=torch.bfloat16, **flags)


def test_split_training_checkpoint_resumes_bit_identically() -> None:
    # One run of 6 steps, against 3 steps, a torch.save of plain state dicts loaded into a fresh stock-PyTorch
    # model and optimizer, ember.optimize again, and 3 more steps.
    straight_model, straight_optimizer = optimized()
    straight = train(straight_model, straight_optimizer, range(6))

    model, optimizer = optimized()
    first = train(model, optimizer, range(3))
    buffer = io.BytesIO()
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, buffer)
    buffer.seek(0)
    checkpoint = torch.load(buffer)

    stock_model, stock_optimizer = make(seed=1)  # other initial weights: everything must come from the checkpoint
    stock_model.load_state_dict(checkpoint["model"])
    stock_optimizer.load_state_dict(checkpoint["optimizer"])  # ember's optimizer state dict is torch's
    assert all(p.dtype == torch.float32 for p in stock_model.parameters())
    resumed_model, resumed_optimizer = ember.optimize(stock_model, optimizer=stock_optimizer, dtype=torch.bfloat16)
    second = train(resumed_model, resumed_optimizer, range(3, 6))

    assert first + second == straight
    assert bits_equal(resumed_model.state_dict(), straight_model.state_dict())
    resumed_state = resumed_optimizer.state_dict()["state"]
    for index, entry in straight_optimizer.state_dict()["state"].items():
        assert all(torch.equal(value, resumed_state[index][key]) for key, value in entry.items())


def test_load_state_dict_resplits_a_plain_checkpoint_into_the_live_model() -> None:
    model, optimizer = optimized()
    train(model, optimizer, range(2))
    fresh, _ = make(seed=3)
    plain = fresh.state_dict()
    model.load_state_dict(plain)
    assert bits_equal(model.state_dict(), plain)
    # The optimizer steps the loaded master weights: the same as a run that started from them.
    reference_model, reference_optimizer = make(seed=3)
    reference_model, reference_optimizer = ember.optimize(
        reference_model, optimizer=reference_optimizer, dtype=torch.bfloat16
    )
    for opt in (optimizer, reference_optimizer):
        opt.state.clear()
    assert train(model, optimizer, range(2)) == train(reference_model, reference_optimizer, range(2))
    assert bits_equal(model.state_dict(), reference_model.state_dict())


def test_copies_keep_vars_and_pickles() -> None:
    model, optimizer = optimized()
    train(model, optimizer, range(2))
    expected = model.state_dict()
    assert bits_equal(copy.deepcopy(model).state_dict(), expected)
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    assert bits_equal(loaded.state_dict(), expected)
    live = model.state_dict(keep_vars=True)
    assert live["head.weight"] is model.head.weight and live["head.weight"].dtype == torch.bfloat16


def test_inplace_false_leaves_the_originals_alone_and_trains_like_inplace() -> None:
    model, optimizer = make()
    before = copy.deepcopy(model.state_dict())
    copied_model, copied_optimizer = ember.optimize(model, optimizer=optimizer, dtype=torch.bfloat16)
    assert copied_model is not model and copied_optimizer is not optimizer
    assert type(optimizer) is torch.optim.AdamW and all(p.dtype == torch.float32 for p in model.parameters())
    assert bits_equal(model.state_dict(), before) and "forward" not in model.__dict__
    assert copied_optimizer.param_groups[0]["params"][0] is copied_model.head.weight

    in_place_model, in_place_optimizer = make()
    returned = ember.optimize(in_place_model, optimizer=in_place_optimizer, dtype=torch.bfloat16, inplace=True)
    assert returned[0] is in_place_model and returned[1] is in_place_optimizer
    assert train(copied_model, copied_optimizer, range(3)) == train(in_place_model, in_place_optimizer, range(3))
    assert bits_equal(copied_model.state_dict(), in_place_model.state_dict())


def test_schedulers_clipping_accumulation_and_autocast_blocks() -> None:
    model, optimizer = make()
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)  # bound before optimize
    model, optimizer = ember.optimize(model, optimizer=optimizer, dtype=torch.bfloat16, inplace=True)
    assert scheduler.optimizer is optimizer
    for step in range(3):
        optimizer.zero_grad()
        for micro in range(2):  # gradient accumulation over two micro-batches, inside the user's autocast
            x, tokens, y = batch(10 * step + micro)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = nn.functional.cross_entropy(model(x, tokens), y) / 2
            loss.backward()
        norm = nn.utils.clip_grad_norm_(model.parameters(), max_norm=0.5)
        assert torch.isfinite(norm)
        optimizer.step()
        scheduler.step()
    assert optimizer.param_groups[1]["lr"] == pytest.approx(1e-3 / 8)
    assert model.head.weight.grad.dtype == torch.bfloat16


def test_float32_swaps_only_the_optimizer_and_o0_only_the_compute_dtype() -> None:
    model, optimizer = make()
    state = copy.deepcopy(model.state_dict())
    model, optimizer = ember.optimize(model, optimizer=optimizer, inplace=True)
    assert isinstance(optimizer, AdamW) and "forward" not in model.__dict__
    assert bits_equal(model.state_dict(), state)

    model, optimizer = make()
    model, optimizer = ember.optimize(model, optimizer=optimizer, dtype=torch.bfloat16, level="O0", inplace=True)
    assert type(optimizer) is torch.optim.AdamW
    assert all(p.dtype == torch.float32 for p in model.parameters())
    x, tokens, _ = batch(0)
    seen = []
    model.head.register_forward_hook(lambda module, args, out: seen.append(out.dtype))
    model.head(torch.randn(2, 144))  # a submodule called alone: no autocast
    model(x, tokens)
    assert seen == [torch.float32, torch.bfloat16]


def test_report_names_what_changed_and_why(capsys: pytest.CaptureFixture[str]) -> None:
    optimized(report=True)
    out = capsys.readouterr().out
    assert "torch.optim.AdamW -> ember.optim.AdamW" in out
    assert "conv.weight (36)" in out and "head.weight (1,440)" in out
    assert "bn.weight: BatchNorm2d: normalisation layers keep float32" in out
    assert "scale: SmallNet is not a layer ember converts" in out
    assert "decode.weight" not in out  # tied: reported once, under embed.weight


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda m, o: ember.optimize(m.eval(), optimizer=o), ValueError, "eval mode but an optimizer"),
        (lambda m, o: ember.optimize(m, optimizer=o, weights_prepack=True), ValueError, "prepack applies to"),
        (lambda m, o: ember.optimize(m, optimizer=o, dtype=torch.float64), ValueError, "dtype must be"),
        (lambda m, o: ember.optimize(m, optimizer=o, level="O3"), ValueError, "level must be"),
        (lambda m, o: ember.optimize(m, dtype=torch.bfloat16), ValueError, "needs the optimizer"),
        (lambda m, o: ember.optimize(m, optimizer=object()), TypeError, "optimizer must be"),
        (
            lambda m, o: ember.optimize(m, optimizer=torch.optim.RMSprop(m.parameters()), dtype=torch.bfloat16),
            NotImplementedError,
            "no fused replacement for torch.optim.rmsprop.RMSprop",
        ),
        (
            lambda m, o: ember.optimize(m, optimizer=o, dtype=torch.bfloat16, split_master_weight_for_bf16=False),
            NotImplementedError,
            "fp32 master copy",
        ),
    ],
    ids=[
        "eval-with-optimizer",
        "inference-flag",
        "float16",
        "level",
        "no-optimizer",
        "not-an-optimizer",
        "rmsprop",
        "master-copy",
    ],
)
def test_refusals_change_nothing(call, error: type, message: str) -> None:
    model, optimizer = make()
    state = copy.deepcopy(model.state_dict())
    with pytest.raises(error, match=message):
        call(model, optimizer)
    assert bits_equal(model.state_dict(), state) and all(p.dtype == torch.float32 for p in model.parameters())
    assert type(optimizer) is torch.optim.AdamW and "forward" not in model.__dict__


def test_refused_hyperparameters_change_nothing() -> None:
    model, optimizer = make()
    optimizer.param_groups[0]["lr"] = float("nan")
    with pytest.raises(ValueError, match="learning rate"):
        ember.optimize(model, optimizer=optimizer, dtype=torch.bfloat16, inplace=True)
    assert type(optimizer) is torch.optim.AdamW and all(p.dtype == torch.float32 for p in model.parameters())


@pytest.mark.parametrize("kind", [nn.LSTM, nn.GRU, nn.EmbeddingBag])
def test_probed_layers_train_in_bf16_where_torch_can(kind: type[nn.Module]) -> None:
    from ember._optimize.bf16_modules import _bf16_training_failure

    torch.manual_seed(0)
    if kind is nn.EmbeddingBag:
        layer = nn.EmbeddingBag(20, 6, mode="mean")

        def loss_of(model: nn.Module) -> torch.Tensor:
            return model(torch.tensor([1, 4, 7, 9, 2]), torch.tensor([0, 2])).float().pow(2).mean()
    else:
        layer = kind(6, 8, batch_first=True)

        def loss_of(model: nn.Module) -> torch.Tensor:
            return model(torch.randn(2, 5, 6))[0].float().pow(2).mean()

    original = copy.deepcopy(layer.state_dict())
    model, optimizer = ember.optimize(layer, optimizer=torch.optim.Adam(layer.parameters()), dtype=torch.bfloat16)
    failure = _bf16_training_failure(kind)
    expected = torch.float32 if failure else torch.bfloat16
    assert all(p.dtype == expected for p in model.parameters()), failure
    assert bits_equal(model.state_dict(), original)
    for _ in range(2):
        optimizer.zero_grad()
        loss_of(model).backward()
        optimizer.step()
    assert all(v.dtype == torch.float32 for v in model.state_dict().values())
    assert not bits_equal(model.state_dict(), original)


@pytest.mark.parametrize("level", ["O0", "O1"])
def test_transformer_encoder_evaluates_in_eval_mode(level: str) -> None:
    """The validation pass of a trained model: eval mode under no_grad, where torch would take its fused
    encoder-layer kernel (torch 1.13's fails under CPU autocast, so ember keeps the layers off it there)."""
    from ember._optimize.fused_fast_paths import fused_encoder_fails_under_autocast

    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 2, dim_feedforward=32, batch_first=True)
    reference = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval()
    model = copy.deepcopy(reference).train()
    model, _ = ember.optimize(model, optimizer=torch.optim.AdamW(model.parameters()), dtype=torch.bfloat16, level=level)
    model.eval()
    x = torch.randn(3, 5, 16)
    with torch.no_grad():
        out = model(x)
        expected = reference(x)
    assert all(m.activation_relu_or_gelu != fused_encoder_fails_under_autocast() for m in model.layers)
    # bf16 activations (8 significant bits) through two layers of unit-scale outputs: a few bf16 ulps at 1.0.
    torch.testing.assert_close(out.float(), expected, rtol=0.05, atol=0.05)


def with_copies(model: nn.Module) -> tuple[nn.Module, ...]:
    """The model, a deep copy and a pickled round trip of it."""
    return (model, copy.deepcopy(model), pickle.loads(pickle.dumps(model)))


class SelfAttentionBlock(nn.Module):
    """A pre-norm self-attention block as torchvision's ViT writes it: nn.MultiheadAttention called directly."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(16)
        self.attention = nn.MultiheadAttention(16, 2, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.norm(x)
        return x + self.attention(y, y, y, need_weights=False)[0]


@pytest.mark.parametrize("inference", [False, True], ids=["trained, then eval", "optimized for inference"])
def test_self_attention_evaluates_in_eval_mode(inference: bool) -> None:
    """Eval mode under no_grad, where torch would take its fused self-attention kernel (torch 1.13's fails under
    CPU autocast, so ember gives the modules a forward that keeps them off it there); copies keep working."""
    from ember._optimize.fused_fast_paths import CompositeAttentionForward, fused_attention_fails_under_autocast

    torch.manual_seed(0)
    reference = SelfAttentionBlock().eval()
    if inference:
        model = ember.optimize(copy.deepcopy(reference), dtype=torch.bfloat16)
    else:
        model = copy.deepcopy(reference).train()
        model, _ = ember.optimize(model, optimizer=torch.optim.AdamW(model.parameters()), dtype=torch.bfloat16)
        model.eval()
    wrapped = isinstance(model.attention.__dict__.get("forward"), CompositeAttentionForward)
    assert wrapped == fused_attention_fails_under_autocast()
    x = torch.randn(3, 5, 16)
    with torch.no_grad():
        expected = reference(x)
        for candidate in with_copies(model):
            # bf16 activations (8 significant bits) through one block of unit-scale outputs.
            torch.testing.assert_close(candidate(x).float(), expected, rtol=0.05, atol=0.05)


def test_attention_optimized_by_itself_evaluates_in_eval_mode() -> None:
    """A bare nn.MultiheadAttention optimized for bf16 inference: its forward slot holds ember's autocast forward,
    which then runs the composite path where torch 1.13's fused kernel would fail; optimizing again keeps it."""
    from ember._optimize.fused_fast_paths import CompositeAttentionForward, fused_attention_fails_under_autocast

    torch.manual_seed(0)
    reference = nn.MultiheadAttention(16, 2, batch_first=True).eval()
    model = ember.optimize(copy.deepcopy(reference), dtype=torch.bfloat16)
    model = ember.optimize(model, dtype=torch.bfloat16, inplace=True)
    inner = model.__dict__["forward"].inner
    assert isinstance(inner, CompositeAttentionForward) == fused_attention_fails_under_autocast()
    x = torch.randn(3, 5, 16)
    with torch.no_grad():
        expected = reference(x, x, x, need_weights=False)[0]
        for candidate in with_copies(model):
            # bf16 projections (8 significant bits) of unit-scale inputs.
            out = candidate(x, x, x, need_weights=False)[0]
            torch.testing.assert_close(out.float(), expected, rtol=0.05, atol=0.05)


def conv_net_and_optimizer() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 8, 3, groups=2), nn.Flatten(),
        nn.Linear(8 * 4 * 4, 10),
    )  # fmt: skip
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def train_classifier(
    model: nn.Module, optimizer: torch.optim.Optimizer, steps: range, input_shape: tuple[int, ...], classes: int
) -> list[float]:
    """Cross-entropy steps on random batches seeded by the step number; the losses."""
    losses = []
    for step in steps:
        gen = torch.Generator().manual_seed(step)
        x, y = torch.randn(input_shape, generator=gen), torch.randint(0, classes, (input_shape[0],), generator=gen)
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(x).float(), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def train_conv_net(model: nn.Module, optimizer: torch.optim.Optimizer, steps: range) -> list[float]:
    return train_classifier(model, optimizer, steps, (4, 3, 8, 8), 10)


def test_convolutions_train_channels_last_with_plain_checkpoints() -> None:
    model, optimizer = conv_net_and_optimizer()
    train_conv_net(model, optimizer, range(2))  # optimizer state exists before the call, in the NCHW layout
    plain = copy.deepcopy(model.state_dict())
    model, optimizer = ember.optimize(model, optimizer=optimizer, dtype=torch.bfloat16, channels_last=True)
    layout = torch.channels_last
    for conv in (model[0], model[3]):
        weight = conv.weight
        assert weight.is_contiguous(memory_format=layout) and not weight.is_contiguous()
        assert optimizer.master_weight(weight).is_contiguous(memory_format=layout)
        assert all(v.is_contiguous(memory_format=layout) for v in optimizer.state[weight].values() if v.dim() == 4)
    assert bits_equal(model.state_dict(), plain)

    reference, reference_optimizer = conv_net_and_optimizer()
    train_conv_net(reference, reference_optimizer, range(2))
    reference, reference_optimizer = ember.optimize(
        reference, optimizer=reference_optimizer, dtype=torch.bfloat16, channels_last=False
    )
    assert reference[0].weight.is_contiguous()
    losses = train_conv_net(model, optimizer, range(2, 6))
    reference_losses = train_conv_net(reference, reference_optimizer, range(2, 6))
    assert all(g.is_contiguous(memory_format=layout) for g in (model[0].weight.grad, model[3].weight.grad))
    # oneDNN picks other algorithms for the other layout; both accumulate in fp32 from the same bf16 operands.
    torch.testing.assert_close(losses, reference_losses, rtol=2e-2, atol=1e-3)

    stock, _ = conv_net_and_optimizer()
    stock.load_state_dict(model.state_dict())
    assert bits_equal(stock.state_dict(), model.state_dict()) and stock[0].weight.is_contiguous()


def test_bf16_training_is_channels_last_by_default_from_torch_2() -> None:
    # torch 1.13's GELU backward gave NaN after bf16 convolutions with channels-last weights (channels_last.py)
    model, optimizer = conv_net_and_optimizer()
    model, optimizer = ember.optimize(model, optimizer=optimizer, dtype=torch.bfloat16)
    torch2 = int(torch.__version__.split(".")[0]) >= 2
    assert model[0].weight.is_contiguous(memory_format=torch.channels_last) == torch2
    assert model[0].weight.is_contiguous() != torch2


def test_channels_last_flag_is_checked() -> None:
    model, optimizer = make()
    with pytest.raises(TypeError, match="channels_last must be None, True or False"):
        ember.optimize(model, optimizer=optimizer, dtype=torch.bfloat16, channels_last="yes")
    model, optimizer = ember.optimize(model, optimizer=optimizer, channels_last=True)
    assert model.conv.weight.is_contiguous(memory_format=torch.channels_last)


class DropoutNet(nn.Module):
    """nn.Dropout modules where ember.optimize swaps them, and a subclass of it, whose forward it must not touch."""

    class CustomDropout(nn.Dropout):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * 2

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Dropout(0.3), nn.Linear(32, 32), nn.Dropout(0.1))
        self.custom = DropoutNet.CustomDropout(0.5)
        self.head = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.custom(self.body(x)))


def dropout_net_and_optimizer() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = DropoutNet()
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def train_dropout_net(model: nn.Module, optimizer: torch.optim.Optimizer, steps: int) -> list[float]:
    return train_classifier(model, optimizer, range(steps), (16, 12), 4)


def test_dropout_modules_run_on_embers_kernel_for_bf16(capsys: pytest.CaptureFixture[str]) -> None:
    original, optimizer = dropout_net_and_optimizer()
    keys = list(original.state_dict())
    model, optimizer = ember.optimize(original, optimizer=optimizer, dtype=torch.bfloat16, report=True)
    assert "2 nn.Dropout module(s) -> ember.nn.Dropout" in capsys.readouterr().out
    assert type(model.body[2]) is ember.nn.Dropout and model.body[2].p == 0.3
    assert type(model.body[4]) is ember.nn.Dropout and model.body[4].p == 0.1
    assert type(model.custom) is DropoutNet.CustomDropout  # a subclass keeps its own forward
    assert type(original.body[2]) is nn.Dropout  # inplace=False left the original alone
    assert list(model.state_dict()) == keys
    # Seeded runs repeat exactly; the masks are drawn from torch's generator.
    torch.manual_seed(1)
    first = train_dropout_net(*copy.deepcopy((model, optimizer)), 3)
    torch.manual_seed(1)
    again = train_dropout_net(model, optimizer, 3)
    assert first == again


def test_replace_dropout_flag() -> None:
    model, optimizer = dropout_net_and_optimizer()
    with pytest.raises(TypeError, match="replace_dropout must be None, True or False"):
        ember.optimize(model, optimizer=optimizer, dtype=torch.bfloat16, replace_dropout=1)
    kept, _ = ember.optimize(model, optimizer=optimizer, dtype=torch.bfloat16, replace_dropout=False)
    assert type(kept.body[2]) is nn.Dropout
    fp32, _ = ember.optimize(model, optimizer=optimizer)  # float32: only the optimizer changes by default
    assert type(fp32.body[2]) is nn.Dropout
    fp32, fp32_optimizer = ember.optimize(model, optimizer=optimizer, replace_dropout=True)
    assert type(fp32.body[2]) is ember.nn.Dropout
    assert len(train_dropout_net(fp32, fp32_optimizer, 2)) == 2
    o0, _ = ember.optimize(model, optimizer=optimizer, dtype=torch.bfloat16, level="O0")
    assert type(o0.body[2]) is nn.Dropout
