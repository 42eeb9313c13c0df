"""ImageNet folder data, timm models with pretrained weights, and the evaluate-only / fine-tune run paths.

Everything runs on tiny folders written here and timm's tiny ``test_resnet`` (0.47M params), offline.
One test checks real pretrained weights on real ImageNet validation images when the shared copies exist.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from hydra.utils import instantiate
from PIL import Image

from conftest import REPO
from swalab.data.imagenet import (SeededSampler, StreamLoader, bn_subset_indices, imagenet_transforms,
                                  imagenet_wnid_index, list_imagenet_split, load_imagenet)
from swalab.evaluate import labels_of
from swalab.models.timm_models import PretrainedWeightsError, create_timm_model
from swalab.train import train

TENCH, SPRINGER, PARACHUTE = "n01440764", "n02102040", "n03888257"  # ImageNet-1k indices 0, 217, 701
SHARED = Path(os.environ.get("SWALAB_SHARED_DATA", REPO.parent / "shared" / "data"))
IMAGENETTE = SHARED / "imagenette"
LITE0_WEIGHTS = SHARED / "weights" / "tf_efficientnet_lite0.in1k.pth"


def write_images(folder: Path, count: int, seed: int, size=(48, 40)) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for i in range(count):
        pixels = rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
        Image.fromarray(pixels).save(folder / f"img{i:03d}.jpg")


@pytest.fixture
def tiny_imagenet(tmp_path) -> Path:
    """train/ with 6 images of each of three real wnids, val/ with 3 of two of them."""
    root = tmp_path / "imagenet"
    for k, wnid in enumerate((TENCH, SPRINGER, PARACHUTE)):
        write_images(root / "train" / wnid, 6, seed=k)
    for k, wnid in enumerate((TENCH, PARACHUTE)):
        write_images(root / "val" / wnid, 3, seed=10 + k)
    return root


# -- the folder --------------------------------------------------------------------------------------------
def test_labels_are_the_imagenet_1k_indices_of_the_wnid_folders(tiny_imagenet):
    data = load_imagenet(tiny_imagenet)
    assert data.num_classes == 1000 and len(data.classes) == 1000
    assert sorted(set(data.train.labels.tolist())) == [0, 217, 701]
    assert data.test.labels.tolist() == [0, 0, 0, 701, 701, 701]
    assert imagenet_wnid_index()[SPRINGER] == 217 and data.classes[217] == SPRINGER


def test_a_folder_that_is_not_an_imagenet_wnid_is_named(tiny_imagenet):
    write_images(tiny_imagenet / "val" / "cats", 1, seed=0)
    with pytest.raises(ValueError, match=r"not ImageNet-1k wnids: \['cats'\]"):
        load_imagenet(tiny_imagenet)


def test_an_empty_split_or_class_folder_or_missing_split_is_an_error(tmp_path):
    (tmp_path / "val").mkdir()
    with pytest.raises(ValueError, match="holds no images"):
        list_imagenet_split(tmp_path / "val")
    (tmp_path / "val" / TENCH).mkdir()
    with pytest.raises(ValueError, match=f"{TENCH} holds no image files"):
        list_imagenet_split(tmp_path / "val")
    with pytest.raises(FileNotFoundError, match="train/<wnid>"):
        load_imagenet(tmp_path)


def test_train_size_keeps_a_fixed_seeded_subset(tiny_imagenet):
    a, b = load_imagenet(tiny_imagenet, train_size=5, seed=3), load_imagenet(tiny_imagenet, train_size=5, seed=3)
    assert a.train.samples == b.train.samples and len(a.train) == 5
    assert a.train.samples != load_imagenet(tiny_imagenet, train_size=5, seed=4).train.samples
    with pytest.raises(ValueError, match="dataset.train_size=99"):
        load_imagenet(tiny_imagenet, train_size=99)


def test_test_size_keeps_a_fixed_stratified_subset_for_every_seed(tiny_imagenet):
    a, b = load_imagenet(tiny_imagenet, test_size=4, seed=0), load_imagenet(tiny_imagenet, test_size=4, seed=5)
    assert a.test.samples == b.test.samples and len(a.test) == 4
    assert sorted(a.test.labels.tolist()) == [0, 0, 701, 701]  # two of each class
    full = load_imagenet(tiny_imagenet).test.samples
    assert a.test.samples == [s for s in full if s in a.test.samples]  # kept in folder order
    with pytest.raises(ValueError, match="dataset.test_size=7 is out of range"):
        load_imagenet(tiny_imagenet, test_size=7)
    with pytest.raises(ValueError, match="dataset.test_size must be an integer or null, got 2.5"):
        load_imagenet(tiny_imagenet, test_size=2.5)


# -- transforms and loaders --------------------------------------------------------------------------------
def test_transforms_follow_the_model_pretrained_config():
    _, _, lite0 = imagenet_transforms("tf_efficientnet_lite0")
    assert lite0["mean"] == (0.5, 0.5, 0.5) and lite0["interpolation"] == "bicubic" and lite0["crop_pct"] == 0.875
    _, _, tv = imagenet_transforms("resnet50.tv_in1k")
    assert tv["interpolation"] == "bilinear" and tv["mean"] == (0.485, 0.456, 0.406)
    train_tf, test_tf, small = imagenet_transforms("resnet50.tv_in1k", image_size=64, crop_pct=1.0)
    image = Image.new("RGB", (100, 80))
    assert small["input_size"] == (3, 64, 64)
    assert train_tf(image).shape == test_tf(image).shape == (3, 64, 64)


def batches(loader) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(x.clone(), y.clone()) for x, y in loader]


def test_an_epoch_depends_only_on_seed_and_epoch_not_on_workers(tiny_imagenet):
    data = load_imagenet(tiny_imagenet)
    train_tf, _, _ = imagenet_transforms("test_resnet", image_size=32)
    split = data.train.with_transform(train_tf)
    serial = StreamLoader(split, 4, train=True, seed=7, num_workers=0)
    parallel = StreamLoader(split, 4, train=True, seed=7, num_workers=1, persistent_workers=True)
    torch.manual_seed(0)
    before = torch.rand(1)
    torch.manual_seed(0)
    serial.set_epoch(1)
    epoch1 = batches(serial)
    assert torch.rand(1).equal(before)  # the per-item seeding leaves the caller's RNG alone
    for epoch in (0, 1):  # a persistent worker pool still replays epoch 1 exactly after epoch 0
        parallel.set_epoch(epoch)
        got = batches(parallel)
    assert len(got) == len(serial) == 4  # 18 images, batch 4, last incomplete batch dropped
    for (x1, y1), (x2, y2) in zip(epoch1, got):
        assert torch.equal(x1, x2) and torch.equal(y1, y2)
    serial.set_epoch(2)
    assert not torch.equal(batches(serial)[0][0], epoch1[0][0])


def test_evaluation_loader_knows_its_labels_and_keeps_every_image(tiny_imagenet):
    data = load_imagenet(tiny_imagenet)
    _, test_tf, _ = imagenet_transforms("test_resnet", image_size=32)
    loader = StreamLoader(data.test.with_transform(test_tf), 4, train=False)
    assert len(loader) == 2 and loader.num_samples == 6
    assert labels_of(loader).tolist() == torch.cat([y for _, y in loader]).tolist() == [0, 0, 0, 701, 701, 701]


def test_seeded_sampler_and_bn_subset_are_fixed_by_their_seed():
    sampler = SeededSampler(10, seed=1, shuffle=True)
    sampler.set_epoch(3)
    first = list(sampler)
    sampler.set_epoch(3)
    assert list(sampler) == first and sorted(i for i, _ in first) == list(range(10))
    assert list(SeededSampler(4, seed=1, shuffle=False))[2][0] == 2
    keep = bn_subset_indices(1000, 0.1, minimum=16, seed=5)
    assert len(keep) == 100 and keep == bn_subset_indices(1000, 0.1, minimum=16, seed=5) and keep == sorted(keep)
    assert len(bn_subset_indices(100, 0.01, minimum=16, seed=5)) == 16
    assert bn_subset_indices(100, 1.0, minimum=16, seed=5) is None


def test_a_ranks_sampler_yields_its_slice_of_every_global_batch_with_the_items_seeds():
    whole = SeededSampler(23, seed=4, shuffle=True)  # 23 items, global batch 6 over 3 ranks: 3 global batches
    ranks = [SeededSampler(23, seed=4, shuffle=True, batch_size=2, rank=r, world_size=3) for r in range(3)]
    for sampler in (whole, *ranks):
        sampler.set_epoch(2)
    items, parts = list(whole), [list(s) for s in ranks]
    assert [len(s) for s in ranks] == [len(p) for p in parts] == [6, 6, 6]
    for i in range(3):  # global batch i is rank 0's pair, rank 1's pair, rank 2's pair: (index, seed) alike
        assert items[6 * i:6 * i + 6] == [pair for p in parts for pair in p[2 * i:2 * i + 2]]


def test_a_sharded_stream_loader_refuses_what_would_leave_a_rank_without_a_batch(tiny_imagenet):
    split = load_imagenet(tiny_imagenet).train  # 18 images
    with pytest.raises(ValueError, match="at least one global batch"):
        StreamLoader(split, 10, train=True, rank=0, world_size=2)
    with pytest.raises(ValueError, match="training batches only"):
        StreamLoader(split, 2, train=False, rank=0, world_size=2)
    with pytest.raises(ValueError, match=r"rank must be in \[0, world_size=2\)"):
        StreamLoader(split, 2, train=True, rank=2, world_size=2)
    assert len(StreamLoader(split, 4, train=True, rank=1, world_size=2)) == 2  # 18 // 8 global batches


# -- timm models -------------------------------------------------------------------------------------------
def test_unknown_model_name_suggests_close_names():
    with pytest.raises(ValueError, match=r"timm knows no model 'resnet5O'.*'resnet50'"):
        create_timm_model("resnet5O")
    with pytest.raises(ValueError, match=r"no pretrained tag 'tv_in1kk'.*resnet50.tv_in1k"):
        create_timm_model("resnet50.tv_in1kk")


def test_weights_file_loads_and_a_new_head_is_fresh(tmp_path):
    source = create_timm_model("test_resnet", num_classes=1000)
    path = tmp_path / "weights.pth"
    torch.save(source.state_dict(), path)
    same = create_timm_model("test_resnet", pretrained_file=str(path))
    assert all(torch.equal(v, same.state_dict()[k]) for k, v in source.state_dict().items())
    cifar = create_timm_model("test_resnet", pretrained_file=str(path), num_classes=10)
    assert cifar.fc.out_features == 10 and torch.equal(cifar.conv1[0].weight, source.conv1[0].weight)


def test_weights_file_of_another_architecture_names_missing_and_unexpected_keys(tmp_path):
    path = tmp_path / "effnet.pth"
    torch.save(create_timm_model("test_efficientnet").state_dict(), path)
    with pytest.raises(PretrainedWeightsError, match=r"do not fit test_resnet: \d+ missing keys \['conv1.*"
                                                     r"\d+ unexpected keys \['conv_stem.weight'"):
        create_timm_model("test_resnet", pretrained_file=str(path))
    with pytest.raises(FileNotFoundError, match="model.pretrained_file=.*no such file"):
        create_timm_model("test_resnet", pretrained_file=str(tmp_path / "absent.pth"))


def test_a_cut_short_or_foreign_weights_file_is_refused_naming_model_pretrained_file(tmp_path):
    """A copy cut short (a transfer that stopped), a file that is not weights and a folder: each refused naming
    model.pretrained_file and the file, with what to do, never torch's own advice to load with weights_only=False."""
    whole = tmp_path / "whole.pth"
    torch.save(create_timm_model("test_resnet").state_dict(), whole)
    cut = tmp_path / "cut.pth"
    cut.write_bytes(whole.read_bytes()[: whole.stat().st_size // 2])
    text = tmp_path / "text.pth"
    text.write_text("not weights\n")
    for path in (cut, text):
        with pytest.raises(PretrainedWeightsError) as refused:
            create_timm_model("test_resnet", pretrained_file=str(path))
        said = str(refused.value)
        assert said.startswith(f"model.pretrained_file={path}: cannot read a state dict from it (")
        assert said.endswith("copy the weights again") and "weights_only=False" not in said
    with pytest.raises(FileNotFoundError, match="model.pretrained_file=.*: a folder, not a weights file"):
        create_timm_model("test_resnet", pretrained_file=str(tmp_path))


def test_no_network_and_no_file_names_the_fixes(monkeypatch, tmp_path):
    import huggingface_hub.constants as hub

    monkeypatch.setattr(hub, "HF_HUB_OFFLINE", True)  # what HF_HUB_OFFLINE=1 sets; no request leaves the test
    monkeypatch.setattr(hub, "HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    with pytest.raises(PretrainedWeightsError, match="model.pretrained_file=PATH.*HF_HUB_OFFLINE=1"):
        create_timm_model("test_resnet", pretrained=True)


def test_an_unreachable_hub_without_cached_weights_fails_at_once_with_the_fixes(monkeypatch, tmp_path):
    """Without the check first, huggingface_hub retries each file five times with back-off: about 50 s of lines."""
    import time

    import huggingface_hub.constants as hub

    monkeypatch.setattr(hub, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(hub, "ENDPOINT", "http://127.0.0.1:9")  # a closed port: refused at once, as offline is
    monkeypatch.setattr(hub, "HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    began = time.perf_counter()
    with pytest.raises(PretrainedWeightsError, match="cannot reach.*model.pretrained_file=PATH.*HF_HUB_OFFLINE=1"):
        create_timm_model("test_resnet", pretrained=True)
    assert time.perf_counter() - began < 10


def test_timm_model_config_is_pretrained_on_imagenet_and_fresh_on_cifar(make_cfg):
    cifar = make_cfg("dataset=cifar10", "model=timm", "model.name=test_resnet")
    assert cifar.model.pretrained is False and cifar.dataset.loader == "resident"
    net = instantiate(cifar.model.arch)
    assert net.fc.out_features == 10
    imagenet = make_cfg("dataset=imagenet", "model=resnet50")
    assert imagenet.model.pretrained is True and imagenet.model.arch.model_name == "resnet50.tv_in1k"
    table2 = make_cfg("experiment=table2_densenet161")
    assert table2.trainer.epochs == 10 and table2.model.swa.phase == "cyclic" and table2.model.swa.lr == 1e-3
    assert table2.model.swa.lr_min == 1e-5 and table2.model.swa.cycle_epochs == 1
    assert table2.model.swa.score_at_budgets == [0.5]


# -- the run paths -----------------------------------------------------------------------------------------
def tiny_run(make_cfg, root: Path, *overrides: str):
    return make_cfg("dataset=imagenet", f"dataset.root={root}", "dataset.image_size=32", "run.num_workers=0",
                    "model=timm", "model.name=test_resnet", "trainer.batch_size=4", "run.eval_batch_size=4",
                    "run.device=cpu", *overrides)


def test_zero_epochs_scores_the_pretrained_weights_top1_and_top5(make_cfg, tiny_imagenet, tmp_path):
    path = tmp_path / "weights.pth"
    torch.save(create_timm_model("test_resnet").state_dict(), path)
    metrics = train(tiny_run(make_cfg, tiny_imagenet, f"model.pretrained_file={path}", "method=pretrained"),
                    run_dir=tmp_path / "run")
    assert list(metrics) == ["pretrained"] and {"acc", "top5", "nll", "ece"} <= set(metrics["pretrained"])
    assert json.loads((tmp_path / "run" / "status.json").read_text())["status"] == "complete"
    with pytest.raises(ValueError, match="random initialisation"):
        train(tiny_run(make_cfg, tiny_imagenet, "model.pretrained=false", "method=pretrained"),
              run_dir=tmp_path / "random")
    with pytest.raises(ValueError, match="trainer.epochs=0 trains nothing with method=swa: use method=pretrained"):
        train(tiny_run(make_cfg, tiny_imagenet, f"model.pretrained_file={path}", "trainer.epochs=0"),
              run_dir=tmp_path / "swa0")


def test_cyclic_swa_fine_tunes_from_the_start_with_a_bn_update_on_a_fraction(make_cfg, tiny_imagenet, tmp_path):
    path = tmp_path / "weights.pth"
    torch.save(create_timm_model("test_resnet").state_dict(), path)
    cfg = tiny_run(make_cfg, tiny_imagenet, f"model.pretrained_file={path}", "trainer.epochs=2",
                   "trainer.bn_update_fraction=0.5", "run.eval_every=0", "method=swa")
    metrics = train(cfg, run_dir=tmp_path / "swa")
    assert metrics["swa"]["n_averaged"] == 2 and "top5" in metrics["swa"] and "sgd" in metrics
    history = [json.loads(line) for line in (tmp_path / "swa" / "history.jsonl").read_text().splitlines()]
    assert [row["epoch"] for row in history] == [1, 2] and history[-1]["lr"] == pytest.approx(1e-5)


# -- real weights on real images ---------------------------------------------------------------------------
@pytest.mark.slow
def test_tf_efficientnet_lite0_weights_reach_their_published_accuracy_on_imagenette():
    """README of the shared data: 76.4% 1000-way top-1 on every 8th image of imagenette/val (491 images)."""
    if not (LITE0_WEIGHTS.is_file() and (IMAGENETTE / "val").is_dir()):
        pytest.skip(f"shared weights {LITE0_WEIGHTS} or images {IMAGENETTE / 'val'} not found")
    model = create_timm_model("tf_efficientnet_lite0", pretrained_file=str(LITE0_WEIGHTS)).eval()
    _, test_tf, _ = imagenet_transforms("tf_efficientnet_lite0")
    split = load_imagenet(IMAGENETTE).test
    split = split.subset(range(0, len(split), 8)).with_transform(test_tf)
    assert len(split) == 491
    loader = StreamLoader(split, 64, train=False, num_workers=2)
    with torch.inference_mode():
        predicted = torch.cat([model(x).argmax(1) for x, _ in loader])
    top1 = 100.0 * predicted.eq(split.labels).float().mean().item()
    assert top1 == pytest.approx(76.4, abs=1.5)


def test_an_analysis_subset_of_an_imagenet_run_takes_files_from_its_folder(make_cfg, tiny_imagenet, tmp_path):
    """--train-size / --test-size of the analyses cut an ImageNet-style run's splits, read from disk on demand, as
    they cut a resident one (they failed: the split has no image tensor to index)."""
    from swalab.data.imagenet import ImageFolderSplit
    from swalab.results.runs import Run

    weights = tmp_path / "weights.pth"
    torch.save(create_timm_model("test_resnet").state_dict(), weights)
    run_dir = tmp_path / "run"
    train(tiny_run(make_cfg, tiny_imagenet, f"model.pretrained_file={weights}", "method=pretrained"), run_dir=run_dir)
    data = Run(run_dir).data(train_size=6, test_size=4)
    assert isinstance(data.train, ImageFolderSplit) and len(data.train) == 6 and len(data.test) == 4
    assert sorted(data.train.labels.tolist()) == sorted(Run(run_dir).data().train.labels.tolist()[::3])  # 2 a class
