"""The loss-surface analyses: plane geometry, rays, segment, resumability, curves, experiment configs.

The runs here are fabricated in a temporary directory (a resolved ``config.yaml`` plus ``final.pt``
and checkpoints) around tiny models on a few hundred of scikit-learn's 8x8 digits, so every test
runs in seconds on a CPU.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf
from torch.optim.swa_utils import update_bn

from swalab.analysis import curves, plane, rays, segment
from swalab.analysis.loading import analysis_data
from swalab.results.runs import Run, open_run
from swalab.runweights import load_weights
from swalab.analysis.plane import Plane
from swalab.analysis.weights import ParamSpace, random_unit_directions
from swalab.checkpoint import save_checkpoint
from swalab.config import ConfigError
from swalab.evaluate import predict_logits

CONF = Path(__file__).resolve().parents[1] / "conf"

LINEAR = {"_target_": "torch.nn.Sequential",
          "_args_": [{"_target_": "torch.nn.Flatten"}, {"_target_": "torch.nn.Linear", "in_features": 64,
                                                         "out_features": 10}]}
SMALL_BN = {"_target_": "torch.nn.Sequential",
            "_args_": [{"_target_": "torch.nn.Conv2d", "in_channels": 1, "out_channels": 4, "kernel_size": 3},
                       {"_target_": "torch.nn.BatchNorm2d", "num_features": 4},
                       {"_target_": "torch.nn.ReLU"},
                       {"_target_": "torch.nn.Flatten"},
                       {"_target_": "torch.nn.Linear", "in_features": 144, "out_features": 10}]}


def fake_run(root: Path, arch: dict, weight_decay: float, states: dict, checkpoints: dict | None = None,
             train_size: int = 300) -> Path:
    """A run directory as ``train()`` leaves it, with the given weights and a digits config."""
    cfg = {"seed": 0,
           "dataset": {"name": "digits", "num_classes": 10, "mean": [0.305], "std": [0.376], "pad": 1, "flip": False,
                       "source": {"_target_": "swalab.data.load_digits", "train_size": train_size, "seed": 0}},
           "model": {"name": "toy", "arch": arch, "mean": None, "std": None},
           "trainer": {"batch_size": 64, "eval_batch_size": 500, "weight_decay": weight_decay,
                       "channels_last": False, "bn_update_fraction": 1.0}}
    root.mkdir(parents=True)
    (root / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(cfg)))
    torch.save({"model": states["sgd"], "methods": {"swa": states["swa"]}}, root / "final.pt")
    (root / "metrics.json").write_text('{"swa": {"acc": 0.0}, "sgd": {"acc": 0.0}}')  # finished, as train() leaves it
    for epoch, state in (checkpoints or {}).items():
        save_checkpoint({"model": state, "epoch": epoch}, root / "checkpoints", epoch, keep=100)
    return root


def bn_states(seed: int = 0) -> dict:
    """Two nearby BN networks with non-trivial running statistics: ``swa`` and ``sgd``."""
    torch.manual_seed(seed)
    run = load_run_like(SMALL_BN)
    a = run.model()
    b = run.model()
    with torch.no_grad():
        for pa, pb in zip(a.parameters(), b.parameters()):
            pb.copy_(pa + 0.05 * torch.randn_like(pa))
    x = torch.randn(64, 1, 8, 8)
    a.train()(x)
    b.train()(x + 0.3)
    return {"swa": a.state_dict(), "sgd": b.state_dict()}


def load_run_like(arch: dict):
    run = Run(Path("."))
    run.config = {"model": {"arch": arch}, "dataset": {}}  # a run directory's config, without the directory
    return run


def direct_metrics(run_dir: Path, state: dict, bn_update: bool) -> dict:
    """Train CE / test error of ``state`` computed without the analysis code, for comparison."""
    run = open_run(run_dir)
    model = run.model()
    model.load_state_dict(state)
    data = analysis_data(run, torch.device("cpu"))
    if bn_update:
        data.bn.set_epoch(0)
        update_bn(data.bn, model)
    logits = predict_logits(model, data.train_eval, torch.device("cpu"))
    labels = torch.cat([y for _, y in data.train_eval])
    test_logits = predict_logits(model, data.test, torch.device("cpu"))
    test_labels = torch.cat([y for _, y in data.test])
    return {"train_ce": float(F.cross_entropy(logits, labels)),
            "test_err": 100.0 * float(test_logits.argmax(1).ne(test_labels).float().mean())}


# ----------------------------------------------------------------------------- plane geometry


def test_plane_basis_is_orthonormal_and_reproduces_the_three_points():
    g = torch.Generator().manual_seed(1)
    w1, w2, w3 = (torch.randn(50, generator=g, dtype=torch.float64) for _ in range(3))
    p = Plane(w1, w2, w3)
    assert float(p.u_hat.norm()) == pytest.approx(1.0, abs=1e-12)
    assert float(p.v_hat.norm()) == pytest.approx(1.0, abs=1e-12)
    assert float(p.u_hat @ p.v_hat) == pytest.approx(0.0, abs=1e-12)
    for w in (w1, w2, w3):
        x, y, off = p.coordinates(w)
        assert off == pytest.approx(0.0, abs=1e-10)
        assert torch.allclose(p.point(x, y), w, atol=1e-10)
    assert p.coordinates(w1)[:2] == pytest.approx((0.0, 0.0), abs=1e-12)
    assert p.coordinates(w2)[:2] == pytest.approx((float((w2 - w1).norm()), 0.0), abs=1e-10)
    assert p.coordinates(w3)[1] > 0  # v points towards w3


def test_plane_refuses_collinear_points():
    w1 = torch.zeros(5, dtype=torch.float64)
    w2 = torch.ones(5, dtype=torch.float64)
    with pytest.raises(ValueError, match="one line"):
        Plane(w1, w2, 3 * w2)


def test_param_space_keeps_bn_buffers_out_of_the_vector():
    state = bn_states()["swa"]
    space = ParamSpace.of(load_run_like(SMALL_BN).model())
    vector = space.flatten(state)
    assert vector.numel() == space.dim == sum(v.numel() for k, v in state.items() if "running" not in k
                                              and "num_batches" not in k)
    buffers = space.buffers(state)
    assert set(buffers) == {"1.running_mean", "1.running_var", "1.num_batches_tracked"}
    rebuilt = space.to_state(vector, buffers)
    assert all(torch.equal(rebuilt[k], state[k]) for k in state)


def test_random_directions_are_unit_and_seeded():
    d = random_unit_directions(1000, 4, seed=3)
    assert torch.allclose(d.norm(dim=1), torch.ones(4, dtype=torch.float64))
    assert torch.equal(d, random_unit_directions(1000, 4, seed=3))
    assert not torch.equal(d, random_unit_directions(1000, 4, seed=4))


# ----------------------------------------------------------------------------- convex toy problem


def test_plane_minimum_of_l2_logistic_regression_is_at_the_optimum(tmp_path):
    """Regularised logistic regression is strongly convex: put its optimum w* on a grid point of the
    plane and the grid's smallest train loss must be exactly there."""
    wd = 0.02
    torch.manual_seed(0)
    run_dir = fake_run(tmp_path / "lin", LINEAR, wd, {"swa": {}, "sgd": {}})
    run = open_run(run_dir)
    data = analysis_data(run, torch.device("cpu"))
    x = torch.cat([b for b, _ in data.train_eval])
    y = torch.cat([lab for _, lab in data.train_eval])
    model = run.model()
    opt = torch.optim.LBFGS(model.parameters(), lr=1, max_iter=200, tolerance_grad=1e-9, tolerance_change=1e-12,
                            line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y) + 0.5 * wd * sum(p.pow(2).sum() for p in model.parameters())
        loss.backward()
        return loss

    opt.step(closure)
    space = ParamSpace.of(model)
    w_star = space.flatten(model.state_dict())
    a = random_unit_directions(space.dim, 2, seed=5)
    b = a[1] - (a[1] @ a[0]) * a[0]  # orthogonal to a[0], so w* projects to the middle of the x range
    a, b = a[0], b / b.norm()
    points = {"w1": w_star - a, "w2": w_star + a, "w3": w_star + b}
    for name, w in points.items():
        torch.save(space.to_state(w, {}), tmp_path / f"{name}.pt")
    # grid 5, margin 0.5: x in [-1, 3] (w* at x = 1, index 2), y in [-0.5, 1.5] (w* at y = 0, index 1)
    result = plane.main(["--w1", str(tmp_path / "w1.pt"), "--w2", str(tmp_path / "w2.pt"), "--w3",
                         str(tmp_path / "w3.pt"), "--run", str(run_dir), "--grid", "5", "--margin", "0.5",
                         "--out", str(tmp_path / "plane"), "--quiet"])
    loss = result["surfaces"]["train_loss"]
    j, i = np.unravel_index(np.argmin(loss), loss.shape)
    assert (i, j) == (2, 1)
    assert result["xs"][2] == pytest.approx(1.0) and result["ys"][1] == pytest.approx(0.0, abs=1e-12)
    # the bowl rises on every side of the optimum
    assert loss[1, 1] > loss[1, 2] < loss[1, 3] and loss[0, 2] > loss[1, 2] < loss[2, 2]
    assert (tmp_path / "plane" / "plane.png").stat().st_size > 0


