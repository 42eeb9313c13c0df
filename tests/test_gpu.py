"""The checks of issue 31 on CUDA: what the CPU tests settle with gloo, CPU bf16 and the profiler, run on a GPU.

Every test here needs CUDA (two GPUs where it says so) and is skipped, with the reason, without it; ``pytest -m gpu``
runs them (the default selection leaves ``gpu`` out). Bit-equality is asserted only under ``run.deterministic``
(``TrainerOptions(deterministic=True)``, the default), the setting that makes a GPU repeat itself.

* streaming loader: pinned batches are the batches (item 1);
* two ranks on NCCL: a NaN step on one rank, a signal to one rank, a model drawing random numbers paused and
  resumed, a run finished meanwhile: no hang, checkpoints where due, bit-equal resumes (items 2, 3, 8; two GPUs);
* the training GPU's generator is checkpointed alone, and a resume restores it (item 3);
* bf16 training, float32 scoring (item 4);
* the same run twice, and a run paused and resumed, end bit-equal under ``run.deterministic`` (item 5);
* no host sync in a training step or a BN-update batch: ``torch.cuda.set_sync_debug_mode("error")`` raises on any
  (item 6);
* FGE's predictions in their own files, resumed on the GPU (item 7);
* ``run.device=cuda:N`` makes GPU N the current device (item 8).
"""

from __future__ import annotations

import copy
import json

import pytest
import torch

from test_imagenet import tiny_imagenet  # noqa: F401  (a fixture)

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
two_gpus = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices (NCCL between them)")
CUDA = torch.device("cuda", 0)


@pytest.fixture
def on_cuda(monkeypatch):
    """The CPU tests' helpers build their trainers on the first GPU."""
    import test_rank_decisions

    monkeypatch.setattr(test_rank_decisions, "DEVICE", CUDA)


# -- 1. streaming loader ----------------------------------------------------------------------------------------
def test_pinned_stream_batches_are_the_batches(tiny_imagenet):
    from swalab.data.imagenet import StreamLoader, imagenet_transforms, load_imagenet

    train_tf, _, _ = imagenet_transforms("test_resnet", image_size=32)
    split = load_imagenet(tiny_imagenet).train.with_transform(train_tf)
    plain, pinned = (StreamLoader(split, 2, train=True, seed=1, rank=1, world_size=2, pin_memory=p) for p in (False, True))
    for (x, y), (xp, yp) in zip(plain, pinned):
        assert xp.is_pinned() and torch.equal(xp.to(CUDA, non_blocking=True).cpu(), x) and torch.equal(yp, y)


# -- 2, 3, 8. two ranks on NCCL -----------------------------------------------------------------------------------
@two_gpus
@pytest.mark.parametrize("scenario", ["nan_on_rank_0", "pause_then_resume", "pause_a_dropout_model",
                                      "train_then_find_finished"])
def test_two_ranks_on_nccl_decide_together(tmp_path, scenario):
    from swalab.runlock import RunLock
    from test_rank_decisions import two_ranks

    with RunLock(tmp_path / "c"):
        ranks = two_ranks(tmp_path, scenario, backend="nccl")
    if scenario == "nan_on_rank_0":
        for name, value in ranks[0]["weights"].items():
            assert torch.equal(ranks[1]["weights"][name], value), name
        assert ranks[0]["warnings"] == ["non-finite loss at epoch 1, step 3: step skipped"] and ranks[1]["warnings"] == []
    elif scenario == "train_then_find_finished":
        assert ranks[0]["found"] == ranks[1]["found"] == json.loads((tmp_path / "a" / "metrics.json").read_text())
        assert ranks[1]["lines"] == [] and ranks[1]["refused"].startswith("RuntimeError: rank 0 could not start")
    else:
        for r in (0, 1):
            assert ranks[r]["written"] == ["epoch0000_step000003.pt"]
            for name, value in ranks[r]["straight"].items():
                assert torch.equal(ranks[r]["resumed"][name], value), (r, name)


