"""``method=laplace``: laplace-torch's last-layer Laplace around a finished run's weights, its prior precision chosen on
the validation split, scored by the evaluator every method goes through."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

pytest.importorskip("laplace", reason="laplace-torch is not installed (pip install 'swalab[laplace]')")

from swalab.config import ConfigError  # noqa: E402
from swalab.methods.laplace import LaplaceMethod, LaplacePredictor, fit_laplace  # noqa: E402
from swalab.train import train  # noqa: E402

TINY = ["dataset.train_size=200", "dataset.val_size=100", "trainer.batch_size=50", "run.eval_every=0"]


def blobs(n: int, seed: int) -> TensorDataset:
    """Three overlapping Gaussian classes in 2-D: no network can be sure of them, an overfitted one is."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 3, (n,), generator=g)
    centres = torch.tensor([[0.0, 0.0], [1.5, 0.0], [0.75, 1.3]])
    return TensorDataset(centres[y] + torch.randn(n, 2, generator=g), y)


@pytest.fixture(scope="module")
def overfitted():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(2, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 3))
    train_set = blobs(120, 1)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(1500):  # far past the fit: confident and often wrong on new points
        opt.zero_grad()
        nn.functional.cross_entropy(model(train_set.tensors[0]), train_set.tensors[1]).backward()
        opt.step()
    return model, DataLoader(train_set, batch_size=40), DataLoader(blobs(300, 2), batch_size=100), blobs(2000, 3)


def test_last_layer_laplace_is_better_calibrated_than_the_overfitted_map(overfitted):
    model, train_loader, val_loader, test_set = overfitted
    la = fit_laplace(model, train_loader, val_loader, grid_size=21)
    test_loader = DataLoader(test_set, batch_size=500)
    log_probs = LaplacePredictor(la, torch.device("cpu")).predict_log_proba(test_loader)
    with torch.no_grad():
        map_log_probs = model(test_set.tensors[0]).log_softmax(dim=1)
    labels = test_set.tensors[1]
    torch.testing.assert_close(log_probs.exp().sum(dim=1), torch.ones(len(labels)))
    nll = nn.functional.nll_loss(log_probs, labels).item()
    map_nll = nn.functional.nll_loss(map_log_probs, labels).item()
    assert nll < 0.9 * map_nll, (nll, map_nll)
    assert (log_probs.argmax(1) == map_log_probs.argmax(1)).float().mean() > 0.95  # the probit keeps the MAP's ranking


def test_settings_outside_what_laplace_torch_offers_are_refused_naming_the_key():
    with pytest.raises(ConfigError, match=r"method.hessian=lowrank: give one of kron, diag, full"):
        LaplaceMethod(hessian="lowrank")
    with pytest.raises(ConfigError, match=r"method.link=softmax: give one of probit, bridge, mc"):
        LaplaceMethod(link="softmax")
    with pytest.raises(ConfigError, match=r"model.init_from"):
        LaplaceMethod().validate(initialized=False)


def compose_run(overrides):
    from conftest import CONF_DIR, QUIET
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="config", overrides=[*QUIET, *TINY, *overrides])


@pytest.fixture(scope="module")
def sgd_run(tmp_path_factory):
    from conftest import train_on_one_thread

    root = tmp_path_factory.mktemp("laplace")
    train_on_one_thread(root / "sgd", *TINY, "method=sgd", "trainer.epochs=3", f"run.cache_dir={root / 'cache'}")
    return root / "sgd"


def test_method_laplace_on_a_finished_sgd_run_scores_laplace_and_the_map_in_its_metrics(sgd_run, tmp_path):
    cfg = compose_run(["method=laplace", f"model.init_from={sgd_run}", "method.grid_size=11",
                       f"run.cache_dir={tmp_path / 'cache'}"])
    train(cfg, run_dir=tmp_path / "laplace")
    metrics = json.loads((tmp_path / "laplace" / "metrics.json").read_text())
    source = json.loads((sgd_run / "metrics.json").read_text())
    assert metrics["map"]["acc"] == pytest.approx(source["sgd"]["acc"])  # the loaded weights, unchanged
    assert {"acc", "nll", "ece", "brier"} <= set(metrics["laplace"]) and metrics["laplace"]["nll"] != metrics["map"]["nll"]
    prior = metrics["laplace"]["prior_precision"]  # the choice made on the validation split, inside the grid searched
    assert len(prior) == 1 and 1e-4 <= prior[0] <= 1e4 and "prior_precision" not in metrics["map"]