# ----------------------------------------------------------------------------- rays and segment


@pytest.mark.parametrize("bn_update", [False, True])
def test_ray_of_length_zero_gives_the_solutions_own_metrics(tmp_path, bn_update):
    states = bn_states()
    run_dir = fake_run(tmp_path / "run", SMALL_BN, 1e-3, states)
    flag = "--bn-update" if bn_update else "--no-bn-update"
    result = rays.main(["--run", str(run_dir), "--directions", "2", "--max-distance", "1", "--points", "2",
                        "--out", str(tmp_path / "rays"), "--quiet", flag])
    assert result["evaluated"] == 2 * (1 + 2)  # t = 0 once per start, then each direction at t = 1
    for name in ("swa", "sgd"):
        expected = direct_metrics(run_dir, states[name], bn_update)
        got = result["curves"][name]
        assert got["train_ce"][:, 0] == pytest.approx([expected["train_ce"]] * 2, abs=1e-5)
        assert got["test_err"][:, 0] == pytest.approx([expected["test_err"]] * 2, abs=1e-9)
    assert result["curves"]["swa"]["train_ce"][0, 1] != result["curves"]["swa"]["train_ce"][1, 1]


def test_segment_ends_give_the_swa_and_sgd_metrics(tmp_path):
    states = bn_states()
    run_dir = fake_run(tmp_path / "run", SMALL_BN, 1e-3, states)
    result = segment.main(["--run", str(run_dir), "--t-min", "-0.5", "--t-max", "1.5", "--points", "3",
                           "--out", str(tmp_path / "seg"), "--quiet", "--no-bn-update"])
    ts = list(result["t"])
    assert ts == [-0.5, 0.0, 0.5, 1.0, 1.5]
    for t, name in ((0.0, "swa"), (1.0, "sgd")):
        expected = direct_metrics(run_dir, states[name], bn_update=False)
        assert result["values"]["train_ce"][ts.index(t)] == pytest.approx(expected["train_ce"], abs=1e-5)
        assert result["values"]["test_err"][ts.index(t)] == pytest.approx(expected["test_err"], abs=1e-9)
    space = ParamSpace.of(open_run(run_dir).model())
    length = float((space.flatten(states["sgd"]) - space.flatten(states["swa"])).norm())
    assert result["distance"][ts.index(1.0)] == pytest.approx(length)
    assert (tmp_path / "seg" / "segment.png").exists()


