"""The averages themselves, from state dicts: no model, no data (``swalab.posthoc`` scores them).

Every function takes weights in training order and returns one state dict: floating tensors combined (summed in
float64, returned in the inputs' dtype), other tensors (BatchNorm's ``num_batches_tracked``) taken from the last
input. The BatchNorm statistics of any result belong to no network that ran: ``swalab.posthoc`` recomputes them."""

from __future__ import annotations

from typing import Callable, Iterable, Sequence

import torch

State = dict[str, torch.Tensor]


def mean_of(states: Iterable[State]) -> State:
    """The equal-weight mean of ``states`` (SWA over a window, LAWA, a uniform soup), read one at a time."""
    total: dict[str, torch.Tensor] = {}
    last: State = {}
    n = 0
    for state in states:
        n += 1
        last = state
        for key, t in state.items():
            if t.is_floating_point():
                total[key] = total[key] + t.double() if key in total else t.double().clone()
    if n == 0:
        raise ValueError("no weights to average")
    return {key: (total[key] / n).to(t.dtype) if key in total else t.clone() for key, t in last.items()}


def ema_of(states: Iterable[State], decay: float) -> State:
    """The exponential moving average over ``states`` at ``decay`` per state: e_1 = s_1, e_i = decay e_(i-1) +
    (1 - decay) s_i. It moves once per snapshot, not per optimizer step: a decay d here is d^(1/steps) per step
    between snapshots of ``steps`` steps (snapshot-granular)."""
    ema: dict[str, torch.Tensor] = {}
    last: State = {}
    for state in states:
        last = state
        for key, t in state.items():
            if t.is_floating_point():
                ema[key] = t.double().clone() if key not in ema else ema[key].mul_(decay).add_(t.double(), alpha=1 - decay)
    if not last:
        raise ValueError("no weights to average")
    return {key: ema[key].to(t.dtype) if key in ema else t.clone() for key, t in last.items()}


def combination(pairs: Iterable[tuple[float, State]]) -> State:
    """``sum_i x_i * state_i`` over ``(x_i, state_i)`` (the power EMA rebuilt from snapshots: the x_i sum to 1 and
    may be negative), read one state at a time."""
    total: dict[str, torch.Tensor] = {}
    last: State = {}
    for x, state in pairs:
        last = state
        for key, t in state.items():
            if t.is_floating_point():
                total[key] = total[key].add_(t.double(), alpha=x) if key in total else t.double() * x
    if not last:
        raise ValueError("no weights to combine")
    return {key: total[key].to(t.dtype) if key in total else t.clone() for key, t in last.items()}


def interpolate(start: State, final: State, alpha: float) -> State:
    """WiSE-FT: ``(1 - alpha) * start + alpha * final`` for every floating tensor (``final``'s others)."""
    return {key: ((1 - alpha) * start[key].double() + alpha * t.double()).to(t.dtype) if t.is_floating_point()
            else t.clone() for key, t in final.items()}


def greedy_soup(ingredients: Sequence[State], score: Callable[[State], float]) -> tuple[State, list[int]]:
    """The greedy soup of Wortsman et al. (2022): ``ingredients`` in order (best alone first), each kept when the
    soup with it scores no worse (``score``: higher is better, on the validation split). Returns the soup and the
    indices of the ingredients it holds."""
    kept = [0]
    soup = ingredients[0]
    best = score(soup)
    for i in range(1, len(ingredients)):
        trial = mean_of(ingredients[j] for j in [*kept, i])
        value = score(trial)
        if value >= best:
            kept, soup, best = [*kept, i], trial, value
    return soup, kept
