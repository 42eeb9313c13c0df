"""EDM2's power-function EMA (swalab.powerema): the width and its inverse, the recurrence against its profile, the
least-squares rebuild of one width from the snapshots of two others, and ``run.powerema`` in a run (written into
every snapshot, continued exactly by a resume, no part of the identity).

The runs are the tiny SWA run of tests/test_reliability.py (PreResNet-8 on 256 digits, batch 64: 4 steps per epoch,
4 epochs).
"""

from __future__ import annotations

import math

import pytest
import torch
from omegaconf import OmegaConf

from swalab.config import ConfigError
from swalab.identity import identity_of
from swalab.powerema import (PowerEMA, beta, check_widths, coefficients, gamma_of, label_of, profile_dot,
                             profile_error, sigma_rel_of)
from swalab.snapshots import snapshots_of
from swalab.train import train
from test_reliability import make_cfg, run_cli

# A stand-in trajectory of weights: 2000 steps of a noisy descent towards a drifting point, 64 coordinates.
STEPS, EVERY, WIDTH = 2000, 20, 64


def trajectory() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    theta, out = torch.randn(WIDTH, generator=g) * 3, []
    for t in range(1, STEPS + 1):
        target = torch.sin(torch.arange(WIDTH) + t / 300.0)
        theta = theta + 0.01 * (target - theta) + 0.05 * torch.randn(WIDTH, generator=g)
        out.append(theta.clone())
    return out


def tracked(widths, every=EVERY) -> tuple[dict[str, list[tuple[int, torch.Tensor]]], dict[str, torch.Tensor]]:
    """Power EMAs of :func:`trajectory` in float64: ``({label: [(t, average)] every ``every`` steps}, {label: the
    final average})``."""
    model = torch.nn.Linear(WIDTH, 1, bias=False).double()
    ema = PowerEMA(tuple(widths))
    snaps: dict[str, list[tuple[int, torch.Tensor]]] = {label_of(w): [] for w in widths}
    for t, theta in enumerate(trajectory(), start=1):
        with torch.no_grad():
            model.weight.copy_(theta.double()[None])
        ema.update(model)
        if t % every == 0:
            for label, tensors in ema.averages.items():
                snaps[label].append((t, tensors[0][0].double().clone()))
    return snaps, {label: tensors[0][0].double().clone() for label, tensors in ema.averages.items()}


def rebuild(snaps, sigma_rel: float) -> tuple[torch.Tensor, float]:
    """The average of width ``sigma_rel`` at the last snapshot, from every snapshot of every tracked width."""
    sources, averages = [], []
    for label, items in snaps.items():
        for t, average in items:
            sources.append((float(t), gamma_of(float(label))))
            averages.append(average)
    target = (float(STEPS), gamma_of(sigma_rel))
    x = coefficients(sources, target)
    return sum(float(xi) * a for xi, a in zip(x, averages)), profile_error(sources, target, x)


def relative(a: torch.Tensor, b: torch.Tensor, live: torch.Tensor) -> float:
    """|a - b| over how far the average b is from the live weights: the error as a share of what averaging moved."""
    return float((a - b).norm() / (b - live).norm())


def test_the_width_and_its_inverse_agree_with_the_papers_exponents():
    assert gamma_of(0.05) == pytest.approx(16.97, abs=0.01)  # EDM2 Section 3: sigma_rel 0.05 and 0.10
    assert gamma_of(0.10) == pytest.approx(6.94, abs=0.01)
    for s in (0.01, 0.05, 0.10, 0.2, 0.28):
        assert sigma_rel_of(gamma_of(s)) == pytest.approx(s, rel=1e-12)
    assert sigma_rel_of(0.0) == pytest.approx(1 / math.sqrt(12))  # gamma 0: the uniform average of all steps


def test_the_recurrence_gives_each_step_the_integral_of_the_profile_over_it():
    gamma, steps = gamma_of(0.1), 50
    weights = torch.zeros(steps, dtype=torch.float64)
    for t in range(1, steps + 1):
        weights *= beta(t, gamma)
        weights[t - 1] += 1 - beta(t, gamma)
    tau = torch.arange(1, steps + 1, dtype=torch.float64)
    assert torch.allclose(weights, (tau ** (gamma + 1) - (tau - 1) ** (gamma + 1)) / steps ** (gamma + 1), atol=1e-14)


def test_the_inner_product_of_two_profiles_is_the_integral_of_their_product():
    ta, ga, tb, gb = 300.0, 6.9, 1000.0, 17.0
    tau = torch.linspace(0, ta, 2_000_001, dtype=torch.float64)
    pa = (ga + 1) * tau ** ga / ta ** (ga + 1)
    pb = (gb + 1) * tau ** gb / tb ** (gb + 1)
    assert float(torch.trapezoid(pa * pb, tau)) == pytest.approx(profile_dot(ta, ga, tb, gb), rel=1e-6)
    assert profile_dot(ta, ga, tb, gb) == profile_dot(tb, gb, ta, ga)


# The error is |rebuilt - direct| / |direct - live weights|: a share of how far averaging moved the weights. Measured
# on this trajectory (100 snapshots of each of 0.05 and 0.10, float64): at a tracked width the rebuild is its last
# snapshot, 5e-15; at 0.07 (between the tracked) 2.0e-6, at 0.15 2.3e-6, at 0.03 (narrower than both) 6.2e-5 and at
# 0.2 4.5e-5, with profile errors (|rebuilt - target| / |target| in L2) of 1.0e-4, 2.4e-4, 1.2e-3 and 7.2e-4. The
# tolerances are about 10x the measured errors.
TRACKED_TOL = 1e-12
OTHER_TOL = {0.03: 5e-4, 0.07: 2e-5, 0.15: 2e-5, 0.2: 5e-4}