# ----------------------------------------------------------------------------- resumability


def test_plane_resumes_and_evaluates_only_the_missing_points(tmp_path):
    states = bn_states()
    mid = {k: 0.5 * (states["swa"][k].double() + states["sgd"][k].double()).to(v.dtype) if v.is_floating_point()
           else v for k, v in states["swa"].items()}
    mid["1.weight"] = mid["1.weight"] + 0.1
    run_dir = fake_run(tmp_path / "run", SMALL_BN, 1e-3, states, checkpoints={1: states["sgd"], 2: mid})
    common = ["--w1", f"{run_dir}@1", "--w2", f"{run_dir}:swa", "--w3", f"{run_dir}@2", "--trajectory", str(run_dir),
              "--margin", "0.2", "--out", str(tmp_path / "plane"), "--quiet"]
    args = common + ["--grid", "3"]
    first = plane.main(args)
    assert first["evaluated"] == 9
    log = tmp_path / "plane" / "plane.jsonl"
    lines = log.read_text().splitlines()
    log.write_text("\n".join(lines[:1 + 4]) + "\n")  # header + 4 points, as if killed mid-way
    second = plane.main(args)
    assert second["evaluated"] == 5
    assert len(log.read_text().splitlines()) == 1 + 9
    for m in ("train_loss", "test_err"):
        np.testing.assert_allclose(second["surfaces"][m], first["surfaces"][m], rtol=1e-6)
    assert plane.main(args)["evaluated"] == 0
    # the trajectory's checkpoints project onto w1 and w3 (both lie in the plane)
    traj = dict(second["trajectory"])
    assert traj[1][:2] == pytest.approx((0.0, 0.0), abs=1e-6)
    assert traj[2][2] == pytest.approx(0.0, abs=1e-5)
    with pytest.raises(ValueError, match="other settings"):
        plane.main(common + ["--grid", "5"])


def test_span_trajectory_widens_the_grid_to_cover_every_projected_checkpoint(tmp_path):
    states = bn_states()
    mid = {k: v.clone() for k, v in states["swa"].items()}
    mid["1.weight"] = mid["1.weight"] + 0.1
    far = {k: v.clone() for k, v in states["sgd"].items()}
    far["0.weight"] = far["0.weight"] * 4.0  # an iterate well outside the three points' span
    run_dir = fake_run(tmp_path / "run", SMALL_BN, 1e-3, states, checkpoints={1: states["sgd"], 2: mid, 3: far})
    common = ["--w1", f"{run_dir}@1", "--w2", f"{run_dir}:swa", "--w3", f"{run_dir}@2", "--trajectory", str(run_dir),
              "--grid", "2", "--margin", "0", "--quiet", "--no-bn-update"]
    narrow = plane.main(common + ["--out", str(tmp_path / "narrow")])
    wide = plane.main(common + ["--span-trajectory", "--out", str(tmp_path / "wide")])

    def covers(result, x, y, tol=1e-9):
        xs, ys = result["xs"], result["ys"]
        return xs[0] - tol <= x <= xs[-1] + tol and ys[0] - tol <= y <= ys[-1] + tol

    x3, y3, _ = dict(wide["trajectory"])[3]
    assert not covers(narrow, x3, y3)
    assert covers(wide, x3, y3)
    assert all(covers(wide, x, y) for x, y, _ in wide["points"].values())  # the marked points stay covered


def test_weight_specs_pick_live_swa_and_epoch_weights(tmp_path):
    states = bn_states()
    run_dir = fake_run(tmp_path / "run", SMALL_BN, 1e-3, states, checkpoints={3: states["swa"]})
    assert torch.equal(load_weights(str(run_dir))["0.weight"], states["sgd"]["0.weight"])
    assert torch.equal(load_weights(f"{run_dir}:sgd")["0.weight"], states["sgd"]["0.weight"])
    assert torch.equal(load_weights(f"{run_dir}:swa")["0.weight"], states["swa"]["0.weight"])
    assert torch.equal(load_weights(f"{run_dir}@3")["0.weight"], states["swa"]["0.weight"])
    with pytest.raises(ConfigError, match="ema"):
        load_weights(f"{run_dir}:ema")


# ----------------------------------------------------------------------------- curves and experiment configs


