"""What a run reports is computed in float32 whatever it trained in, and a GPU run can repeat itself bit for bit.

* Scoring and the BN update of an averaged model run with autocast off (``swalab.precision.scoring_precision``),
  even when called inside an autocast region: a network trained under bf16 autocast (on the CPU here, which torch
  runs as it would on a GPU, only slower) reports exactly the metrics its weights give when scored afresh in
  float32. Its metrics differ from an fp32-trained run's only through the weights.
* ``run.deterministic`` (on by default) sets cuDNN's and torch's deterministic algorithms on CUDA for the length of
  a fit and restores what it found; on the CPU it changes nothing. It is not part of a run's identity: like
  ``run.device`` it changes how floats are summed on a GPU, never what is computed.
"""

from __future__ import annotations

import copy
import os
import warnings

import pytest
import torch
from torch import nn

from swalab import precision
from swalab.data import ResidentLoader
from swalab.evaluate import metrics_from_log_probs, predict_log_probs, predict_logits, recompute_bn
from swalab.methods import SWA
from swalab.precision import deterministic
from swalab.schedules import Constant
from swalab.train.build import trainer_options
from swalab.trainer import Trainer, TrainerOptions
from test_rank_agreement import bn_model, toy_data

CPU = torch.device("cpu")


def loaders():
    common = dict(device=CPU, mean=[0.5], std=[0.25])
    train = ResidentLoader(toy_data(), 32, train=True, pad=1, flip=False, seed=3, **common)
    test = ResidentLoader(toy_data(150), 64, train=False, **common)
    bn = ResidentLoader(toy_data(), 24, train=True, pad=1, flip=False, seed=4, drop_last=False, **common)
    return train, test, bn


def train_swa(run_dir, precision: str) -> tuple[Trainer, SWA, dict]:
    train, test, bn = loaders()
    method = SWA(Constant(lr=0.05), 3, lr=0.02, start_epoch=1)
    trainer = Trainer(bn_model(), method, train, test, bn, CPU, run_dir,
                      TrainerOptions(epochs=3, precision=precision, progress=False, handle_signals=False))
    return trainer, method, trainer.fit().metrics


def test_a_network_trained_in_bf16_reports_what_its_weights_score_in_float32(tmp_path):
    trainer, method, metrics = train_swa(tmp_path / "bf16", "bf16")
    _, _, fp32_metrics = train_swa(tmp_path / "fp32", "fp32")
    assert metrics["sgd"] != fp32_metrics["sgd"]  # the steps did run in bf16: other weights, other numbers
    _, test, bn = loaders()
    labels = trainer.test_labels
    live = copy.deepcopy(trainer.model)
    assert metrics_from_log_probs(predict_log_probs(live, test, CPU), labels) == {
        k: v for k, v in metrics["sgd"].items() if k not in ("budget", "epoch")}
    average = copy.deepcopy(method.averaged.module)  # its BN statistics recomputed once more, in float32
    recompute_bn(average, bn, CPU)
    for name, value in method.averaged.module.state_dict().items():
        assert torch.equal(average.state_dict()[name], value), name
    assert metrics_from_log_probs(predict_log_probs(average, test, CPU), labels) == {
        k: v for k, v in metrics["swa"].items() if k not in ("budget", "epoch", "n_averaged")}


def test_scoring_and_the_bn_update_stay_float32_inside_an_autocast_region():
    _, test, bn = loaders()
    model = bn_model()
    logits = predict_logits(model, test, CPU)
    alone = copy.deepcopy(model)
    recompute_bn(alone, bn, CPU)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.equal(predict_logits(model, test, CPU), logits)
        recompute_bn(model, bn, CPU)
        with torch.no_grad():
            rounded = copy.deepcopy(model).eval()(next(iter(test))[0])  # what the autocast region itself computes
    for name, value in alone.state_dict().items():
        assert torch.equal(model.state_dict()[name], value), name
    assert rounded.dtype == torch.bfloat16 and not torch.equal(rounded.float(), logits[: len(rounded)])


def test_auto_is_bf16_on_cuda_only_and_the_named_precisions_autocast_on_any_device():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # without a GPU torch says it would disable it
        assert precision.training_autocast(torch.device("cuda"), "auto").fast_dtype == torch.bfloat16
    with precision.training_autocast(CPU, "auto"):
        assert not torch.is_autocast_enabled("cpu")
    for name, dtype in (("bf16", torch.bfloat16), ("fp16", torch.float16)):
        with precision.training_autocast(CPU, name):
            assert torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == dtype
    with precision.training_autocast(torch.device("cuda"), "fp32") as context:
        assert context is None  # a no-op context
    assert precision.grad_scaler(CPU, "fp16") is not None and precision.grad_scaler(CPU, "bf16") is None


def flags() -> tuple:
    cudnn = torch.backends.cudnn
    return (cudnn.deterministic, cudnn.benchmark, torch.are_deterministic_algorithms_enabled(),
            torch.is_deterministic_algorithms_warn_only_enabled())


def test_deterministic_sets_cudnn_and_torchs_algorithms_on_cuda_and_restores_them(monkeypatch):
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    before = flags()
    with deterministic(torch.device("cuda", 0), True):  # flags only: nothing runs on a GPU here
        assert flags() == (True, False, True, True)
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    assert flags() == before
    with deterministic(torch.device("cuda", 0), False):
        assert flags() == (False, True, False, True)  # cuDNN autotunes: fastest, not repeatable
    with deterministic(CPU, True):
        assert flags() == before  # a CPU's kernels are deterministic already


def test_run_deterministic_is_on_by_default_and_reaches_the_trainer(make_cfg):
    assert make_cfg().run.deterministic is True
    assert trainer_options(make_cfg(), 2).deterministic is True
    assert trainer_options(make_cfg("run.deterministic=false"), 2).deterministic is False
