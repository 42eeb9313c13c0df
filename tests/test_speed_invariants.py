"""The speed-ups must not change what is trained on or what the model computes.

* The batched crop/flip (``swalab.data.random_crop_flip``) draws the same distribution of crop offsets
  and flips as torchvision's per-image ``RandomCrop(32, padding=4)`` + ``RandomHorizontalFlip``: every
  offset in [-4, 4] and both flips reachable, uniformly (chi-square bounds on both histograms).
* A loader that normalises the split once (``prenormalize=True``) yields the very same bits as one that
  normalises every batch.
* Training in ``channels_last`` (the trainer's layout on CPU and CUDA) takes the same SGD steps as training
  in the default layout, up to float rounding.
* A ``torch.compile`` d model and the eager one agree on a forward pass (slow; skipped with a reason when
  no compiler is available).
* The BN update that counts batches in Python (``swalab.evaluate.recompute_bn``: momentum ``1 / k`` before a
  layer's k-th batch, no host sync) gives torch's ``update_bn`` statistics (momentum None) bit for bit, a layer
  that some batches skip included.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from swalab.data import DataSplit, ResidentLoader, random_crop_flip

PAD, SIZE, DRAWS = 4, 16, 3000
# 99.9% quantile of chi-square with 8 degrees of freedom (9 offsets), 1 (2 flip outcomes): scipy.stats.chi2.ppf
CHI2_8_999, CHI2_1_999 = 26.12, 10.83


def probe_image() -> torch.Tensor:
    """An image whose pixel (i, j) holds 1 + i * SIZE + j in every channel, so a crop reveals where it was cut."""
    return (1 + torch.arange(SIZE * SIZE, dtype=torch.int32).view(1, SIZE, SIZE)).expand(3, -1, -1).contiguous()


def decode_crop(crop: torch.Tensor, image: torch.Tensor) -> tuple[int, int, bool]:
    """(dy, dx, flipped) of a crop of ``image`` zero-padded by PAD: the shift in [-4, 4] and the mirror.

    The centre pixel of the (un-mirrored) crop always lies inside the image, so its value names the
    row and column it came from; pixel values grow left to right, so a mirrored crop decreases there.
    """
    c = SIZE // 2
    flipped = bool(crop[0, c, c + 1] < crop[0, c, c])
    window = crop.flip(-1) if flipped else crop
    row, col = divmod(int(window[0, c, c]) - 1, SIZE)
    padded = F.pad(image, (PAD,) * 4)
    oy, ox = row - c + PAD, col - c + PAD
    assert torch.equal(padded[:, oy:oy + SIZE, ox:ox + SIZE], window), "crop is not a window of the padded image"
    return oy - PAD, ox - PAD, flipped


def chi_square(counts: np.ndarray) -> float:
    expected = counts.sum() / len(counts)
    return float(((counts - expected) ** 2 / expected).sum())


def histograms(samples: list[tuple[int, int, bool]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    dy = np.bincount([s[0] + PAD for s in samples], minlength=2 * PAD + 1)
    dx = np.bincount([s[1] + PAD for s in samples], minlength=2 * PAD + 1)
    fl = np.bincount([int(s[2]) for s in samples], minlength=2)
    return dy, dx, fl


@functools.lru_cache(maxsize=None)
def swalab_samples(n: int) -> list[tuple[int, int, bool]]:
    image = probe_image()
    padded = F.pad(image, (PAD,) * 4)[None].expand(n, -1, -1, -1)
    _, oy, ox, fl = random_crop_flip(padded, (SIZE, SIZE), torch.Generator().manual_seed(0))
    return [(int(y) - PAD, int(x) - PAD, bool(f)) for y, x, f in zip(oy, ox, fl)]


@functools.lru_cache(maxsize=None)
def torchvision_samples(n: int) -> list[tuple[int, int, bool]]:
    T = pytest.importorskip("torchvision.transforms")
    torch.manual_seed(0)
    transform = T.Compose([T.RandomCrop(SIZE, padding=PAD), T.RandomHorizontalFlip()])
    image = probe_image()
    return [decode_crop(transform(image), image) for _ in range(n)]


def test_batched_crop_flip_reports_the_window_it_cut():
    image = probe_image()
    padded = F.pad(image, (PAD,) * 4)[None].expand(200, -1, -1, -1)
    crops, oy, ox, fl = random_crop_flip(padded, (SIZE, SIZE), torch.Generator().manual_seed(1))
    for crop, y, x, f in zip(crops, oy, ox, fl):
        assert decode_crop(crop, image) == (int(y) - PAD, int(x) - PAD, bool(f))


@pytest.mark.parametrize("source", [swalab_samples, torchvision_samples], ids=["swalab", "torchvision"])
def test_offsets_and_flips_are_uniform_over_every_position(source):
    dy, dx, fl = histograms(source(DRAWS))
    assert (dy > 0).all() and (dx > 0).all() and (fl > 0).all(), "every offset in [-4, 4] and both flips occur"
    assert chi_square(dy) < CHI2_8_999
    assert chi_square(dx) < CHI2_8_999
    assert chi_square(fl) < CHI2_1_999


def test_swalab_and_torchvision_offsets_come_from_the_same_distribution():
    """Two-sample chi-square (homogeneity) test on the joint (dy, dx) histograms, 81 cells."""
    cells = (2 * PAD + 1) ** 2
    a = np.bincount([(y + PAD) * (2 * PAD + 1) + x + PAD for y, x, _ in swalab_samples(DRAWS)], minlength=cells)
    b = np.bincount([(y + PAD) * (2 * PAD + 1) + x + PAD for y, x, _ in torchvision_samples(DRAWS)], minlength=cells)
    pooled = (a + b) / 2
    stat = float((((a - pooled) ** 2 + (b - pooled) ** 2) / pooled).sum())
    assert stat < 124.8  # 99.9% quantile of chi-square with 80 degrees of freedom


def test_shifted_windows_match_torchvision_pixel_for_pixel():
    """For fixed offsets and flips, swalab's batched crop is exactly torchvision's crop (and flip) of the padded image."""
    from swalab.data.loader import _gather_windows

    T = pytest.importorskip("torchvision.transforms.functional")
    image = probe_image()
    padded = F.pad(image, (PAD,) * 4)[None]  # a batch of one
    for oy, ox, flip in [(0, 0, False), (8, 8, True), (3, 7, True), (5, 1, False)]:
        crop = T.crop(T.pad(image, PAD), oy, ox, SIZE, SIZE)
        expected = T.hflip(crop) if flip else crop
        got = _gather_windows(padded, torch.tensor([0]), torch.tensor([oy]), torch.tensor([ox]), torch.tensor([flip]),
                              (SIZE, SIZE))[0]
        assert torch.equal(got, expected), (oy, ox, flip)


@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_prenormalized_loader_yields_the_same_bits(channels_last, dtype):
    g = torch.Generator().manual_seed(3)
    split = DataSplit(torch.randint(0, 256, (70, 3, 12, 12), generator=g, dtype=torch.uint8),
                      torch.randint(0, 10, (70,), generator=g))
    for train in (True, False):
        kw = dict(batch_size=16, device="cpu", mean=[0.49, 0.48, 0.45], std=[0.2, 0.2, 0.2], train=train, seed=5,
                  channels_last=channels_last, dtype=dtype)
        plain, pre = ResidentLoader(split, prenormalize=False, **kw), ResidentLoader(split, prenormalize=True, **kw)
        assert pre.prenormalized and not plain.prenormalized
        for (x0, y0), (x1, y1) in zip(plain, pre, strict=True):
            assert x0.dtype == x1.dtype == dtype
            assert x1.is_contiguous(memory_format=torch.channels_last if channels_last else torch.contiguous_format)
            assert torch.equal(x0, x1) and torch.equal(y0, y1)


def test_prenormalized_eval_batches_do_not_alias_the_resident_split():
    split = DataSplit(torch.full((8, 3, 4, 4), 128, dtype=torch.uint8), torch.zeros(8, dtype=torch.int64))
    loader = ResidentLoader(split, 4, "cpu", [0.5] * 3, [0.5] * 3, train=False, prenormalize=True)
    x, _ = next(iter(loader))
    x.fill_(99.0)  # a model that writes into its input must not corrupt the next epoch
    again, _ = next(iter(loader))
    assert torch.allclose(again, torch.full_like(again, (128 / 255 - 0.5) / 0.5), atol=1e-6)


def test_channels_last_training_takes_the_same_steps_as_the_default_layout(tmp_path):
    """The trainer's run.channels_last only changes the memory layout: an epoch trained with it ends with the
    weights of the same epoch trained without it (to float rounding of another convolution order)."""
    from swalab.methods import SGD
    from swalab.models import PreResNet
    from swalab.optim import OptimizerSpec
    from swalab.schedules import Constant
    from swalab.trainer import Trainer, TrainerOptions

    g = torch.Generator().manual_seed(1)
    split = DataSplit(torch.randint(0, 256, (48, 3, 16, 16), generator=g, dtype=torch.uint8), torch.arange(48) % 10)

    def one_epoch(channels_last: bool) -> list[torch.Tensor]:
        torch.manual_seed(0)
        kw = dict(device="cpu", mean=(0.5,) * 3, std=(0.25,) * 3, channels_last=channels_last)
        train_loader = ResidentLoader(split, 16, train=True, seed=0, pad=2, **kw)
        test_loader = ResidentLoader(split, 16, train=False, **kw)
        trainer = Trainer(PreResNet(depth=8, num_classes=10, in_channels=3), SGD(Constant(lr=0.01), 1), train_loader,
                          test_loader, test_loader, torch.device("cpu"), tmp_path / str(channels_last),
                          TrainerOptions(epochs=1, channels_last=channels_last, handle_signals=False, progress=False,
                                         eval_every=0),
                          optimizer=OptimizerSpec(settings={"momentum": 0.9, "weight_decay": 5e-4}))
        trainer.fit()
        return [p.detach().contiguous() for p in trainer.model.parameters()]

    torch.manual_seed(0)
    initial = [p.detach().clone() for p in PreResNet(depth=8, num_classes=10, in_channels=3).parameters()]
    default, channels_last = one_epoch(False), one_epoch(True)
    assert all(not torch.equal(a, w0) for a, w0 in zip(default, initial))  # every weight moved
    for a, b in zip(default, channels_last):
        torch.testing.assert_close(b, a, rtol=1e-3, atol=2e-5)  # three steps apart only by convolution order


def test_trainer_uses_channels_last_on_cpu(tmp_path):
    from swalab.methods import SGD
    from swalab.schedules import Constant
    from swalab.models import PreResNet
    from swalab.trainer import Trainer, TrainerOptions

    split = DataSplit(torch.randint(0, 256, (8, 3, 8, 8), dtype=torch.uint8), torch.arange(8) % 2)
    loader = ResidentLoader(split, 4, "cpu", (0.5,) * 3, (0.25,) * 3, train=False, channels_last=True)
    trainer = Trainer(PreResNet(depth=8, num_classes=2, in_channels=3), SGD(Constant(lr=0.1), 1), loader, loader, loader,
                      torch.device("cpu"), tmp_path, TrainerOptions(epochs=1, handle_signals=False))
    conv = next(m for m in trainer.model.modules() if isinstance(m, torch.nn.Conv2d))
    assert conv.weight.is_contiguous(memory_format=torch.channels_last)
    assert next(iter(loader))[0].is_contiguous(memory_format=torch.channels_last)


@pytest.mark.slow
def test_compiled_and_eager_models_agree_on_a_forward_pass():
    from swalab.models import PreResNet

    torch.manual_seed(0)
    model = PreResNet(depth=20, num_classes=10, in_channels=3).eval()
    x = torch.randn(4, 3, 32, 32)
    import shutil

    if not any(shutil.which(cc) for cc in ("g++", "c++", "clang++")):
        pytest.skip("torch.compile's CPU backend needs a C++ compiler, and none is on PATH")
    with torch.no_grad():
        eager = model(x)
        compiled = torch.compile(model)(x)  # any failure with a compiler present is a failure, not a skip
    torch.testing.assert_close(compiled, eager, rtol=1e-4, atol=1e-4)


class Branchy(torch.nn.Module):
    """BatchNorm 2d and 1d, and a BN layer that only batches of more than 6 images pass through."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv, self.bn = torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.BatchNorm2d(4)
        self.side = torch.nn.BatchNorm2d(4)
        self.fc, self.bn1d = torch.nn.Linear(4 * 8 * 8, 6), torch.nn.BatchNorm1d(6)

    def forward(self, x):
        h = torch.relu(self.bn(self.conv(x)))
        if len(x) > 6:
            h = self.side(h)
        return self.bn1d(self.fc(h.flatten(1)))


def test_a_bn_update_counting_batches_in_python_equals_torchs_update_bn_bit_for_bit():
    from torch.optim.swa_utils import update_bn

    from swalab.evaluate import recompute_bn

    g = torch.Generator().manual_seed(3)
    batches = [(torch.randn(n, 3, 8, 8, generator=g) * 2 + 1, torch.zeros(n)) for n in (8, 7, 5, 8, 3, 6, 8)]
    ours, theirs = Branchy().eval(), Branchy().eval()
    for model in (ours, theirs):
        model.bn.running_mean.fill_(5.0)  # stale statistics, as an average's are
    recompute_bn(ours, batches, torch.device("cpu"))
    update_bn(batches, theirs)
    for name, value in theirs.state_dict().items():
        assert torch.equal(ours.state_dict()[name], value), name
    assert int(ours.side.num_batches_tracked) == 4 and int(ours.bn.num_batches_tracked) == 7
    assert not ours.training and all(m.momentum == 0.1 for m in (ours.bn, ours.side, ours.bn1d))