def test_curves_take_sgd_from_test_acc_and_swa_from_swa_test_acc(tmp_path):
    run = tmp_path / "r" / "seed0"
    run.mkdir(parents=True)
    rows = [{"epoch": 1, "test_acc": 50.0}, {"epoch": 2, "test_acc": 60.0, "swa_test_acc": 65.0},
            {"epoch": 3, "test_acc": 61.0, "swa_test_acc": 70.0}]
    (run / "history.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "fig.png"
    got = curves.main([str(run), "--labels", "lr0.05", "--out", str(out)])
    assert [c[0] for c in got] == ["lr0.05: SGD iterate", "lr0.05: SWA average"]
    np.testing.assert_array_equal(got[0][2], [50.0, 40.0, 39.0])
    np.testing.assert_array_equal(got[1][1], [2, 3])
    np.testing.assert_array_equal(got[1][2], [35.0, 30.0])
    assert out.stat().st_size > 0


def half_written_then_disk_full(target, *args, **kwargs):
    """A writer that puts a few bytes where it writes (a path or an open file), then finds the disk full."""
    if hasattr(target, "write"):
        target.write(b"\x89PNG half")
    else:
        Path(target).write_bytes(b"\x89PNG half")
    raise OSError(28, "No space left on device")


def test_a_curves_figure_that_fails_while_written_leaves_the_earlier_one(tmp_path, monkeypatch):
    import matplotlib.figure

    run = tmp_path / "r" / "seed0"
    run.mkdir(parents=True)
    (run / "history.jsonl").write_text(json.dumps({"epoch": 1, "test_acc": 50.0}) + "\n")
    out = tmp_path / "fig.png"
    curves.main([str(run), "--out", str(out)])
    before = out.read_bytes()
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", lambda fig, *a, **k: half_written_then_disk_full(*a))
    with pytest.raises(OSError):
        curves.main([str(run), "--out", str(out)])
    assert out.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fig.png", "r"]  # no temp file left


def test_arrays_that_fail_while_written_leave_the_earlier_ones(tmp_path, monkeypatch):
    from swalab.analysis.probe import save_arrays

    out = tmp_path / "segment.npz"
    save_arrays(out, t=np.arange(3.0))
    monkeypatch.setattr(np, "savez", half_written_then_disk_full)
    with pytest.raises(OSError):
        save_arrays(out, t=np.arange(5.0))
    monkeypatch.undo()
    np.testing.assert_array_equal(np.load(out)["t"], np.arange(3.0))
    assert [p.name for p in tmp_path.iterdir()] == ["segment.npz"]


def test_a_swa_run_that_did_not_score_its_average_says_so_once_and_only_swa_of_it_is_an_error(tmp_path, capsys):
    """model.swa.score_every=0: the history has the iterate's test_acc only. Without --only its iterate is drawn, named
    as the iterate, with one line saying why there is no average; with --only swa that one line is the error, and
    nothing is written."""
    from swalab.analysis.__main__ import main as analysis

    run = tmp_path / "swa" / "seed0"
    run.mkdir(parents=True)
    (run / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create({"method": {"name": "swa"}})))
    (run / "history.jsonl").write_text("".join(json.dumps({"epoch": e, "test_acc": 50.0 + e}) + "\n" for e in (1, 2)))
    got = curves.main([str(run), "--labels", "swa", "--out", str(tmp_path / "all.png")])
    assert [c[0] for c in got] == ["swa: SGD iterate"] and (tmp_path / "all.png").exists()
    said = [line for line in capsys.readouterr().out.splitlines() if "did not score" in line]
    assert len(said) == 1 and "model.swa.score_every=N" in said[0] and "only its SGD iterate is drawn" in said[0]
    with pytest.raises(SystemExit) as done:
        analysis(["curves", str(run), "--only", "swa", "--out", str(tmp_path / "swa.png")])
    out, err = capsys.readouterr()
    assert done.value.code == 2 and out == "" and not (tmp_path / "swa.png").exists()
    assert len(err.strip().splitlines()) == 1, err
    assert "did not score its SWA average during training" in err and "model.swa.score_every=N" in err
    assert "drawn" not in err.replace("nothing to draw", "")


@pytest.mark.parametrize("experiment", ["fig6_swa_lr_study", "fig7_constant_vs_decay"])
def test_figure_experiments_compose(experiment):
    from hydra import compose, initialize_config_dir

    import swalab  # noqa: F401  (registers the resolvers)

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[f"experiment={experiment}", "logger=none"],
                      return_hydra_config=True)
    sweep = cfg.hydra.sweeper.params
    assert sweep, "the experiment defines a multirun sweep"
    assert cfg.model.swa.score_every == 1  # the SWA curve lands in history.jsonl as swa_test_acc
    if experiment == "fig6_swa_lr_study":
        assert cfg.method.name == "swa" and cfg.model.swa.start_epoch == 0 and cfg.model.swa.cycle_epochs == 5
        assert sweep.swa_schedule.count("phase:cyclic") == 4 and sweep.swa_schedule.count("phase:constant") == 4
    else:
        assert sweep.method == "swa,sgd" and cfg.schedule._target_.endswith("PaperSGD")
        assert cfg.model.swa.lr == cfg.model.lr == 0.05  # reference pre-schedule from 0.05 to 0.05: constant


