"""``run.cuda_graphs`` on the CPU: which runs can be graphed and why not, the refusals, SGD fused only on CUDA, and
the deterministic switch's NaN fill. The captured step itself needs a GPU (tests/test_gpu.py: bit-equal to eager)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from swalab.config import ConfigError
from swalab.graphed import check_graph_mode, why_not_graphed
from swalab.optim import OptimizerSpec, fuses_by_default
from swalab.precision import deterministic

CUDA = torch.device("cuda")  # a device object only: nothing here touches a GPU


def fused_sgd() -> torch.optim.SGD:
    """An SGD whose groups say fused, as swalab builds it on CUDA (the flag alone: no step is taken)."""
    optimizer = torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1, momentum=0.9)
    for group in optimizer.param_groups:
        group["fused"] = True
    return optimizer


def blocker(**changes) -> str | None:
    settings = dict(device=CUDA, optimizer=fused_sgd(), accumulate=1, nonfinite="stop", data_parallel=False,
                    compiled=None, grad_scaled=False)
    settings.update(changes)
    device, optimizer = settings.pop("device"), settings.pop("optimizer")
    return why_not_graphed(device, optimizer, **settings)


def test_a_plain_run_on_cuda_with_fused_sgd_can_be_graphed():
    assert blocker() is None


@pytest.mark.parametrize("changes, words", [
    (dict(device=torch.device("cpu")), "trains on cpu"),
    (dict(optimizer=torch.optim.AdamW(nn.Linear(2, 2).parameters())), "this run's optimizer is AdamW"),
    (dict(optimizer=torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1)), "leave optimizer.fused unset"),
    (dict(accumulate=2), "trainer.accumulate=2"),
    (dict(nonfinite="skip"), "trainer.nonfinite=skip"),
    (dict(data_parallel=True), "all-reduce"),
    (dict(compiled="reduce-overhead"), "run.compile=reduce-overhead captures CUDA graphs of its own"),
    (dict(compiled="max-autotune"), "run.compile=max-autotune captures CUDA graphs of its own"),
    (dict(grad_scaled=True), "trainer.precision=fp16"),
])
def test_each_thing_a_graph_cannot_hold_is_named_as_the_reason(changes, words):
    assert words in blocker(**changes)


@pytest.mark.parametrize("mode", ["default", "max-autotune-no-cudagraphs"])
def test_a_step_compiled_in_a_mode_without_graphs_of_its_own_is_graphed_by_swalab(mode):
    assert blocker(compiled=mode) is None


def test_run_compile_takes_false_true_or_a_torch_compile_mode():
    from swalab.config import compile_mode
    assert [compile_mode(v) for v in (False, True, "default", "reduce-overhead", "max-autotune-no-cudagraphs")] == [
        None, "default", "default", "reduce-overhead", "max-autotune-no-cudagraphs"]
    with pytest.raises(ConfigError, match=r"run.compile='fast' must be false, true or a torch.compile mode: default, "):
        compile_mode("fast")


def test_run_cuda_graphs_takes_auto_on_or_off():
    assert [check_graph_mode(m) for m in ("auto", "on", "off")] == ["auto", "on", "off"]
    with pytest.raises(ConfigError, match=r"run.cuda_graphs='yes' must be one of auto, on, off"):
        check_graph_mode("yes")


@pytest.mark.parametrize("override, words", [("run.cuda_graphs=always", "run.cuda_graphs='always'"),
                                             ("run.compile=reduce_overhead", "run.compile='reduce_overhead'")])
def test_a_bad_graph_or_compile_setting_is_refused_before_the_run_starts(tmp_path, override, words):
    from swalab.train import train
    from test_reliability import make_cfg

    with pytest.raises(ConfigError, match=words):
        train(make_cfg(override), run_dir=tmp_path / "run")
    assert not (tmp_path / "run").exists()


def toy_trainer(tmp_path, graphs: str, **options):
    from swalab.data import DataSplit, ResidentLoader
    from swalab.methods import SGD
    from swalab.schedules import Constant
    from swalab.trainer import Trainer, TrainerOptions

    split = DataSplit(torch.randint(0, 256, (16, 1, 4, 4), dtype=torch.uint8), torch.arange(16) % 2)
    loader = ResidentLoader(split, 8, train=True, drop_last=True, device=torch.device("cpu"), mean=[0.5], std=[0.25])
    model = nn.Sequential(nn.Flatten(), nn.Linear(16, 2))
    return Trainer(model, SGD(Constant(lr=0.1), 1), loader, loader, loader, torch.device("cpu"), tmp_path,
                   TrainerOptions(epochs=1, eval_every=0, progress=False, handle_signals=False, cuda_graphs=graphs,
                                  **options))


def test_run_cuda_graphs_on_is_refused_with_the_reason_where_the_step_cannot_be_graphed(tmp_path):
    with pytest.raises(ConfigError, match=r"run.cuda_graphs=on, but CUDA graphs need a CUDA device, and this run "
                                          r"trains on cpu; set run.cuda_graphs=auto .* or off"):
        toy_trainer(tmp_path, "on")
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("graphs", ["auto", "off"])
def test_auto_and_off_train_eagerly_on_the_cpu_without_a_word(tmp_path, graphs, caplog):
    trainer = toy_trainer(tmp_path, graphs)
    with caplog.at_level("INFO", logger="swalab"):
        trainer.fit()
    assert trainer.graphed is None and "CUDA graph" not in caplog.text
    assert trainer.ungraphed_because == ("run.cuda_graphs=off" if graphs == "off"
                                         else "CUDA graphs need a CUDA device, and this run trains on cpu")


def test_sgd_is_fused_by_default_only_on_cuda_parameters_and_only_when_unset():
    cpu_groups = [{"params": list(nn.Linear(2, 2).parameters())}]
    assert not fuses_by_default(torch.optim.SGD, {}, cpu_groups)
    built = OptimizerSpec(settings={"momentum": 0.9}).build(nn.Linear(2, 2), lr=0.1)
    assert not any(g["fused"] for g in built.param_groups)  # torch's own update on the CPU, as before
    meta = [{"params": [nn.Parameter(torch.empty(2, device="meta"))]}]
    assert not fuses_by_default(torch.optim.SGD, {}, meta)  # not CUDA
    assert not fuses_by_default(torch.optim.SGD, {}, [{"params": []}])


def test_sgd_on_cuda_parameters_is_fused_unless_fused_or_foreach_is_set(monkeypatch):
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))  # the parameters as CUDA ones
    groups = [{"params": list(nn.Linear(2, 2).parameters())}]
    assert fuses_by_default(torch.optim.SGD, {"momentum": 0.9}, groups)
    assert not fuses_by_default(torch.optim.SGD, {"fused": False}, groups)
    assert not fuses_by_default(torch.optim.SGD, {"foreach": True}, groups)
    assert not fuses_by_default(torch.optim.AdamW, {}, groups)


def test_run_deterministic_turns_the_nan_fill_of_new_memory_off_and_restores_it(monkeypatch):
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    fill = torch.utils.deterministic
    before = fill.fill_uninitialized_memory
    cudnn = (torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark)
    try:
        fill.fill_uninitialized_memory = True
        with deterministic(CUDA, True):
            assert torch.are_deterministic_algorithms_enabled() and fill.fill_uninitialized_memory is False
        assert fill.fill_uninitialized_memory is True and not torch.are_deterministic_algorithms_enabled()
        with deterministic(torch.device("cpu"), True):  # nothing changes on a CPU
            assert fill.fill_uninitialized_memory is True
    finally:
        fill.fill_uninitialized_memory = before
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = cudnn


def test_a_restore_keeps_this_machines_update_kernels_and_takes_the_rest_from_the_checkpoint(tmp_path):
    """A checkpoint written on another machine (here: one whose SGD ran fused on a GPU) resumes with the update
    this machine chose; its hyperparameters and momentum come from the checkpoint."""
    written = toy_trainer(tmp_path / "a", "auto")
    written.fit()
    state = written.state(1, 0)
    state["optimizer"]["param_groups"][0].update(fused=True, foreach=False, lr=0.0123)
    resumed = toy_trainer(tmp_path / "b", "auto")
    resumed.run_dir.mkdir()
    chosen = {k: resumed.optimizer.param_groups[0][k] for k in ("fused", "foreach")}
    resumed.restore(state)
    group = resumed.optimizer.param_groups[0]
    assert {k: group[k] for k in ("fused", "foreach")} == chosen and group["lr"] == 0.0123
    momentum = [resumed.optimizer.state[p]["momentum_buffer"] for p in resumed.model.parameters()]
    assert all(torch.equal(m, written.optimizer.state[p]["momentum_buffer"])
               for m, p in zip(momentum, written.model.parameters()))


def test_environment_json_records_what_the_training_precision_resolved_to(tmp_path):
    import json

    from swalab.train import train
    from test_reliability import make_cfg

    train(make_cfg("run.device=cpu"), run_dir=tmp_path / "auto")
    train(make_cfg("run.device=cpu", "trainer.precision=bf16"), run_dir=tmp_path / "bf16")
    auto, = json.loads((tmp_path / "auto" / "environment.json").read_text())
    bf16, = json.loads((tmp_path / "bf16" / "environment.json").read_text())
    assert (auto["device"], auto["training_autocast"], "device_name" in auto) == ("cpu", "float32 (none)", False)
    assert bf16["training_autocast"] == "bfloat16"


def test_environment_json_records_each_starts_compile_mode_and_determinism(tmp_path):
    """run.compile and run.deterministic change a run's rounding, not its identity: each start of the run records
    the values it ran with, since config.yaml keeps only the latest start's."""
    import json

    from swalab.train import train
    from swalab.train.records import environment_entry
    from test_reliability import make_cfg

    train(make_cfg("run.device=cpu", "run.deterministic=false"), run_dir=tmp_path / "run")
    entry, = json.loads((tmp_path / "run" / "environment.json").read_text())
    assert (entry["compile"], entry["deterministic"]) == ("off", False)
    compiled = environment_entry("cpu", {"commit": None, "dirty": False}, "auto", "max-autotune-no-cudagraphs", True)
    assert (compiled["compile"], compiled["deterministic"]) == ("max-autotune-no-cudagraphs", True)
