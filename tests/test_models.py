"""Tests for the CIFAR model zoo in ``swalab.models``.

Measured parameter counts (10 / 100 classes):

* VGG-16:              15,245,130 / 15,291,300   (reference 15.25M / 15.29M)
* PreResNet-110:        1,146,842 /  1,169,972   (reference 1.15M / 1.17M)
* PreResNet-164:        1,703,258 /  1,726,388   (reference 1.70M / 1.73M)
* WRN-28-10:           36,489,290 / 36,546,980   (reference 36.49M / 36.55M)
* PyramidNet-272 a200: 26,210,842 / 26,288,692   (paper 26.0M; +1.1% on C100)
* Shake-Shake-26 2x64d: 11,653,978 / 11,677,108  (reference about 11.6M; +0.5%)
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from swalab.models import (
    VGG16,
    PreResNet,
    PyramidNet,
    ShakeShake,
    WideResNet,
    count_parameters,
)
from swalab.models.shake_shake import shake_shake


def _millions(model: nn.Module) -> float:
    return round(count_parameters(model) / 1e6, 2)


# --------------------------------------------------------------------------------------
# Parameter counts (construction only, no forward pass: fast even for the big models).
# --------------------------------------------------------------------------------------

EXACT_COUNTS = [
    pytest.param(lambda k: VGG16(num_classes=k), 10, 15.25, id="vgg16-c10"),
    pytest.param(lambda k: VGG16(num_classes=k), 100, 15.29, id="vgg16-c100"),
    pytest.param(lambda k: PreResNet(110, num_classes=k), 10, 1.15, id="preresnet110-c10"),
    pytest.param(lambda k: PreResNet(110, num_classes=k), 100, 1.17, id="preresnet110-c100"),
    pytest.param(lambda k: PreResNet(164, num_classes=k), 10, 1.70, id="preresnet164-c10"),
    pytest.param(lambda k: PreResNet(164, num_classes=k), 100, 1.73, id="preresnet164-c100"),
    pytest.param(lambda k: WideResNet(28, 10, num_classes=k), 10, 36.49, id="wrn28-10-c10"),
    pytest.param(lambda k: WideResNet(28, 10, num_classes=k), 100, 36.55, id="wrn28-10-c100"),
]


@pytest.mark.parametrize("factory, num_classes, expected_millions", EXACT_COUNTS)
def test_parameter_count_matches_reference(factory, num_classes, expected_millions):
    model = factory(num_classes)
    assert _millions(model) == pytest.approx(expected_millions, abs=1e-9)


APPROX_COUNTS = [
    # Measured 26,288,692 (C100) for PyramidNet-272, alpha 200, bottleneck: 26.29M, +1.1% vs 26.0M.
    pytest.param(lambda: PyramidNet(272, 200, num_classes=100), 26.0e6, id="pyramidnet272-c100"),
    # Measured 11,653,978 (C10) for Shake-Shake-26 2x64d: 11.65M, +0.5% vs 11.6M.
    pytest.param(lambda: ShakeShake(26, 64, num_classes=10), 11.6e6, id="shakeshake26-2x64d-c10"),
]


@pytest.mark.parametrize("factory, expected", APPROX_COUNTS)
def test_parameter_count_within_two_percent(factory, expected):
    assert count_parameters(factory()) == pytest.approx(expected, rel=0.02)


def test_preresnet20_is_small_basic_net():
    model = PreResNet(20)
    assert model.blocks_per_stage == 3
    assert _millions(model) == 0.27


def test_count_parameters_helper():
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    assert count_parameters(model) == 3 * 4 + 4 + 4 + 4
    model[0].weight.requires_grad_(False)
    assert count_parameters(model, trainable_only=True) == 4 + 4 + 4


# --------------------------------------------------------------------------------------
# Forward passes.
# --------------------------------------------------------------------------------------

SMALL_MODELS = [
    pytest.param(lambda k, c: VGG16(num_classes=k, in_channels=c), id="vgg16"),
    pytest.param(lambda k, c: PreResNet(20, num_classes=k, in_channels=c), id="preresnet20"),
    pytest.param(lambda k, c: PreResNet(110, num_classes=k, in_channels=c), id="preresnet110"),
    pytest.param(lambda k, c: PreResNet(164, num_classes=k, in_channels=c), id="preresnet164"),
    pytest.param(lambda k, c: WideResNet(16, 2, num_classes=k, dropout=0.3, in_channels=c), id="wrn16-2"),
    pytest.param(lambda k, c: PyramidNet(20, 48, num_classes=k, bottleneck=False, in_channels=c), id="pyramidnet20-basic"),
    pytest.param(lambda k, c: PyramidNet(29, 48, num_classes=k, bottleneck=True, in_channels=c), id="pyramidnet29-bottleneck"),
    pytest.param(lambda k, c: ShakeShake(26, 64, num_classes=k, in_channels=c), id="shakeshake26-2x64d"),
]


@pytest.mark.parametrize("factory", SMALL_MODELS)
@pytest.mark.parametrize("num_classes", [10, 100])
def test_forward_shape_small_models(factory, num_classes):
    torch.manual_seed(0)
    model = factory(num_classes, 3)
    x = torch.randn(2, 3, 32, 32)
    for train in (True, False):
        model.train(train)
        with torch.no_grad():
            out = model(x)
        assert out.shape == (2, num_classes)
        assert torch.isfinite(out).all()


@pytest.mark.parametrize("factory", SMALL_MODELS[:2] + SMALL_MODELS[4:])
def test_single_channel_input(factory):
    model = factory(10, 1).eval()
    with torch.no_grad():
        out = model(torch.randn(2, 1, 32, 32))
    assert out.shape == (2, 10)


def test_preresnet20_on_8x8_single_channel():
    """sklearn digits: 1x8x8 images, 10 classes; also trains (backward works)."""
    torch.manual_seed(0)
    model = PreResNet(20, num_classes=10, in_channels=1)
    x = torch.randn(2, 1, 8, 8)
    out = model(x)
    assert out.shape == (2, 10)
    out.sum().backward()
    assert all(p.grad is not None for p in model.parameters())
    model.eval()
    with torch.no_grad():
        assert model(x).shape == (2, 10)


@pytest.mark.slow
@pytest.mark.parametrize(
    "factory, num_classes",
    [
        pytest.param(lambda: WideResNet(28, 10, num_classes=10), 10, id="wrn28-10"),
        pytest.param(lambda: PyramidNet(272, 200, num_classes=100), 100, id="pyramidnet272"),
    ],
)
def test_forward_shape_big_models(factory, num_classes):
    model = factory().eval()
    with torch.no_grad():
        out = model(torch.randn(2, 3, 32, 32))
    assert out.shape == (2, num_classes)
    assert torch.isfinite(out).all()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("factory", SMALL_MODELS)
def test_forward_backward_on_cuda(factory):
    model = factory(10, 3).cuda()
    x = torch.randn(4, 3, 32, 32, device="cuda")
    out = model(x)
    assert out.shape == (4, 10)
    out.sum().backward()


# --------------------------------------------------------------------------------------
# Shake-Shake stochasticity.
# --------------------------------------------------------------------------------------


def test_shake_shake_train_is_stochastic_eval_is_deterministic():
    torch.manual_seed(0)
    model = ShakeShake(8, 16, num_classes=10)
    x = torch.randn(2, 3, 32, 32)
    model.train()
    with torch.no_grad():
        torch.manual_seed(1)
        a = model(x)
        torch.manual_seed(2)
        b = model(x)
        torch.manual_seed(1)
        a_again = model(x)
    assert not torch.allclose(a, b)
    torch.testing.assert_close(a, a_again)

    model.eval()
    with torch.no_grad():
        torch.manual_seed(1)
        c = model(x)
        torch.manual_seed(2)
        d = model(x)
    torch.testing.assert_close(c, d, rtol=0, atol=0)


def test_shake_shake_function_forward_alpha_backward_beta():
    torch.manual_seed(0)
    n = 64
    x1 = torch.ones(n, 3, 4, 4, requires_grad=True)
    x2 = torch.zeros(n, 3, 4, 4, requires_grad=True)
    out = shake_shake(x1, x2, training=True)
    alpha = out.detach()  # with x1 = 1 and x2 = 0 the output is alpha
    # One coefficient per sample, in [0, 1].
    assert torch.all(alpha == alpha[:, :1, :1, :1])
    assert alpha.min() >= 0 and alpha.max() <= 1
    assert alpha.flatten(1)[:, 0].unique().numel() == n
    out.sum().backward()
    beta = x1.grad
    assert torch.all(beta == beta[:, :1, :1, :1])
    torch.testing.assert_close(x1.grad + x2.grad, torch.ones_like(x1.grad))
    # The backward coefficient is drawn independently of the forward one.
    assert not torch.allclose(beta, alpha)

    # Eval: plain average, gradients 0.5 each.
    y1 = torch.randn(2, 3, requires_grad=True)
    y2 = torch.randn(2, 3, requires_grad=True)
    out = shake_shake(y1, y2, training=False)
    torch.testing.assert_close(out, 0.5 * (y1 + y2))
    out.sum().backward()
    torch.testing.assert_close(y1.grad, torch.full_like(y1, 0.5))


def test_shake_shake_gradcheck_with_fixed_coefficients():
    from swalab.models.shake_shake import _ShakeShakeFunction

    x1 = torch.randn(3, 2, dtype=torch.double, requires_grad=True)
    x2 = torch.randn(3, 2, dtype=torch.double, requires_grad=True)
    alpha = torch.rand(3, 1, dtype=torch.double)
    # With beta == alpha the custom backward is the true gradient.
    assert torch.autograd.gradcheck(
        lambda a, b: _ShakeShakeFunction.apply(a, b, alpha, alpha), (x1, x2)
    )


# --------------------------------------------------------------------------------------
# Depth validation.
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("depth", [0, 2, 21, 44, 50, 111])
def test_preresnet_bad_depth(depth):
    with pytest.raises(ValueError, match=r"valid: 8, 14, 20.*110.*164"):
        PreResNet(depth)


@pytest.mark.parametrize(
    "factory, pattern",
    [
        (lambda: WideResNet(depth=27), r"6n\+4.*valid: 10, 16, 22, 28"),
        (lambda: PyramidNet(depth=271), r"9n\+2.*valid: .*272"),
        (lambda: PyramidNet(depth=21, bottleneck=False), r"6n\+2.*valid: 8, 14, 20"),
        (lambda: ShakeShake(depth=25), r"6n\+2.*valid: .*26"),
    ],
)
def test_other_models_bad_depth(factory, pattern):
    with pytest.raises(ValueError, match=pattern):
        factory()


def test_models_never_choose_a_device_themselves(monkeypatch):
    """Device and dtype live in the trainer: building a model or running it never moves a tensor to CUDA by itself."""
    def no_cuda(*args, **kwargs):
        raise AssertionError("a model moved itself to CUDA")

    monkeypatch.setattr(torch.Tensor, "cuda", no_cuda)
    monkeypatch.setattr(nn.Module, "cuda", no_cuda)
    for model in (VGG16(), PreResNet(20), WideResNet(16, 2), PyramidNet(20, 48, bottleneck=False), ShakeShake(8, 16)):
        out = model.eval()(torch.randn(2, 3, 32, 32))
        assert out.shape == (2, 10) and out.device.type == "cpu"
        assert {p.device.type for p in [*model.parameters(), *model.buffers()]} == {"cpu"}