def test_the_analysis_command_lists_its_commands_with_a_line_each(capsys):
    from swalab.analysis.__main__ import COMMANDS, main

    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0
    listed = [line.split()[0] for line in capsys.readouterr().out.splitlines() if line.startswith("  ")]
    assert listed == list(COMMANDS) == ["plane", "rays", "segment", "curves"]
    with pytest.raises(SystemExit) as done:
        main(["planes"])
    assert done.value.code == 2 and "unknown command 'planes'" in capsys.readouterr().err


def test_a_segment_between_runs_of_two_architectures_is_one_line_naming_the_solution(tmp_path, capsys):
    from swalab.cli import run_command

    states = bn_states()
    run_dir = fake_run(tmp_path / "run", SMALL_BN, 1e-3, states)
    wider = {name: (torch.zeros(10, 200) if name == "4.weight" else value) for name, value in states["sgd"].items()}
    other = fake_run(tmp_path / "other", SMALL_BN, 1e-3, {"sgd": wider, "swa": wider})  # same names, other shapes
    with pytest.raises(SystemExit) as exit_:
        run_command(segment.main, ["--run", str(run_dir), "--sgd", str(other), "--out", str(tmp_path / "seg"),
                                   "--quiet"], prog="swalab.analysis")
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2 and err == [
        f"[swalab.analysis] --sgd {other}: parameter 4.weight has shape [10, 200] there but [10, 144] in this network "
        f"(1 of 6 parameters differ): weights of another architecture; every solution must be a network of --run {run_dir}"]


def analysis_error(capsys, *argv: str) -> str:
    """What ``python -m swalab.analysis ARGV`` says when it refuses: exit 2 and one line on stderr."""
    from swalab.analysis.__main__ import main

    with pytest.raises(SystemExit) as done:
        main(list(argv))
    err = capsys.readouterr().err.strip().splitlines()
    assert done.value.code == 2 and len(err) == 1, err
    return err[0]


def test_an_analysis_refuses_what_the_user_typed_in_one_line_naming_it(tmp_path, capsys):
    """Other settings over an earlier --out, subsets larger than the splits, a run without SWA weights, ':swa' on a
    file, an epoch not kept and a one-point grid: each one line (exit 2) naming what was typed, never a traceback."""
    states = bn_states()
    mid = {name: value.clone() for name, value in states["swa"].items()}
    mid["1.weight"] = mid["1.weight"] + 0.1
    run_dir = fake_run(tmp_path / "run", SMALL_BN, 1e-3, states, checkpoints={1: mid})
    plane_args = ["plane", "--w1", f"{run_dir}@1", "--w2", f"{run_dir}:swa", "--w3", str(run_dir), "--quiet",
                  "--out", str(tmp_path / "plane"), "--train-size", "50", "--test-size", "50"]
    plane.main(plane_args[1:] + ["--grid", "2"])
    said = analysis_error(capsys, *plane_args, "--grid", "3")
    assert "holds results for other settings (grid: 2 there, 3 now" in said and "another --out" in said
    said = analysis_error(capsys, *plane_args[:-4], "--train-size", "5000", "--grid", "2")
    assert said.startswith("[swalab.analysis] --train-size=5000 is out of range: the training split has 300 items")
    said = analysis_error(capsys, *plane_args[:6], f"{run_dir}@1", *plane_args[7:], "--grid", "2")
    assert said == ("[swalab.analysis] --w1, --w2 and --w3 lie on one line: they do not define a plane; "
                    "name other weights")
    torch.save({"model": states["sgd"], "methods": {}}, run_dir / "final.pt")  # as an SGD or FGE run leaves it
    said = analysis_error(capsys, "segment", "--run", str(run_dir), "--out", str(tmp_path / "seg"), "--quiet")
    assert f"{run_dir}: final.pt of this" in said and "not 'swa': name a run of method swa" in said
    said = analysis_error(capsys, *plane_args[:4], f"{run_dir}/final.pt:swa", *plane_args[5:], "--grid", "2")
    assert "':swa' only applies to a run directory" in said
    said = analysis_error(capsys, "plane", "--w1", f"{run_dir}@7", *plane_args[3:], "--grid", "2")
    assert said.startswith(f"[swalab.analysis] {run_dir}@7: no checkpoint of epoch 7") and "init_from" not in said
    assert "run.save_at=[7]" in said and "run.dir=<dir>" in said  # the run's own command, finished, skips it
    with pytest.raises(SystemExit) as done:
        plane.main(plane_args[1:-4] + ["--out", str(tmp_path / "one"), "--grid", "1"])
    assert done.value.code == 2 and "--grid 1: a surface needs at least 2 points" in capsys.readouterr().err
    assert not (tmp_path / "one").exists() and not (tmp_path / "seg").exists()


def test_a_point_cut_short_while_written_is_evaluated_again_and_ctrl_c_says_what_is_kept(tmp_path, capsys,
                                                                                           monkeypatch):
    from swalab.analysis.__main__ import main
    from swalab.analysis.probe import Probe

    states = bn_states()
    run_dir = fake_run(tmp_path / "run", SMALL_BN, 1e-3, states)
    args = ["--run", str(run_dir), "--points", "3", "--out", str(tmp_path / "seg"), "--quiet", "--no-bn-update"]
    first = segment.main(args)
    log = tmp_path / "seg" / "segment.jsonl"
    whole = log.read_text()
    log.write_text(whole[:-30])  # killed while it wrote the last point
    again = segment.main(args)
    assert again["evaluated"] == 1 and log.read_text() == whole
    np.testing.assert_allclose(again["values"]["train_loss"], first["values"]["train_loss"])

    calls = []
    def interrupted(self, vector, buffers=None):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return {"train_loss": 1.0, "train_ce": 1.0, "train_err": 0.0, "test_loss": 1.0, "test_err": 0.0}
    monkeypatch.setattr(Probe, "__call__", interrupted)
    with pytest.raises(SystemExit) as done:
        main(["segment"] + args[:4] + ["--out", str(tmp_path / "other"), "--quiet"])
    err = capsys.readouterr().err.strip().splitlines()
    assert done.value.code == 130 and err == ["[swalab.analysis] interrupted: the points evaluated so far are kept in "
                                              "--out; the same command again evaluates only the others"]
    assert len((tmp_path / "other" / "segment.jsonl").read_text().splitlines()) == 1 + 1


