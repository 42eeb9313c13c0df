"""A training step captured once as a CUDA graph and replayed (``run.cuda_graphs``).

When and why: the paper's CIFAR networks at batch 128 are bound by launching kernels, not by the GPU's
arithmetic. PreResNet-164 launches about 1,800 kernels a step and its step takes as long at batch 512 as at 128;
the host spends longer issuing a step than the GPU spends running it. A CUDA graph records the step's kernels
once (forward, loss, backward, the optimizer's update) and replays them with one launch, so the GPU runs the same
kernels back to back with the host out of the way.

What a graph needs, and how :class:`GraphedStep` provides it:

* fixed addresses: the batch is copied into static input buffers before each replay, the outputs (the batch's
  mean loss and its count of right predictions) are static tensors the caller reads before the next replay, and
  the gradients live in the graph's private memory pool;
* a learning rate that changes without recapture: the optimizer must be ``torch.optim.SGD`` with ``fused=True``
  (``swalab.optim`` makes it so on CUDA), whose kernel reads a tensor ``lr`` from device memory; the foreach path
  passes the lr as a host scalar, which a graph would freeze at its capture value. The param group's ``lr`` stays
  a float outside the capture (checkpoints and logs read it as one);
* lazily made state made before capture: the first :data:`WARMUP_STEPS` steps of every ``fit`` run eagerly on a
  side stream (cuDNN and cuBLAS handles and workspaces, the momentum buffers), as torch's whole-network recipe
  does. They are real training steps on real batches, not extra ones;
* no host sync and no host-side branch inside the step (:func:`why_not_graphed` lists what has one);
* a batch of the captured shape: another shape (the last, partial batch of an epoch) runs eagerly.

Replaying the kernels eagerly launched gives the same numbers: the same cuDNN algorithms on the same data in the
same order. Under ``run.deterministic`` the weights after a graphed run are bit-equal to those after an eager one
(tests/test_gpu.py, over epochs and a pause and resume); random draws inside the step (dropout, Shake-Shake's
coefficients) come from the CUDA generator, whose offset a replay advances as the eager kernels would.

``run.cuda_graphs``: ``auto`` graphs the step wherever it can and otherwise trains eagerly, saying why once in
run.log; ``on`` refuses to start where the step cannot be graphed; ``off`` always trains eagerly."""

from __future__ import annotations

import warnings
from typing import Callable

import torch

from swalab.config import COMPILE_OWN_GRAPHS, ConfigError

GRAPH_MODES = ("auto", "on", "off")
WARMUP_STEPS = 3  # eager steps on a side stream before the capture: torch's recipe uses 3 (11 under DDP)

Step = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


def check_graph_mode(mode: str) -> str:
    if mode not in GRAPH_MODES:
        raise ConfigError(f"run.cuda_graphs={mode!r} must be one of {', '.join(GRAPH_MODES)}")
    return mode


def why_not_graphed(device: torch.device, optimizer: torch.optim.Optimizer, *, accumulate: int, nonfinite: str,
                    data_parallel: bool, compiled: str | None, grad_scaled: bool) -> str | None:
    """None when this run's training step can be captured as a CUDA graph, else the reason it cannot (the line
    run.log gives for training eagerly under ``run.cuda_graphs=auto``, the refusal under ``on``). ``compiled``:
    ``run.compile``'s mode, or None; a compiled step is captured like an eager one (the warm-up steps compile it)
    unless its mode captures graphs of its own."""
    if device.type != "cuda":
        return f"CUDA graphs need a CUDA device, and this run trains on {device.type}"
    if not isinstance(optimizer, torch.optim.SGD):
        return (f"only torch.optim.SGD is graphed (its fused update reads the learning rate from the device); "
                f"this run's optimizer is {type(optimizer).__name__}")
    if not all(group.get("fused") for group in optimizer.param_groups):
        return ("SGD without fused=True passes the learning rate as a host scalar, which a graph would freeze: "
                "leave optimizer.fused unset (swalab fuses SGD on CUDA) or set it to true")
    if accumulate > 1:
        return f"trainer.accumulate={accumulate} splits each batch into micro-batches of their own shape"
    if nonfinite == "skip":
        return "trainer.nonfinite=skip reads the loss back after every step to decide whether to apply it"
    if data_parallel:
        return "data parallelism's gradient all-reduce hooks are not captured"
    if compiled in COMPILE_OWN_GRAPHS:
        return f"run.compile={compiled} captures CUDA graphs of its own"
    if grad_scaled:
        return "trainer.precision=fp16's gradient scaler decides on the host whether to skip each step"
    return None


def graph_refusal(mode: str, device: torch.device, optimizer: torch.optim.Optimizer, **run) -> str | None:
    """Why a run under ``run.cuda_graphs=<mode>`` trains eagerly (``run.cuda_graphs=off``, or what
    :func:`why_not_graphed` finds, given the same ``run`` facts), or None when its step is graphed; ``on`` refuses a run
    that cannot be, before anything is written."""
    if check_graph_mode(mode) == "off":
        return "run.cuda_graphs=off"
    reason = why_not_graphed(device, optimizer, **run)
    if reason is not None and mode == "on":
        raise ConfigError(f"run.cuda_graphs=on, but {reason}; set run.cuda_graphs=auto (train eagerly where a graph "
                          "cannot hold the step) or off")
    return reason