# -- 3. the training GPU's generator ------------------------------------------------------------------------------
def test_a_checkpoint_holds_the_training_gpus_generator_and_a_resume_restores_it(tmp_path, on_cuda, monkeypatch):
    from swalab import faults
    from swalab.checkpoint import CheckpointStore
    from swalab.pausing import Preempted
    from test_rank_decisions import dropout_model, toy_trainer, weights

    model = dropout_model()  # dropout masks of CUDA tensors come from the GPU's generator
    torch.cuda.manual_seed(5)
    straight = toy_trainer(tmp_path / "straight", 0, 1, model)
    straight.fit()
    model = dropout_model()
    torch.cuda.manual_seed(5)
    monkeypatch.setenv(faults.ENV, "train_step:3:TERM")
    faults.reset()
    with pytest.raises(Preempted):
        toy_trainer(tmp_path / "paused", 0, 1, model, handle_signals=True).fit()
    monkeypatch.delenv(faults.ENV)
    state = CheckpointStore(tmp_path / "paused").latest()
    assert set(state["rng"]) == {"torch", "python", "numpy", "device"} and state["rng"]["device"].dtype == torch.uint8
    torch.cuda.manual_seed(999)  # another GPU stream when the run is launched again
    resumed = toy_trainer(tmp_path / "paused", 0, 1, dropout_model())
    resumed.fit(state)
    for name, value in weights(straight).items():
        assert torch.equal(weights(resumed)[name], value), name


# -- 4. bf16 training, float32 scoring ------------------------------------------------------------------------------
def test_a_network_trained_in_bf16_on_cuda_reports_what_its_weights_score_in_float32(tmp_path):
    from swalab.data import ResidentLoader
    from swalab.evaluate import metrics_from_log_probs, predict_log_probs, predict_logits
    from swalab.methods import SGD
    from swalab.schedules import Constant
    from swalab.trainer import Trainer, TrainerOptions
    from test_rank_agreement import bn_model, toy_data

    common = dict(device=CUDA, mean=[0.5], std=[0.25])
    train = ResidentLoader(toy_data(), 32, train=True, pad=1, flip=False, seed=3, **common)
    test = ResidentLoader(toy_data(150), 64, train=False, **common)
    trainer = Trainer(bn_model(), SGD(Constant(lr=0.05), 2), train, test, test, CUDA, tmp_path,
                      TrainerOptions(epochs=2, precision="bf16", progress=False, handle_signals=False))
    metrics = trainer.fit().metrics["sgd"]
    fresh = copy.deepcopy(trainer.model)
    assert metrics_from_log_probs(predict_log_probs(fresh, test, CUDA), trainer.test_labels) == {
        k: v for k, v in metrics.items() if k not in ("budget", "epoch")}
    logits = predict_logits(fresh, test, CUDA)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        assert torch.equal(predict_logits(fresh, test, CUDA), logits)


# -- 5. bit-equality under run.deterministic ------------------------------------------------------------------------
def test_the_same_run_twice_and_a_paused_run_end_bit_equal_on_cuda_under_run_deterministic(tmp_path, monkeypatch):
    from swalab import faults
    from swalab.train import train
    from swalab.pausing import Preempted
    from test_reliability import assert_same_run, make_cfg

    cfg = make_cfg("run.device=cuda", "run.deterministic=true")
    train(cfg, run_dir=tmp_path / "first")
    train(cfg, run_dir=tmp_path / "second")
    assert_same_run(tmp_path / "second", tmp_path / "first")
    monkeypatch.setenv(faults.ENV, "train_step:6:TERM")
    faults.reset()
    with pytest.raises(Preempted):
        train(cfg, run_dir=tmp_path / "paused")
    monkeypatch.delenv(faults.ENV)
    train(cfg, run_dir=tmp_path / "paused")
    assert_same_run(tmp_path / "paused", tmp_path / "first")


# -- 6. no host sync --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("cuda_graphs", ["off", "on"])
@pytest.mark.parametrize("method_name", ["sgd", "ema"])
def test_a_training_step_and_a_bn_update_batch_make_no_host_sync_on_cuda(tmp_path, method_name, cuda_graphs):
    import contextlib
    import io

    from swalab.graphed import WARMUP_STEPS

    from swalab.data import DataSplit, ResidentLoader
    from swalab.evaluate import recompute_bn
    from swalab.methods import EMA, SGD
    from swalab.models import PreResNet
    from swalab.schedules import Constant
    from swalab.trainer import Trainer, TrainerOptions

    base = {"sgd": SGD, "ema": EMA}[method_name]

    class Watched(base):  # sync debug mode "error" once the step is captured, to the end of the last step
        def on_step_end(self, ctx, epoch, step):
            super().on_step_end(ctx, epoch, step)
            torch.cuda.set_sync_debug_mode("error" if WARMUP_STEPS + 1 <= step + 1 < ctx.steps_per_epoch else "default")

    split = DataSplit(torch.randint(0, 256, (8 * 12, 3, 16, 16), dtype=torch.uint8), torch.arange(8 * 12) % 10)
    common = dict(device=CUDA, mean=(0.5,) * 3, std=(0.25,) * 3)
    train = ResidentLoader(split, 8, train=True, drop_last=True, **common)
    test = ResidentLoader(split, 64, train=False, **common)
    method = Watched(Constant(lr=0.01), 1, **({"decay": 0.99} if method_name == "ema" else {}))
    trainer = Trainer(PreResNet(depth=8, num_classes=10, in_channels=3), method, train, test, train, CUDA, tmp_path,
                      TrainerOptions(epochs=1, eval_every=0, progress=None, handle_signals=False,
                                     cuda_graphs=cuda_graphs))
    batches = list(train)  # on the GPU already: the loader's once-a-pass copy of its epoch's draws is not per batch
    try:
        with contextlib.redirect_stderr(io.StringIO()):  # off a terminal
            trainer.fit()
        torch.cuda.set_sync_debug_mode("error")
        recompute_bn(copy.deepcopy(trainer.model), batches, CUDA)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert (trainer.graphed is not None and trainer.graphed.replays == 12 - WARMUP_STEPS) == (cuda_graphs == "on")


