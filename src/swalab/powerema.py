"""EDM2's power-function EMA (Karras et al. 2024, "Analyzing and Improving the Training Dynamics of Diffusion
Models", Section 3 and Appendix C): averages tracked during training whose profile any width can be rebuilt from
afterwards.

**The profile.** A power-function EMA at time t (in optimizer steps) weighs the weights of time tau by

    p_(t, gamma)(tau) = (gamma + 1) tau^gamma / t^(gamma + 1),   0 < tau <= t,

a density on (0, t]: it forgets the start at a rate set by gamma and looks the same at every t once time is measured
in units of t (self-similar). Its width relative to t, the standard deviation of tau / t under it, is

    sigma_rel = sqrt((gamma + 1) / ((gamma + 2)^2 (gamma + 3)))

(the mean of tau / t is (gamma + 1) / (gamma + 2), its second moment (gamma + 1) / (gamma + 3)). sigma_rel is what a
user chooses (the paper's 0.05 and 0.10); :func:`gamma_of` inverts it. sigma_rel rises from 0 at gamma = -1 to its
largest, 0.3003, at gamma = (sqrt 5 - 3) / 2 = -0.382 and falls to 0 as gamma grows: the inverse taken is the branch of
gamma above that, the averages that weigh the end most (the paper's cubic's largest root).

**Tracking it.** With theta_t the weights after step t, e_1 = theta_1 and e_t = beta_t e_(t-1) + (1 - beta_t) theta_t
with beta_t = (1 - 1/t)^(gamma + 1). Unrolled, theta_tau gets the weight (tau^(gamma+1) - (tau-1)^(gamma+1)) /
t^(gamma+1), the integral of p_(t, gamma) over (tau - 1, tau]: the discrete EMA is exactly the continuous one of the
weights held constant over each step.

**Rebuilding another profile.** Snapshots of the tracked EMAs at times t_i with exponents gamma_i (every snapshot of
every tracked width) are profiles p_i. The target profile p = p_(T, gamma) is approximated by sum_i x_i p_i in the
L2 norm over tau: the normal equations A x = b, with A_ij = <p_i, p_j> and b_i = <p_i, p> and the inner product

    <p_(t_a, g_a), p_(t_b, g_b)> = (g_a + 1)(g_b + 1) / ((g_a + g_b + 1) t_b) (t_a / t_b)^(g_b)   for t_a <= t_b

(the integral of the two densities over (0, t_a], where both are nonzero; symmetric). The rebuilt average is sum_i x_i
e_i with x scaled to sum to 1 (an average of weights keeps their scale). As the weights are piecewise constant the
error of the rebuilt average is the integral of (sum_i x_i p_i - p) theta: small where the snapshots are dense
enough to express the target. At a tracked width and the time of a snapshot of it, p is one of the p_i and x picks it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import torch
from torch import nn

from swalab.config import ConfigError

GAMMA_PEAK = (math.sqrt(5) - 3) / 2  # where sigma_rel is largest; gamma_of returns values above it
SIGMA_REL_MAX = 0.3003  # sigma_rel at GAMMA_PEAK (0.30028...), rounded down: widths up to it have an inverse


def sigma_rel_of(gamma: float) -> float:
    """The relative width of the power-function profile of exponent ``gamma`` (module doc)."""
    return math.sqrt((gamma + 1) / ((gamma + 2) ** 2 * (gamma + 3)))


def gamma_of(sigma_rel: float) -> float:
    """The exponent whose profile has relative width ``sigma_rel`` (on the branch above ``GAMMA_PEAK``, where the
    width falls as gamma grows), found by bisection to float precision. 0.05: 16.97; 0.10: 6.94."""
    if not 0 < sigma_rel <= SIGMA_REL_MAX:
        raise ValueError(f"sigma_rel {sigma_rel!r} must lie in (0, {SIGMA_REL_MAX}]")
    low, high = GAMMA_PEAK, 1.0
    while sigma_rel_of(high) > sigma_rel:
        high *= 2
    for _ in range(200):
        mid = (low + high) / 2
        low, high = (mid, high) if sigma_rel_of(mid) > sigma_rel else (low, mid)
    return (low + high) / 2


def beta(t: int, gamma: float) -> float:
    """The decay of step ``t`` (from 1): (1 - 1/t)^(gamma + 1); 0 at t = 1, so the first average is the weights."""
    return (1 - 1 / t) ** (gamma + 1)


def label_of(sigma_rel: float) -> str:
    """A width as it names an average: two decimals at least (``0.10``), more where it has them (``0.075``)."""
    return f"{sigma_rel:.2f}" if round(sigma_rel, 2) == sigma_rel else f"{sigma_rel:g}"


def check_widths(widths: Sequence[float] | None, key: str = "run.powerema") -> tuple[float, ...]:
    """``widths`` as distinct floats in (0, SIGMA_REL_MAX], or ``ConfigError`` naming ``key`` as it is typed: a
    config key as a yaml list (``run.powerema=[0.05,0.10]``), a command-line option (``--powerema``) as widths
    apart (``--powerema 0.05 0.1``)."""
    typed = ((lambda ws: f"{key} {' '.join(f'{w:g}' for w in ws)}") if key.startswith("--")
             else (lambda ws: f"{key}={list(ws)}"))
    example = typed([0.05, 0.10]) if key.startswith("--") else f"{key}=[0.05,0.10]"
    fix = f"give relative widths sigma_rel in (0, {SIGMA_REL_MAX}], e.g. {example} (the paper's)"
    try:
        values = tuple(float(w) for w in (widths or ()))
    except (TypeError, ValueError):
        raise ConfigError(f"{key}={widths!r} is not a list of numbers: {fix}") from None
    bad = [w for w in values if not 0 < w <= SIGMA_REL_MAX]
    if bad or len(set(values)) != len(values):
        why = f"width {bad[0]!r} is out of range" if bad else "a width is repeated"
        raise ConfigError(f"{typed(values)}: {why}; {fix}")
    return values


# -- the least-squares rebuild --------------------------------------------------------------------------------------
def profile_dot(t_a: float, gamma_a: float, t_b: float, gamma_b: float) -> float:
    """The L2 inner product of the profiles p_(t_a, gamma_a) and p_(t_b, gamma_b) over tau (module doc)."""
    if t_a > t_b:
        t_a, gamma_a, t_b, gamma_b = t_b, gamma_b, t_a, gamma_a
    return (gamma_a + 1) * (gamma_b + 1) / ((gamma_a + gamma_b + 1) * t_b) * (t_a / t_b) ** gamma_b


def coefficients(sources: Sequence[tuple[float, float]], target: tuple[float, float]) -> torch.Tensor:
    """The weights x (float64, summing to 1) of the averages ``sources`` ((t, gamma) each) whose sum of profiles is
    nearest ``target``'s in L2: the normal equations, solved in float64 (module doc)."""
    n = len(sources)
    a = torch.tensor([[profile_dot(*sources[i], *sources[j]) for j in range(n)] for i in range(n)], dtype=torch.float64)
    b = torch.tensor([profile_dot(*s, *target) for s in sources], dtype=torch.float64)
    x = torch.linalg.solve(a, b)
    return x / x.sum()