def test_the_planes_axes_name_the_weights_that_span_them_and_their_unit(tmp_path, monkeypatch):
    """The axes read 'x (along w2 - w1)' and 'y', while the figure names the weights SGD epoch 24, SWA, ...: a reader
    could not tell which points span the plane, nor that a unit is a Euclidean distance between weight vectors. The
    first three points are w1, w2, w3 (``plane.main``)."""
    from swalab.analysis import plots

    drawn = {}
    monkeypatch.setattr(plots, "_save", lambda fig, path: drawn.setdefault("fig", fig))
    xs, ys = np.linspace(-1, 5, 7), np.linspace(-0.2, 1.5, 7)
    plots.plane_figure(tmp_path / "plane.png", xs, ys, {"train loss": np.add.outer(ys, xs)},
                       {"epoch 24": (0.0, 0.0), "SWA": (3.4, 0.0), "epoch 30": (1.8, 1.4), "other": (2.0, 0.5)})
    ax = drawn["fig"].axes[0]
    assert ax.get_xlabel() == "x: along SWA - epoch 24 (L2 distance of weights)", ax.get_xlabel()
    assert ax.get_ylabel().replace("\n", " ") == "y: towards epoch 30 (\u22a5 x)", ax.get_ylabel()


def test_a_flat_plane_figure_keeps_its_colour_bar_ticks_its_labels_and_the_trajectory_readable(tmp_path, monkeypatch):
    """A plane 6 wide and 1 high (the usual shape: w1 -> w2 long, w3 close to that line): the colour bar's tick labels
    do not overlap, a point's label at the right edge stays left of the colour bar, and the trajectory, partly outside
    the grid (on white), is not drawn in white."""
    from swalab.analysis import plots

    drawn = {}
    monkeypatch.setattr(plots, "_save", lambda fig, path: drawn.setdefault("fig", fig))
    xs, ys = np.linspace(-1, 5, 7), np.linspace(-0.2, 0.8, 7)
    z = np.exp(-xs)[None, :] + ys[:, None] ** 2
    plots.plane_figure(tmp_path / "plane.png", xs, ys, {"train loss": z},
                       {"w1": (0.0, 0.0), "SGD (epoch 9)": (4.6, 0.7)},
                       {"trajectory": np.array([[0.0, 0.0], [2.0, -0.5], [3.0, -0.4]])})
    fig = drawn["fig"]
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    ax, bar = fig.axes[0], fig.axes[1]
    ticks = sorted((label.get_window_extent(renderer) for label in bar.get_yticklabels() if label.get_text()),
                   key=lambda box: box.y0)
    assert len(ticks) >= 2 and all(low.y1 <= high.y0 for low, high in zip(ticks, ticks[1:]))
    right_label = [text for text in ax.texts if text.get_text() == "SGD (epoch 9)"][0]
    assert right_label.get_window_extent(renderer).x1 <= bar.get_window_extent(renderer).x0
    assert ax.get_lines()[0].get_color() not in ("white", "w", "#ffffff")


def test_labels_of_two_points_close_on_one_line_of_the_plane_do_not_cover_each_other(tmp_path, monkeypatch):
    """The digits plane of docs/analysis.md: epoch 13 at (0, 0) and SWA at (0.69, 0), on each side of the grid's
    middle, were labelled towards each other at one height, and SWA's box covered "epoch 13"."""
    from swalab.analysis import plots

    drawn = {}
    monkeypatch.setattr(plots, "_save", lambda fig, path: drawn.setdefault("fig", fig))
    xs, ys = np.linspace(-0.32, 1.37, 11), np.linspace(-0.1, 0.48, 11)
    trajectory = np.array([[-0.87, -0.28], [-0.29, -0.17], [-0.09, 0.0], [0.0, 0.0], [0.38, -0.17], [0.65, -0.17],
                           [0.9, -0.01], [1.05, 0.37]])  # earlier epochs beyond the grid widen the axes
    plots.plane_figure(tmp_path / "plane.png", xs, ys, {"train loss": np.add.outer(ys, xs)},
                       {"epoch 13": (0.0, 0.0), "SWA": (0.69, 0.0), "SGD (epoch 24)": (1.05, 0.38)},
                       {"trajectory": trajectory})
    fig = drawn["fig"]
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    boxes = [t.get_bbox_patch().get_window_extent(renderer) for t in fig.axes[0].texts]
    assert not any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1:])


