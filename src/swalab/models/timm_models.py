"""ImageNet networks from timm (``timm.create_model``), with their pretrained weights and clear errors.

Use it for the paper's ImageNet models (``resnet50.tv_in1k``, ``resnet152.tv_in1k``,
``densenet161.tv_in1k``: the torchvision weights the paper started from) and for any other timm
architecture, on ImageNet or with a new head on CIFAR.

Weights come from the Hugging Face hub (timm's default) or, with ``pretrained_file``, from a local
state-dict file (timm's ``pretrained_cfg_overlay=dict(file=...)``, so timm's own key filters, head
resizing and input-channel adaptation still apply). What goes wrong, and what the errors say:

* no network and no file: names ``model.pretrained_file`` and ``HF_HUB_OFFLINE`` / the hub cache, at once (weights
  not in the cache are fetched only once their host answers; huggingface_hub's own retries take about 50 s);
* a file made for another architecture: names the missing and unexpected keys (and shape mismatches);
* a name timm does not know: suggests the closest names timm does know."""

from __future__ import annotations

import difflib
import socket
from pathlib import Path
from urllib.parse import urlparse

import torch
from torch import nn


class PretrainedWeightsError(RuntimeError):
    """Pretrained weights could not be fetched or do not fit the architecture."""


# What to do when pretrained weights cannot be fetched.
WITHOUT_NETWORK = ("Without network: pass a local file with model.pretrained_file=PATH, or put the weights in the "
                   "Hugging Face cache (HF_HOME) on a machine with network and run with HF_HUB_OFFLINE=1; "
                   "or train from scratch with model.pretrained=false")
HOST_TIMEOUT_S = 5  # how long a weights host may take to accept a connection before it counts as unreachable
HUB_FILES = ("model.safetensors", "pytorch_model.bin")  # what timm fetches from a hub repository, in its order


def weights_cached(source) -> bool:
    """Whether the pretrained weights of timm's config ``source`` are on this machine already (the Hugging Face cache,
    torch.hub's checkpoints folder, or the config's own file), so that loading them needs no network."""
    if source.file:
        return Path(source.file).is_file()
    if source.hf_hub_id:
        from huggingface_hub import try_to_load_from_cache

        repo, _, revision = source.hf_hub_id.partition("@")
        names = [source.hf_hub_filename] if source.hf_hub_filename else HUB_FILES
        return any(isinstance(try_to_load_from_cache(repo, name, revision=revision or None), str) for name in names)
    return (Path(torch.hub.get_dir()) / "checkpoints" / Path(urlparse(source.url).path).name).is_file()


def unreachable_host(source) -> str | None:
    """Why the host of ``source``'s weights cannot be asked for them (``HF_HUB_OFFLINE``, or no connection within
    ``HOST_TIMEOUT_S``), or None when it answers. One connection attempt: a check before timm's download, whose
    retries with back-off would print for about 50 s before failing."""
    import huggingface_hub.constants as hub

    if source.hf_hub_id and hub.HF_HUB_OFFLINE:
        return "HF_HUB_OFFLINE is set and they are not in the Hugging Face cache"
    url = urlparse(hub.ENDPOINT if source.hf_hub_id else source.url)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((url.hostname, port), timeout=HOST_TIMEOUT_S).close()
    except OSError as exc:
        return f"cannot reach {url.hostname}:{port} ({type(exc).__name__}: {exc})"
    return None


def close_model_names(name: str, n: int = 5) -> list[str]:
    """timm model names (with pretrained tags when ``name`` has one) closest to ``name``."""
    import timm

    candidates = timm.list_models(pretrained=True) if "." in name else timm.list_models()
    return difflib.get_close_matches(name, candidates, n=n, cutoff=0.6)


def check_model_name(name: str) -> None:
    """Raise ``ValueError`` with close suggestions when timm knows no model (or pretrained tag) ``name``."""
    import timm

    arch, _, tag = name.partition(".")
    if not timm.is_model(arch):
        raise ValueError(f"timm knows no model {name!r}; closest names: {close_model_names(arch) or 'none'} "
                         "(timm.list_models('*pattern*') lists them)")
    if tag and name not in timm.list_pretrained(arch + ".*"):
        raise ValueError(f"timm has no pretrained tag {tag!r} for {arch!r}; closest: "
                         f"{close_model_names(name) or timm.list_pretrained(arch + '.*')[:10] or 'none'}")