def profile_error(sources: Sequence[tuple[float, float]], target: tuple[float, float], x: torch.Tensor) -> float:
    """|| sum_i x_i p_i - p || / || p ||: how far the rebuilt profile is from the target's (0: exact)."""
    n = len(sources)
    xs = [float(v) for v in x]
    sum_sq = sum(xs[i] * xs[j] * profile_dot(*sources[i], *sources[j]) for i in range(n) for j in range(n))
    cross = sum(xs[i] * profile_dot(*sources[i], *target) for i in range(n))
    target_sq = profile_dot(*target, *target)
    return math.sqrt(max(sum_sq - 2 * cross + target_sq, 0.0) / target_sq)


def _wide(t: torch.Tensor) -> torch.Tensor:
    """``t`` in float32, or in its own dtype where that is wider (float64)."""
    return t if t.dtype == torch.float64 else t.float()


# -- tracking during training ---------------------------------------------------------------------------------------
@dataclass
class PowerEMA:
    """The power-function EMAs of the widths ``sigma_rels``, updated after every optimizer step (:meth:`update`),
    over every floating entry of the model's state dict (parameters and BatchNorm buffers; those buffers are
    recomputed before any average is scored), in float32 (float64 weights in float64) on the model's device. ``t``: the steps averaged."""

    sigma_rels: tuple[float, ...]
    t: int = 0
    averages: dict[str, list[torch.Tensor]] = field(default_factory=dict)  # label -> tensors, in state-dict order

    def __post_init__(self):
        self.sigma_rels = check_widths(self.sigma_rels)
        self.gammas = {label_of(s): gamma_of(s) for s in self.sigma_rels}

    @staticmethod
    def _floating(model: nn.Module) -> tuple[list[str], list[torch.Tensor]]:
        items = [(k, v) for k, v in model.state_dict().items() if v.is_floating_point()]
        return [k for k, _ in items], [v.detach() for _, v in items]

    def update(self, model: nn.Module) -> None:
        """One step more: e_t = beta_t e_(t-1) + (1 - beta_t) theta_t for every width (the first copies theta_1)."""
        self.t += 1
        _, live = self._floating(model)
        for label, gamma in self.gammas.items():
            if label not in self.averages or self.t == 1:
                self.averages[label] = [_wide(v).clone() for v in live]
            else:
                torch._foreach_lerp_(self.averages[label], [_wide(v) for v in live], 1 - beta(self.t, gamma))

    def weights(self, model: nn.Module) -> dict[str, dict[str, torch.Tensor]]:
        """``{label: state dict}``: each average as a full state dict on the CPU in float32 (``model``'s other
        entries, BatchNorm's counters, as they are now)."""
        names, _ = self._floating(model)
        out = {}
        for label, tensors in self.averages.items():
            state = {k: v.detach().to("cpu").contiguous().clone() for k, v in model.state_dict().items()}
            state.update({k: t.detach().to("cpu").float().contiguous().clone() for k, t in zip(names, tensors)})
            out[label] = state
        return out

    def state_dict(self) -> dict:
        """What a checkpoint keeps to resume the averages exactly."""
        return {"t": self.t, "sigma_rels": list(self.sigma_rels),
                "averages": {label: [t.detach().to("cpu").clone() for t in ts] for label, ts in self.averages.items()}}

    def load_state_dict(self, state: dict, device: torch.device | str) -> None:
        """Continue the averages of a checkpoint (their widths must be this run's: ``ConfigError`` otherwise)."""
        if [float(s) for s in state["sigma_rels"]] != list(self.sigma_rels):
            raise ConfigError(f"run.powerema={list(self.sigma_rels)} but the checkpoint tracked {state['sigma_rels']}: "
                              "a power EMA's width cannot change mid-run; keep the widths it started with")
        self.t = int(state["t"])
        self.averages = {label: [t.to(device) for t in ts] for label, ts in state["averages"].items()}