def test_a_prior_precision_chosen_at_an_end_of_the_grid_is_said_with_the_setting_that_searches_further(
        overfitted, caplog):
    from swalab.methods.laplace import at_grid_edge

    assert "top of the grid searched (10^4)" in at_grid_edge([1e4], (-4, 4))
    assert "method.prior_range=[-4,8]" in at_grid_edge([1e4], (-4, 4))
    assert "method.prior_range=[-6,2]" in at_grid_edge([0.01], (-2, 2))
    assert at_grid_edge([3.0], (-4, 4)) is None
    model, train_loader, val_loader, _ = overfitted
    with caplog.at_level("WARNING"):  # a grid that ends below the best prior: the choice is its top, and said so
        la = fit_laplace(model, train_loader, val_loader, grid_size=3, prior_range=(-4, -3))
    assert la.prior_precision.max().item() == pytest.approx(1e-3)
    assert "top of the grid searched (10^-3)" in caplog.text


def test_a_prior_range_that_is_no_interval_is_refused_naming_the_key():
    with pytest.raises(ConfigError, match=r"method.prior_range=\[4.0, -4.0\]: give \[low, high\]"):
        LaplaceMethod(prior_range=[4.0, -4.0])
    with pytest.raises(ConfigError, match=r"method.prior_range"):
        LaplaceMethod(prior_range=[float("nan"), 4])


def test_the_default_prior_range_leaves_a_laplace_run_as_it_was_and_another_one_counts():
    """Runs made before method.prior_range existed searched 10^-4 .. 10^4: at that range the key is no part of the
    identity (their directories and report cells stay theirs), at another it sets the run apart."""
    from omegaconf import OmegaConf

    from swalab.identity import identity_of
    
    cfg = OmegaConf.to_container(compose_run(["method=laplace", "model.init_from=null"]), resolve=True)
    assert "method.prior_range" not in identity_of(cfg)
    cfg["method"]["prior_range"] = [-4, 8]
    assert identity_of(cfg)["method.prior_range"] == [-4, 8]


def test_method_laplace_without_a_validation_split_says_to_set_one_before_anything_is_written(sgd_run, tmp_path):
    cfg = compose_run(["method=laplace", f"model.init_from={sgd_run}", "dataset.val_size=null",
                       f"run.cache_dir={tmp_path / 'cache'}"])
    with pytest.raises(ConfigError, match=r"method=laplace fits its prior precision on the validation split.*"
                                          r"set dataset.val_size"):
        train(cfg, run_dir=tmp_path / "laplace")
    assert not (tmp_path / "laplace").exists()  # refused when checked, not once the run had started


def test_a_laplace_run_is_scored_again_by_fitting_its_posterior_again(sgd_run, tmp_path, capsys):
    """``score`` keeps no posterior: it fits it again as the run did, so on the run's own test split ``laplace`` and
    ``map`` give the run's numbers (float summation order aside), and on a corrupted set both are scored."""
    from swalab.results.score import main

    cfg = compose_run(["method=laplace", f"model.init_from={sgd_run}", "method.grid_size=11",
                       f"run.cache_dir={tmp_path / 'cache'}"])
    train(cfg, run_dir=tmp_path / "laplace")
    own = json.loads((tmp_path / "laplace" / "metrics.json").read_text())
    records = main([str(tmp_path / "laplace"), "--data", "test", "--data", "cifar10c:contrast:5",
                    "--device", "cpu"])[str(tmp_path / "laplace")]["records"]
    again = records[0]["predictors"]
    for name in ("laplace", "map"):
        for metric in ("acc", "nll", "ece", "brier"):
            assert again[name][metric] == pytest.approx(own[name][metric], rel=1e-4, abs=1e-5), (name, metric)
    assert records[0]["laplace"]["refitted"] and not records[0]["not_scored"].get("laplace")
    assert {"laplace", "map"} <= set(records[1]["predictors"])
    # every predictor under the name its metrics.json gives it, its fitted temperature's too (map+ts, not sgd+ts)
    assert set(again) == scored_names(own) >= {"map", "map+ts", "laplace", "laplace+ts"}
    assert not records[0]["not_scored"]