def read_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """A plain state dict from a ``.pth``/``.bin``/``.safetensors`` file (``{"model"|"state_dict": ...}`` unwrapped)."""
    from timm.models import load_state_dict

    try:
        return load_state_dict(str(path), use_ema=False)
    except Exception as exc:
        first = str(exc).split(". ")[0].strip()  # torch's advice after it (weights_only=False) is not the user's
        raise PretrainedWeightsError(f"model.pretrained_file={path}: cannot read a state dict from it "
                                     f"({type(exc).__name__}: {first}): a damaged or cut-short copy, or not a "
                                     "weights file; copy the weights again") from exc


def describe_mismatch(model: nn.Module, state: dict[str, torch.Tensor], limit: int = 8) -> str:
    """Missing keys, unexpected keys and shape mismatches of ``state`` against ``model``, in one line."""
    own = model.state_dict()
    missing = [k for k in own if k not in state]
    unexpected = [k for k in state if k not in own]
    shapes = [f"{k}: file {tuple(state[k].shape)} vs model {tuple(own[k].shape)}"
              for k in own if k in state and hasattr(state[k], "shape") and state[k].shape != own[k].shape]

    def part(label: str, keys: list[str]) -> str:
        more = f" (+{len(keys) - limit} more)" if len(keys) > limit else ""
        return f"{len(keys)} {label} {keys[:limit]}{more}"

    return "; ".join([part("missing keys", missing), part("unexpected keys", unexpected),
                      part("shape mismatches", shapes)])


def create_timm_model(model_name: str, pretrained: bool = False, pretrained_file: str | None = None,
                      num_classes: int = 1000, in_channels: int = 3, **kwargs) -> nn.Module:
    """``timm.create_model(model_name, ...)`` with pretrained weights from the hub or ``pretrained_file``.

    Args:
        model_name: a timm name, optionally with a pretrained tag (``resnet50.tv_in1k``).
        pretrained: start from pretrained weights (a head of another size than the weights' is
            re-initialised by timm, e.g. 10 classes for CIFAR-10 from ImageNet weights).
        pretrained_file: local weights file; implies ``pretrained``.
        num_classes, in_channels: the head size and the input channels.
        kwargs: passed on to ``timm.create_model`` (e.g. ``drop_rate``)."""
    import timm

    check_model_name(model_name)
    if pretrained_file:
        path = Path(pretrained_file)
        if not path.is_file():
            raise FileNotFoundError(f"model.pretrained_file={pretrained_file}: "
                                    f"{'a folder, not a weights file' if path.is_dir() else 'no such file'}")
        overlay = dict(file=str(path))
        try:
            return timm.create_model(model_name, pretrained=True, pretrained_cfg_overlay=overlay,
                                     num_classes=num_classes, in_chans=in_channels, **kwargs)
        except Exception as exc:
            if not isinstance(exc, RuntimeError) or "state_dict" not in str(exc):
                read_state_dict(path)  # a file torch cannot read is refused naming model.pretrained_file
                raise
            model = timm.create_model(model_name, pretrained=False, in_chans=in_channels, **kwargs)
            raise PretrainedWeightsError(
                f"weights in {pretrained_file} do not fit {model_name}: "
                f"{describe_mismatch(model, read_state_dict(path))}") from None
    if not pretrained:
        return timm.create_model(model_name, pretrained=False, num_classes=num_classes, in_chans=in_channels,
                                 **kwargs)
    source = timm.models.get_pretrained_cfg(model_name)
    if source is None or not (source.hf_hub_id or source.url or source.file):
        raise PretrainedWeightsError(f"timm has no pretrained weights for {model_name}: set model.pretrained=false "
                                     "or give a weights file with model.pretrained_file=PATH")
    why = None if weights_cached(source) else unreachable_host(source)
    if why is not None:
        raise PretrainedWeightsError(f"cannot fetch the pretrained weights of {model_name}: {why}. {WITHOUT_NETWORK}")
    try:
        return timm.create_model(model_name, pretrained=True, num_classes=num_classes, in_chans=in_channels,
                                 **kwargs)
    except (OSError, ConnectionError) as exc:  # huggingface_hub's offline / not-cached errors are OSErrors
        raise PretrainedWeightsError(
            f"cannot fetch the pretrained weights of {model_name} ({type(exc).__name__}: {str(exc)[:200]}). "
            f"{WITHOUT_NETWORK}") from exc