# -- 7. predictions in files of their own ---------------------------------------------------------------------------
def test_fge_resumes_its_members_from_their_files_on_cuda(tmp_path, monkeypatch):
    import test_checkpoint_predictions as cp

    monkeypatch.setattr(cp, "CPU", CUDA)
    straight = cp.trainer(tmp_path / "straight", "fge")
    metrics = straight.fit().metrics
    resumed = cp.pause_and_resume(tmp_path / "paused", "fge", monkeypatch)
    assert resumed.evaluate().metrics == metrics
    assert sorted(p.name for p in (tmp_path / "paused" / "checkpoints" / "predictions").iterdir()) == [
        "fge_member_001.pt", "fge_member_002.pt", "fge_member_003.pt"]


# -- 8. run.device=cuda:N ---------------------------------------------------------------------------------------------
def test_run_device_cuda_n_is_the_current_device():
    from swalab import distributed

    last = torch.device("cuda", torch.cuda.device_count() - 1)
    before = torch.cuda.current_device()
    try:
        assert distributed.local_device(last) == last and torch.cuda.current_device() == last.index
    finally:
        torch.cuda.set_device(before)


# -- issue 29: the recipes' device-specific paths ---------------------------------------------------------------
@pytest.mark.parametrize("method_name", ["swa", "ema"])
def test_an_average_kept_on_the_cpu_of_a_gpu_run_lives_there_and_gives_the_same_run(tmp_path, monkeypatch,
                                                                                       method_name):
    import test_recipes

    monkeypatch.setattr(test_recipes, "CPU", CUDA)  # the recipe tests' trainers, built on the GPU
    from swalab.methods import EMA, SWA
    from swalab.schedules import Constant
    from test_rank_agreement import bn_model

    def run(where):
        method = (SWA(Constant(lr=0.05), 3, lr=0.02, start_epoch=1, avg_device=where) if method_name == "swa"
                  else EMA(Constant(lr=0.05), 3, decay=0.9, avg_device=where))
        trainer = test_recipes.trainer_for(tmp_path / where, bn_model(), {}, epochs=3, method=method)
        trainer.fit()
        average = method.averaged.module if method_name == "swa" else method.ema.module
        return {k: v.cpu() for k, v in average.state_dict().items()}, method

    on_gpu, _ = run("train")
    on_cpu, method = run("cpu")
    for name, value in on_gpu.items():
        torch.testing.assert_close(on_cpu[name], value, rtol=1e-6, atol=1e-7, msg=name)


def test_fp16_on_a_gpu_scales_its_loss_and_finishes(tmp_path, monkeypatch):
    import test_recipes

    monkeypatch.setattr(test_recipes, "CPU", CUDA)
    trainer = test_recipes.trainer_for(tmp_path, test_recipes.no_bn_model(), {"precision": "fp16"}, epochs=2)
    assert trainer.step.scaler is not None and trainer.fit().metrics["sgd"]["acc"] >= 0
    assert trainer.state(2, 0)["scaler"]["scale"] > 0


# -- issue 39: the CUDA-graphed training step ------------------------------------------------------------------------
GRAPHED_MODELS = {
    "preresnet": [],
    # dropout draws from the GPU's generator inside the graph; a replay must draw what the eager kernels drew
    "wrn_dropout": ["model=wrn28_10", "model.arch.depth=10", "model.arch.widen_factor=1", "model.arch.dropout=0.3"],
}