def test_a_tracked_width_is_rebuilt_as_its_own_last_snapshot():
    snaps, final = tracked([0.05, 0.10])
    live = trajectory()[-1].double()
    for s in (0.05, 0.10):
        rebuilt, error = rebuild(snaps, s)
        assert relative(rebuilt, final[label_of(s)], live) < TRACKED_TOL
        assert error < 1e-6


@pytest.mark.parametrize("sigma_rel", sorted(OTHER_TOL))
def test_another_width_rebuilt_from_two_tracked_ones_matches_an_ema_of_that_width_tracked_directly(sigma_rel):
    snaps, _ = tracked([0.05, 0.10])
    _, direct = tracked([sigma_rel])
    rebuilt, _ = rebuild(snaps, sigma_rel)
    live = trajectory()[-1].double()
    assert relative(rebuilt, direct[label_of(sigma_rel)], live) < OTHER_TOL[sigma_rel]
    # and the rebuild is no trivial pick: the nearer tracked width is 0.28 (of what averaging moved) from it at least
    nearest = min(relative(snaps[label][-1][1], direct[label_of(sigma_rel)], live) for label in ("0.05", "0.10"))
    assert nearest > 100 * OTHER_TOL[sigma_rel]


def test_widths_out_of_range_or_repeated_are_refused_naming_the_key():
    assert check_widths([0.05, "0.1"]) == (0.05, 0.1)
    for bad in ([0.0], [0.31], [0.05, 0.05], ["wide"]):
        with pytest.raises(ConfigError, match=r"run\.powerema="):
            check_widths(bad)


# -- in a run -----------------------------------------------------------------------------------------------------
def test_every_snapshot_holds_the_tracked_averages_at_its_step_and_the_live_weights_are_those_of_a_run_without(
        tmp_path):
    plain, tracking = tmp_path / "plain", tmp_path / "tracking"
    train(make_cfg("run.snapshots=1"), run_dir=plain)
    train(make_cfg("run.snapshots=1", "run.powerema=[0.05,0.10]"), run_dir=tracking)
    for a, b in zip(snapshots_of(plain), snapshots_of(tracking)):
        sa, sb = (torch.load(s.path, weights_only=True) for s in (a, b))
        assert all(torch.equal(sa["model"][k], sb["model"][k]) for k in sa["model"])  # training is unchanged
        power = sb["powerema"]
        assert power["t"] == 4 * sb["epoch"] and power["sigma_rels"] == {"0.05": 0.05, "0.10": 0.10}
        assert set(power["averages"]) == {"0.05", "0.10"} and power["averages"]["0.05"].keys() == sb["model"].keys()
        assert not torch.equal(power["averages"]["0.05"]["conv1.weight"], sb["model"]["conv1.weight"])


def test_power_ema_without_snapshots_is_refused_before_anything_is_written(tmp_path):
    run = tmp_path / "run"
    with pytest.raises(ConfigError, match=r"run\.powerema=\[0\.05\] is written only into snapshots"):
        train(make_cfg("run.powerema=[0.05]"), run_dir=run)
    assert not run.exists()


def test_power_ema_is_no_part_of_the_run_identity():
    def identity(*overrides):
        return identity_of(OmegaConf.to_container(make_cfg(*overrides), resolve=True))

    assert identity("run.snapshots=1", "run.powerema=[0.05,0.10]") == identity()


def test_a_run_killed_and_resumed_continues_its_power_emas_bit_for_bit(tmp_path):
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    args = ("run.snapshots=1", "run.powerema=[0.05,0.10]")
    assert run_cli(straight, *args).returncode == 0
    first = run_cli(killed, *args, fault="train_step:11")  # step 4 of epoch 3: after two epochs' checkpoints
    assert first.returncode != 0 and not (killed / "snapshots" / "epoch0003.pt").exists()
    resumed = run_cli(killed, *args)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    for a, b in zip(snapshots_of(killed), snapshots_of(straight)):
        pa, pb = (torch.load(s.path, weights_only=True)["powerema"] for s in (a, b))
        assert pa["t"] == pb["t"]
        for label in pb["averages"]:
            assert all(torch.equal(pa["averages"][label][k], pb["averages"][label][k]) for k in pb["averages"][label])


def test_a_width_refused_on_the_command_line_is_shown_and_fixed_as_the_command_line_takes_it():
    """posthoc's --powerema takes widths apart (--powerema 0.05 0.1): its refusal must not show run.powerema's yaml
    list (--powerema=[0.05,0.10] is no value argparse takes); run.powerema's keeps the yaml spelling."""
    with pytest.raises(ConfigError, match=r"^--powerema 0.5 0.05: width 0.5 is out of range; give relative widths "
                                          r"sigma_rel in \(0, 0.3003\], e.g. --powerema 0.05 0.1 \(the paper's\)$"):
        check_widths([0.5, 0.05], key="--powerema")
    with pytest.raises(ConfigError, match=r"^run.powerema=\[0.5\]: .* e.g. run.powerema=\[0.05,0.10\]"):
        check_widths([0.5])