def test_the_analyses_name_their_own_flags_in_refusals(tmp_path, capsys, monkeypatch):
    """--device cuda without a GPU names --device (not the training setting run.device); --point without NAME= and a
    ray of no direction are refused before any work."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    run_dir = fake_run(tmp_path / "run", SMALL_BN, 1e-3, bn_states())
    said = analysis_error(capsys, "segment", "--run", str(run_dir), "--device", "cuda", "--out", str(tmp_path / "s"))
    assert said == "[swalab.analysis] --device=cuda but no CUDA device is visible; use --device=auto or cpu"
    with pytest.raises(SystemExit) as done:
        plane.main(["--w1", f"{run_dir}:swa", "--w2", str(run_dir), "--w3", str(run_dir), "--point", str(run_dir),
                    "--out", str(tmp_path / "p")])
    assert done.value.code == 2 and f"--point {run_dir}: give NAME=SPEC" in capsys.readouterr().err
    with pytest.raises(SystemExit) as done:
        rays.main(["--run", str(run_dir), "--directions", "0", "--out", str(tmp_path / "r")])
    assert done.value.code == 2 and "a ray needs at least 1 direction and 2 points" in capsys.readouterr().err
    assert not any((tmp_path / name).exists() for name in ("s", "p", "r"))


def test_the_same_analysis_typed_from_another_folder_resumes_instead_of_refusing(tmp_path, monkeypatch):
    """The log records the weights relative to --out: the same run and --out typed from the run's own folder (or as
    ./run/) are the same settings, so nothing already evaluated is evaluated again."""
    run_dir = fake_run(tmp_path / "run", SMALL_BN, 1e-3, bn_states())
    monkeypatch.chdir(tmp_path)
    first = segment.main(["--run", "run", "--points", "3", "--out", "seg", "--quiet", "--no-bn-update"])
    assert first["evaluated"] == 5
    monkeypatch.chdir(run_dir)
    again = segment.main(["--run", ".", "--points", "3", "--out", "../seg/", "--quiet", "--no-bn-update"])
    assert again["evaluated"] == 0
    monkeypatch.chdir(tmp_path)
    third = segment.main(["--run", "./run/", "--points", "3", "--out", "seg", "--quiet", "--no-bn-update"])
    assert third["evaluated"] == 0
    assert str(tmp_path) not in (tmp_path / "seg" / "segment.jsonl").read_text()  # no machine path in the log


def test_a_run_on_an_image_folder_is_analysed_with_the_channels_its_images_have(tmp_path, capsys):
    """dataset=folder leaves dataset.channels null in the config (the images say it): the analysis builds the network
    for the run's data, as training did, instead of failing in the first convolution."""
    from conftest import train_on_one_thread
    from test_folder_data import write_folder

    root = write_folder(tmp_path / "data", ["a", "b", "c"], n_train=6, n_test=3, size=(8, 8), grey=True)
    run_dir = train_on_one_thread(tmp_path / "run", "dataset=folder", f"dataset.root={root}", "method=swa",
                                  "trainer.epochs=2", "trainer.batch_size=6", "model.swa.start_epoch=1",
                                  "model.arch.depth=8", f"run.cache_dir={tmp_path / 'cache'}")
    result = segment.main(["--run", str(run_dir), "--points", "3", "--out", str(tmp_path / "seg"), "--quiet"])
    assert result["evaluated"] == 5 and np.isfinite(result["values"]["train_loss"]).all()
    root.rename(tmp_path / "moved")  # the data moved (or the run was made on another machine)
    said = analysis_error(capsys, "segment", "--run", str(run_dir), "--out", str(tmp_path / "seg2"), "--quiet")
    assert said.startswith(f"[swalab.analysis] {run_dir}: its data is not at dataset.root={root} (")
    assert said.endswith(f"put it back there, or write where it is now as dataset.root in {run_dir / 'config.yaml'}")


def test_a_loss_with_a_large_l2_term_reads_on_the_axes_and_colour_bar_as_it_is(tmp_path, monkeypatch):
    """AdamW's weight decay 0.05 puts the train loss (CE + L2) near 3639.5 with changes in the second decimal: the
    segment's axis shows 3639.55, not 0.55 under '+3.639e3', and the plane's colour bar ticks differ from each
    other (not 3.64e+03 at each)."""
    from swalab.analysis import plots

    drawn = []
    monkeypatch.setattr(plots, "_save", lambda fig, path: drawn.append(fig))
    distances = np.linspace(-0.06, 0.12, 5)
    plots.segment_figure(tmp_path / "s.png", distances, 3639.7 - 2 * distances, np.full(5, 40.0), 0.06)
    xs, ys = np.linspace(0, 1, 5), np.linspace(0, 1, 5)
    plots.plane_figure(tmp_path / "p.png", xs, ys, {"train loss": 3639.45 + 0.3 * np.add.outer(ys, xs)},
                       {"w1": (0.0, 0.0)})
    for fig in drawn:
        fig.canvas.draw()
    loss_axis = drawn[0].axes[0]
    assert loss_axis.yaxis.get_offset_text().get_text() == ""
    assert all(label.get_text().startswith("3639.") for label in loss_axis.get_yticklabels() if label.get_text())
    ticks = [label.get_text() for label in drawn[1].axes[1].get_yticklabels() if label.get_text()]
    assert len(ticks) >= 2 and len(set(ticks)) == len(ticks), ticks