def scored_names(metrics: dict) -> set[str]:
    return {name for name, m in metrics.items() if isinstance(m, dict) and "acc" in m}


def test_a_pretrained_run_is_scored_again_under_the_names_of_its_metrics_json(sgd_run, tmp_path):
    """Its live weights are its ``pretrained`` predictor (``Method.live``), not ``sgd``: re-scored under that name,
    with ``pretrained+ts`` at the temperature the run fitted."""
    from swalab.results.score import main

    cfg = compose_run(["method=pretrained", f"model.init_from={sgd_run}", f"run.cache_dir={tmp_path / 'cache'}"])
    train(cfg, run_dir=tmp_path / "pretrained")
    own = json.loads((tmp_path / "pretrained" / "metrics.json").read_text())
    record = main([str(tmp_path / "pretrained"), "--data", "test", "--device", "cpu"])[str(tmp_path / "pretrained")]
    again = record["records"][0]["predictors"]
    assert set(again) == scored_names(own) == {"pretrained", "pretrained+ts"}
    for name in again:
        assert again[name]["nll"] == pytest.approx(own[name]["nll"], rel=1e-4, abs=1e-5), name
    assert not record["records"][0]["not_scored"]


def test_a_second_score_reuses_the_prior_precision_the_first_refit_chose(sgd_run, tmp_path):
    """The grid search over the validation split is the refit's cost (``method.grid_size`` passes); a later score of
    the same run reads the prior precision an earlier refit chose, says where from, and scores as the first did."""
    from swalab.results.score import main

    cfg = compose_run(["method=laplace", f"model.init_from={sgd_run}", "method.grid_size=11",
                       f"run.cache_dir={tmp_path / 'cache'}"])
    train(cfg, run_dir=tmp_path / "laplace")
    run = str(tmp_path / "laplace")
    first = main([run, "--data", "test", "--device", "cpu"])[run]["records"][0]
    second = main([run, "--data", "cifar10c:contrast:5", "--data", "test", "--device", "cpu"])[run]["records"]
    assert first["laplace"]["prior_precision_from"] == "grid search on the validation split"
    assert second[0]["laplace"]["prior_precision_from"] == "an earlier refit's grid search (scores/test)"
    assert second[0]["laplace"]["prior_precision"] == first["laplace"]["prior_precision"]
    for metric in ("acc", "nll", "ece", "brier"):
        assert second[1]["predictors"]["laplace"][metric] == pytest.approx(first["predictors"]["laplace"][metric],
                                                                           rel=1e-4, abs=1e-5)


def conv_with_batchnorm() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.AdaptiveAvgPool2d(2),
                         nn.Flatten(), nn.Linear(16, 3))


def test_an_all_layer_laplace_under_a_weak_prior_predicts_otherwise_than_the_map_and_holds_batchnorm_as_loaded():
    """``weights="all"``: laplace-torch's Kronecker factors over every convolution and linear layer; BatchNorm's
    scale and shift (which curvlinops' factors do not cover) stay as loaded, out of the posterior."""
    model = conv_with_batchnorm().eval()
    g = torch.Generator().manual_seed(1)
    images, labels = torch.randn(60, 1, 6, 6, generator=g), torch.randint(0, 3, (60,), generator=g)
    loader = DataLoader(TensorDataset(images, labels), batch_size=20)
    with torch.no_grad():
        map_log_probs = model(images).log_softmax(dim=1)
    for hessian in ("kron", "diag"):
        la = fit_laplace(model, loader, loader, hessian, weights="all", prior_precision=[1e-2])
        assert la.n_params == sum(p.numel() for m in (model[0], model[5]) for p in m.parameters())
        assert not any(p.requires_grad for p in model[1].parameters())
        for link in ("probit", "bridge", "mc"):
            log_probs = LaplacePredictor(la, torch.device("cpu"), link, weights="all").predict_log_proba(loader)
            torch.testing.assert_close(log_probs.exp().sum(dim=1), torch.ones(len(labels)))
            assert (log_probs - map_log_probs).abs().max() > 0.05, (hessian, link)
    last = fit_laplace(conv_with_batchnorm().eval(), loader, loader, prior_precision=[1e-2])
    assert last.n_params == 16 * 3 + 3  # the default stays the last layer


