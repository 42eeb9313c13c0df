"""The data sources' record of their files, declared by each loader (``swalab.data.fingerprint.records_files``)."""

from __future__ import annotations

import textwrap

from omegaconf import OmegaConf

from conftest import REPO


def test_each_shipped_loader_declares_the_record_of_its_files():
    from hydra.utils import get_method

    for name in ("cifar10", "cifar100", "digits", "folder", "imagenet"):
        target = OmegaConf.load(REPO / "conf" / "dataset" / f"{name}.yaml").source._target_
        assert callable(getattr(get_method(target), "files_record", None)), target


def test_a_loader_module_that_imports_a_files_record_of_its_own_use_is_not_mistaken_for_declaring_one(
        tmp_path, make_cfg, monkeypatch):
    """The record was once found by name in the loader's module: a user's loader that imported swalab's
    ``fingerprint.files_record`` (to record files of its own) had it called with the loader's arguments."""
    (tmp_path / "my_loader.py").write_text(textwrap.dedent("""
        from swalab.data import load_digits
        from swalab.data.fingerprint import files_record  # a helper this module uses, not a declaration

        def load(**arguments):
            return load_digits(**arguments)
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    from swalab.train.build import data_files_record
    from swalab.train.execute import given_record

    cfg = make_cfg("dataset.source._target_=my_loader.load")
    assert data_files_record(cfg) is None
    assert given_record(cfg, {"fingerprint": "f"}) == {}