class GraphedStep:
    """``step(x, target) -> (loss, correct)`` (zero the gradients, forward, loss, backward, optimizer update),
    replayed from a CUDA graph once captured (module doc).

    Call it once per training step with the batch and the step's learning rate; it runs ``step`` eagerly for the
    first :data:`WARMUP_STEPS` calls (on a side stream) and for a batch of another shape than the captured one,
    and from the next call on replays the graph. Build one per ``fit``: a graph holds the addresses of the
    optimizer's state and the model's tensors as they were at capture, and a restore replaces the former.

    ``strict`` (``run.cuda_graphs=on``): a capture that fails raises; otherwise (``auto``) the step warns once,
    names the error, and trains eagerly from then on."""

    def __init__(self, step: Step, optimizer: torch.optim.SGD, device: torch.device, strict: bool = False,
                 warmup: int = WARMUP_STEPS, note: Callable[[str], None] | None = None):
        self.step, self.optimizer, self.device, self.strict = step, optimizer, device, strict
        self.warmup = warmup
        self.note = note or (lambda line: warnings.warn(line, RuntimeWarning, stacklevel=3))
        self.lr = torch.zeros((), device=device)  # what the captured update reads its learning rate from
        self.graph: torch.cuda.CUDAGraph | None = None
        self.failed = False
        self.eager_steps = 0
        self.replays = 0
        self._static: tuple[torch.Tensor, ...] = ()
        self._side = torch.cuda.Stream(device)

    def __call__(self, x: torch.Tensor, target: torch.Tensor, lr: float) -> tuple[torch.Tensor, torch.Tensor]:
        """One training step at ``lr`` (the param groups' ``lr`` is set to it as well); returns the batch's loss and
        count of right predictions, which the next call may overwrite: read or accumulate them first."""
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        if self.graph is not None and self._fits(x, target):
            static_x, static_target, loss, correct = self._static
            static_x.copy_(x)
            static_target.copy_(target)
            self.lr.fill_(lr)
            self.graph.replay()
            self.replays += 1
            return loss, correct
        if self.graph is None and not self.failed and self.eager_steps >= self.warmup:
            captured = self._capture(x, target, lr)
            if captured is not None:
                return captured
        return self._eager(x, target)

    def _fits(self, x: torch.Tensor, target: torch.Tensor) -> bool:
        static_x, static_target = self._static[0], self._static[1]
        return (x.shape == static_x.shape and x.dtype == static_x.dtype and x.stride() == static_x.stride()
                and target.shape == static_target.shape and target.dtype == static_target.dtype)

    def _eager(self, x: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The step as it runs without a graph; the warm-up steps run on the side stream (torch's recipe)."""
        self.eager_steps += 1
        if self.graph is not None or self.failed or self.eager_steps > self.warmup:
            return self.step(x, target)
        current = torch.cuda.current_stream(self.device)
        self._side.wait_stream(current)
        with torch.cuda.stream(self._side):
            out = self.step(x, target)
        current.wait_stream(self._side)
        return out

    def _capture(self, x: torch.Tensor, target: torch.Tensor, lr: float):
        """Capture the step on static copies of this batch, then replay it once for this batch; None when the
        capture failed under ``auto`` (the step then runs eagerly, as every later one)."""
        static_x, static_target = x.clone(), target.clone()
        self.lr.fill_(lr)
        floats = [group["lr"] for group in self.optimizer.param_groups]
        self.optimizer.zero_grad(set_to_none=True)  # the backward allocates the gradients in the graph's pool
        graph = torch.cuda.CUDAGraph()
        try:
            for group in self.optimizer.param_groups:
                group["lr"] = self.lr
            with torch.cuda.graph(graph):
                loss, correct = self.step(static_x, static_target)
        except Exception as exc:  # noqa: BLE001  any op that cannot be captured, named in the message
            self.failed = True
            self.optimizer.zero_grad(set_to_none=True)
            if self.strict:
                raise RuntimeError(f"run.cuda_graphs=on: the training step could not be captured as a CUDA graph "
                                   f"({type(exc).__name__}: {exc}); set run.cuda_graphs=auto or off") from exc
            self.note(f"[swalab] CUDA graphs: the training step could not be captured ({type(exc).__name__}: "
                      f"{str(exc).splitlines()[0] if str(exc) else ''}); training eagerly")
            return None
        finally:
            for group, value in zip(self.optimizer.param_groups, floats):
                group["lr"] = value
        self.graph, self._static = graph, (static_x, static_target, loss, correct)
        self.note(f"[swalab] training step captured as a CUDA graph after {self.eager_steps} eager steps "
                  f"(batch {tuple(static_x.shape)}); replayed from here on (run.cuda_graphs)")
        graph.replay()
        self.replays += 1
        return loss, correct


def graphed_step(mode: str, device: torch.device, step: Step, optimizer: torch.optim.Optimizer, refusal: str | None,
                 note: Callable[[str], None]) -> GraphedStep | None:
    """A fit's CUDA-graphed ``step`` under ``run.cuda_graphs=mode``, or None to train eagerly because of ``refusal``
    (:func:`graph_refusal`'s reason), which ``note`` says once under ``auto`` on a GPU (run.log)."""
    if refusal is not None:
        if mode == "auto" and device.type == "cuda":
            note(f"[swalab] training eagerly, not as a CUDA graph: {refusal}")
        return None
    return GraphedStep(step, optimizer, device, strict=mode == "on", note=note)