def test_a_plane_through_weights_of_another_architecture_is_one_line_naming_the_flag(tmp_path, capsys):
    states = bn_states()
    mid = {name: value.clone() for name, value in states["swa"].items()}
    mid["1.weight"] = mid["1.weight"] + 0.1
    run_dir = fake_run(tmp_path / "run", SMALL_BN, 1e-3, states, checkpoints={1: mid})
    wider = {name: (torch.zeros(10, 200) if name == "4.weight" else value) for name, value in states["sgd"].items()}
    other = fake_run(tmp_path / "other", SMALL_BN, 1e-3, {"sgd": wider, "swa": wider})
    common = ["plane", "--w1", f"{run_dir}:swa", "--w2", str(run_dir), "--out", str(tmp_path / "p"), "--quiet"]
    said = analysis_error(capsys, *common, "--w3", str(other))
    assert said.startswith(f"[swalab.analysis] --w3 {other}: parameter 4.weight has shape [10, 200] there")
    assert said.endswith(f"every solution must be a network of {run_dir} (the run of --w1)")
    said = analysis_error(capsys, *common, "--w3", f"{run_dir}@1", "--point", f"X={other}")
    assert said.startswith(f"[swalab.analysis] --point X={other}: parameter 4.weight")
    assert not (tmp_path / "p").exists()


def test_the_segment_and_rays_figures_name_the_weights_given_instead_of_swa(tmp_path, monkeypatch):
    """--swa <run>@1 (or <run>:ema) is not SWA: the figures say 'epoch 1' where they said SWA."""
    from swalab.analysis import plots

    states = bn_states()
    run_dir = fake_run(tmp_path / "run", SMALL_BN, 1e-3, states, checkpoints={1: states["swa"]})
    drawn = []
    monkeypatch.setattr(plots, "_save", lambda fig, path: drawn.append(fig))
    given = ["--run", str(run_dir), "--swa", f"{run_dir}@1", "--quiet", "--no-bn-update"]
    segment.main(given + ["--points", "3", "--out", str(tmp_path / "s")])
    rays.main(given + ["--directions", "1", "--points", "2", "--out", str(tmp_path / "r")])
    ax = drawn[0].axes[0]
    assert ": epoch 1 to SGD" in ax.get_title() and ax.get_xlabel() == "signed distance from epoch 1 (towards SGD)"
    assert [t.get_text() for t in ax.texts] == ["epoch 1", "SGD"]
    assert [t.get_text() for t in drawn[1].axes[0].get_legend().get_texts()] == ["epoch 1", "SGD"]


def test_a_result_log_reads_settings_a_few_ulps_apart_as_its_own_and_other_values_as_others(tmp_path):
    """The plane's extent is computed from the weights: the same command at another thread count gave
    x: [-0.31606413100667946, 1.3696112343622777] against [-0.3160641310066796, 1.3696112343622784], and was refused
    as another analysis, so every point would have been computed again in another folder."""
    from swalab.analysis.probe import ResultLog

    log = tmp_path / "plane.jsonl"
    ResultLog(log, {"x": [-0.31606413100667946, 1.3696112343622777], "grid": 11}).add("0,0", {"loss": 1.0})
    again = ResultLog(log, {"x": [-0.3160641310066796, 1.3696112343622784], "grid": 11})
    assert "0,0" in again
    with pytest.raises(ConfigError, match="other settings"):
        ResultLog(log, {"x": [-0.3161, 1.3696112343622784], "grid": 11})


def test_a_curves_figure_draws_sgd_and_swa_in_their_colours_on_a_log_axis_when_errors_span_decades(tmp_path,
                                                                                                  monkeypatch):
    """The digits curves drew the SWA average in orange (FGE's colour in every other figure) on a linear axis where
    the averaging phase, 1% against 67% at epoch 1, was a flat line at the bottom."""
    from swalab import style
    from swalab.analysis import plots

    drawn = {}
    monkeypatch.setattr(plots, "_save", lambda fig, path: drawn.setdefault("fig", fig))
    epochs = np.arange(1, 7)
    plots.curves_figure(tmp_path / "c.png", [("run: SGD iterate", epochs, np.array([67.0, 20, 5, 2, 1.2, 1.1])),
                                             ("run: SWA average", epochs[3:], np.array([1.4, 1.0, 0.9]))])
    ax = drawn["fig"].axes[0]
    sgd, swa = ax.get_lines()
    assert (sgd.get_color(), sgd.get_linestyle()) == (style.color_of("sgd"), "--")
    assert (swa.get_color(), swa.get_linestyle()) == (style.color_of("swa"), "-")
    assert ax.get_yscale() == "log" and "log" in ax.get_ylabel()


@pytest.mark.parametrize("name", ["fig", "fig.v2"])
def test_a_curves_figure_named_without_a_formats_suffix_is_refused_in_one_line_before_any_work(tmp_path, capsys, name):
    """``--out fig`` wrote a PNG named ``fig``, ``--out fig.v2`` failed in matplotlib's traceback once drawn."""
    from swalab.analysis.__main__ import main as analysis

    run = tmp_path / "r" / "seed0"
    run.mkdir(parents=True)
    (run / "history.jsonl").write_text(json.dumps({"epoch": 1, "test_acc": 50.0}) + "\n")
    with pytest.raises(SystemExit) as done:
        analysis(["curves", str(run), "--out", str(tmp_path / name)])
    err = capsys.readouterr().err.strip().splitlines()
    assert done.value.code == 2 and len(err) == 1, err
    assert f"--out {tmp_path / name}: its suffix names no figure format" in err[0] and "fig.png" in err[0], err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r"]