@pytest.mark.parametrize("model", list(GRAPHED_MODELS))
def test_a_graphed_run_and_its_pause_and_resume_end_bit_equal_to_an_eager_run(tmp_path, monkeypatch, model):
    from swalab import faults
    from swalab.train import train
    from swalab.pausing import Preempted
    from test_reliability import assert_same_run, make_cfg

    def cfg(graphs):
        return make_cfg("dataset=digits", *GRAPHED_MODELS[model], "run.device=cuda", "run.deterministic=true",
                        f"run.cuda_graphs={graphs}")

    train(cfg("off"), run_dir=tmp_path / "eager")
    train(cfg("on"), run_dir=tmp_path / "graphed")
    assert "captured as a CUDA graph" in (tmp_path / "graphed" / "run.log").read_text()
    assert "captured as a CUDA graph" not in (tmp_path / "eager" / "run.log").read_text()
    environment, = json.loads((tmp_path / "graphed" / "environment.json").read_text())
    assert environment["device_name"] == torch.cuda.get_device_name(0) and environment["training_autocast"] == "bfloat16"
    assert_same_run(tmp_path / "graphed", tmp_path / "eager")
    monkeypatch.setenv(faults.ENV, "train_step:6:TERM")
    faults.reset()
    with pytest.raises(Preempted):
        train(cfg("on"), run_dir=tmp_path / "paused")
    monkeypatch.delenv(faults.ENV)
    train(cfg("on"), run_dir=tmp_path / "paused")
    assert_same_run(tmp_path / "paused", tmp_path / "eager")


def test_a_compiled_step_captured_as_a_graph_ends_bit_equal_to_the_same_compiled_step_run_eagerly(tmp_path):
    """run.compile's default mode leaves the graph to run.cuda_graphs: the capture of the compiled step (compiled
    during the warm-up steps) replays the compiled kernels as launched one by one; a mode with graphs of its own
    trains without swalab's, and run.log says why."""
    from swalab.train import train
    from test_reliability import assert_same_run, make_cfg

    def cfg(*extra):
        return make_cfg("dataset=digits", "run.device=cuda", "run.deterministic=true", *extra)

    train(cfg("run.compile=true", "run.cuda_graphs=off"), run_dir=tmp_path / "eager")
    train(cfg("run.compile=true", "run.cuda_graphs=on"), run_dir=tmp_path / "graphed")
    assert "captured as a CUDA graph" in (tmp_path / "graphed" / "run.log").read_text()
    assert_same_run(tmp_path / "graphed", tmp_path / "eager")
    train(cfg("run.compile=reduce-overhead"), run_dir=tmp_path / "own")
    assert "run.compile=reduce-overhead captures CUDA graphs of its own" in (tmp_path / "own" / "run.log").read_text()


def test_sgd_on_cuda_is_fused_and_a_graphed_step_follows_each_steps_learning_rate(tmp_path):
    from swalab.data import DataSplit, ResidentLoader
    from swalab.methods import SGD
    from swalab.schedules import Constant
    from swalab.trainer import Trainer, TrainerOptions
    from test_rank_agreement import bn_model

    class Halving(SGD):  # a new learning rate every step: a graph that froze the lr would train at the first
        def step_lr(self, epoch, step, steps):
            return 0.1 / 2 ** (epoch * steps + step)

    from swalab.graphed import WARMUP_STEPS

    split = DataSplit(torch.randint(0, 256, (8 * 8, 1, 8, 8), dtype=torch.uint8), torch.arange(8 * 8) % 4)
    runs = {}
    for graphs in ("off", "on"):
        torch.manual_seed(0)
        loader = ResidentLoader(split, 8, train=True, drop_last=True, device=CUDA, mean=[0.5], std=[0.25])
        trainer = Trainer(bn_model(), Halving(Constant(lr=0.1), 1), loader, loader, loader, CUDA, tmp_path / graphs,
                          TrainerOptions(epochs=1, eval_every=0, progress=False, handle_signals=False,
                                         cuda_graphs=graphs))
        assert all(group["fused"] for group in trainer.optimizer.param_groups)
        trainer.fit()
        runs[graphs] = trainer
    assert runs["on"].graphed.replays == 8 - WARMUP_STEPS and runs["off"].graphed is None
    assert [g["lr"] for g in runs["on"].optimizer.param_groups] == [0.1 / 2 ** 7]
    for name, value in runs["off"].model.state_dict().items():
        assert torch.equal(runs["on"].model.state_dict()[name], value), name
