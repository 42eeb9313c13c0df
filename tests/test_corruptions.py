"""The five CIFAR-10-C corruptions that call ImageMagick, OpenCV or photographs in the reference (glass blur, motion
blur, snow, frost, elastic), checked against what the reference's code does."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from swalab.data import corruptions


@pytest.fixture
def frost_photos(tmp_path, monkeypatch):
    """Five flat-coloured stand-ins for the frost photographs (image k has value 40 k + 20), found as if installed."""
    for k, name in enumerate(corruptions.FROST_FILES):
        Image.fromarray(np.full((300, 400, 3), 40 * k + 20, dtype=np.uint8)).save(tmp_path / name)
    monkeypatch.setattr(corruptions, "frost_dir", lambda: tmp_path)
    return tmp_path


def reference_glass_shuffle(x: np.ndarray, dx: np.ndarray, dy: np.ndarray) -> np.ndarray:
    """The reference's loop, statement for statement (its numpy "swap"), drawing the offsets of (h, w) from dx, dy."""
    x = x.copy()
    for h in range(x.shape[0] - 1, 1, -1):
        for w in range(x.shape[1] - 1, 1, -1):
            h_prime, w_prime = h + dy[h - 2, w - 2], w + dx[h - 2, w - 2]
            x[h, w], x[h_prime, w_prime] = x[h_prime, w_prime], x[h, w]
    return x


def test_glass_blurs_shuffle_is_the_references_walk_done_at_once():
    rng = np.random.default_rng(3)
    x = rng.random((32, 32, 3))
    c = corruptions.PARAMETERS_32["glass_blur"][4]  # two passes
    out = corruptions.glass_blur(x, c, np.random.default_rng(7))
    draws = np.random.default_rng(7)
    expected = np.uint8(corruptions._gaussian(x, c[0]) * 255)
    for _ in range(c[2]):
        dx, dy = draws.integers(-1, 1, size=(2, 30, 30))
        expected = reference_glass_shuffle(expected, dx, dy)
    np.testing.assert_allclose(out, corruptions._gaussian(expected / 255, c[0]))


def test_magick_motion_blur_drags_a_point_into_a_one_sided_gaussian_streak_along_the_angle():
    x = np.zeros((32, 32, 1))
    x[16, 20] = 1.0
    radius, sigma = 6, 2.0
    weights = np.exp(-np.arange(13) ** 2 / (2 * sigma ** 2))
    weights /= weights.sum()  # 2 ceil(radius) + 1 = 13 taps
    along = corruptions.magick_motion_blur(x, radius, sigma, 0.0)[16, :, 0]  # pixel x sums the pixels at x + i
    np.testing.assert_allclose(along[20 - np.arange(13)], weights)
    assert along.sum() == pytest.approx(1.0)
    down = corruptions.magick_motion_blur(x, radius, sigma, 90.0)[:, 20, 0]  # angle 90: the taps go down the rows
    np.testing.assert_allclose(down[16 - np.arange(13)], weights, atol=1e-12)


def test_motion_blur_repeats_the_edge_beyond_the_image():
    x = np.full((8, 8, 3), 0.3)
    np.testing.assert_allclose(corruptions.magick_motion_blur(x, 6, 1.0, 30.0), x)


def test_frost_blends_a_crop_of_a_shrunk_photograph_by_the_published_weights(frost_photos):
    layers = corruptions.frost_layers(str(frost_photos))
    assert [layer.shape for layer in layers] == [(60, 80, 3)] * 5  # 300x400 shrunk 5 times, as cv2.resize(fx=0.2)
    x = np.full((32, 32, 3), 0.5)
    c = corruptions.PARAMETERS_32["frost"][2]
    out = corruptions.frost(x, c, np.random.default_rng(0))
    k = np.random.default_rng(0).integers(5)  # the photograph the crop comes from
    np.testing.assert_allclose(out, c[0] * 0.5 + c[1] * (40 * k + 20) / 255)
    grey = corruptions.frost(np.full((8, 8, 1), 0.5), c, np.random.default_rng(0))
    assert grey.shape == (8, 8, 1)


def test_the_frost_photographs_shrink_by_sampling_every_fifth_pixel_from_the_third(tmp_path, monkeypatch):
    a = (np.arange(23 * 27 * 3) % 251).astype(np.uint8).reshape(23, 27, 3)
    for name in corruptions.FROST_FILES:
        Image.fromarray(a).save(tmp_path / name)
    layer = corruptions.frost_layers(str(tmp_path))[0]
    np.testing.assert_allclose(layer * 255, a[2::5, 2::5][:5, :5])  # round(23 / 5) x round(27 / 5)


def test_without_imagecorruptions_frost_is_refused_saying_what_to_install(monkeypatch):
    monkeypatch.setattr(corruptions, "frost_dir", lambda: None)
    with pytest.raises(corruptions.CorruptionError, match=r"frost photographs of PyPI's imagecorruptions.*swalab\[frost\]"):
        corruptions.check("frost", 1)


@pytest.mark.skipif(corruptions.frost_dir() is None, reason="imagecorruptions is not installed (pip install 'swalab[frost]')")
def test_the_installed_frost_photographs_frost_a_cifar_sized_image():
    images = torch.full((2, 3, 32, 32), 100, dtype=torch.uint8)
    out = corruptions.corrupt_images(images, "frost", 5)
    assert out.float().mean() > 100 * 0.75 and not torch.equal(out[0], out[1])  # ice added, a crop of its own each


def test_affine_from_points_and_warp_affine_follow_opencvs_conventions():
    src = np.array([[20.0, 20.0], [20.0, 12.0], [12.0, 12.0]])
    m = corruptions.affine_from_points(src, src + [2.0, 0.0])  # a shift of 2 pixels to the right, in (x, y)
    np.testing.assert_allclose(m, [[1, 0, 2], [0, 1, 0]], atol=1e-12)
    x = np.random.default_rng(0).random((8, 8, 1))
    shifted = corruptions.warp_affine(x, m)
    np.testing.assert_allclose(shifted[:, 2:], x[:, :-2])  # output (x, y) reads the input at (x - 2, y)
    np.testing.assert_allclose(shifted[:, :2], x[:, [2, 1]])  # BORDER_REFLECT_101: mirrored about the edge pixel


def test_elastic_at_severity_1_only_warps_and_keeps_the_image_close():
    x = np.random.default_rng(0).random((32, 32, 3))
    out = corruptions.elastic_transform(x, corruptions.PARAMETERS_32["elastic_transform"][0], np.random.default_rng(1))
    assert out.shape == x.shape and 0 < np.abs(out - x).mean() < 0.5


def test_snow_whitens_and_adds_flakes_and_its_own_half_turn():
    x = np.full((32, 32, 3), 0.2)
    out = corruptions.snow(x, corruptions.PARAMETERS_32["snow"][4], np.random.default_rng(0))
    assert out.shape == x.shape and out.min() >= 0.2 and out.max() > 0.6


@pytest.mark.parametrize("name", ["glass_blur", "motion_blur", "snow", "frost", "elastic_transform"])
def test_the_five_are_made_deterministically_per_image_for_rgb_and_grey(name, frost_photos):
    for shape in [(4, 3, 32, 32), (3, 1, 8, 8)]:
        images = torch.randint(0, 256, shape, generator=torch.Generator().manual_seed(0), dtype=torch.uint8)
        out = corruptions.corrupt_images(images, name, 4)
        assert out.shape == images.shape and not torch.equal(out, images)
        assert torch.equal(out[:1], corruptions.corrupt_images(images[:1], name, 4))