def test_an_all_layer_laplace_with_a_dense_hessian_is_refused_in_one_line_before_anything_is_written(sgd_run, tmp_path):
    with pytest.raises(ConfigError, match=r"^method.weights=some: give one of last_layer, all$"):
        LaplaceMethod(weights="some")
    cfg = compose_run(["method=laplace", f"model.init_from={sgd_run}", "method.weights=all", "method.hessian=full",
                       f"run.cache_dir={tmp_path / 'cache'}"])
    with pytest.raises(ConfigError, match=r"^method.weights=all with method.hessian=full: .*give method.hessian=kron "
                                          r"or diag$") as refused:
        train(cfg, run_dir=tmp_path / "laplace")
    assert "\n" not in str(refused.value) and not (tmp_path / "laplace").exists()


def test_method_weights_at_last_layer_leaves_a_laplace_run_as_it_was_and_all_counts():
    """Runs made before method.weights existed were last-layer Laplace runs: at that value the key is no part of the
    identity (their directories and report cells stay theirs), at ``all`` it sets the run apart."""
    from omegaconf import OmegaConf

    from swalab.identity import identity_of

    cfg = OmegaConf.to_container(compose_run(["method=laplace", "model.init_from=null"]), resolve=True)
    assert cfg["method"]["weights"] == "last_layer" and "method.weights" not in identity_of(cfg)
    cfg["method"]["weights"] = "all"
    assert identity_of(cfg)["method.weights"] == "all"


# a PreResNet-8 (78,000 weights; their Jacobian on an 8x8 digit is fast) on fewer validation and test images
TINY_ALL = ["dataset.train_size=200", "dataset.val_size=20", "dataset.test_size=30", "trainer.batch_size=50",
            "run.eval_every=0", "model.arch.depth=8"]


def test_an_all_layer_laplace_run_is_scored_and_scored_again_by_refitting_it(tmp_path):
    """``method.weights=all`` through a run: the grid search on the validation split, the probit predictive, and
    ``results.score`` fitting the same posterior again, which gives the run's own numbers on its test split."""
    from conftest import train_on_one_thread

    from swalab.results.score import main

    train_on_one_thread(tmp_path / "sgd", *TINY_ALL, "method=sgd", "trainer.epochs=2",
                        f"run.cache_dir={tmp_path / 'cache'}")
    from conftest import CONF_DIR, QUIET
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[*QUIET, *TINY_ALL, "method=laplace", "method.weights=all",
                                                       f"model.init_from={tmp_path / 'sgd'}", "method.grid_size=2",
                                                       f"run.cache_dir={tmp_path / 'cache'}"])
    train(cfg, run_dir=tmp_path / "laplace")
    own = json.loads((tmp_path / "laplace" / "metrics.json").read_text())
    assert own["laplace"]["nll"] != own["map"]["nll"] and len(own["laplace"]["prior_precision"]) == 1
    run = str(tmp_path / "laplace")
    record = main([run, "--data", "test", "--device", "cpu"])[run]["records"][0]
    assert record["laplace"]["weights"] == "all" and not record["not_scored"]
    for metric in ("acc", "nll", "ece", "brier"):
        assert record["predictors"]["laplace"][metric] == pytest.approx(own["laplace"][metric], rel=1e-4, abs=1e-5)
