"""The report's summary of runs scored under shift (``swalab.results.shift_summary``): per cell, each seed's mean over
the corruptions of a severity (only those every seed was scored on), then mean ± std over seeds; the seeds' ensemble
on each corrupted set (MultiSWAG, deep ensembles) from the kept predictions; AUROC per OOD set over seeds."""

from __future__ import annotations

import json
import statistics

import torch
from test_shift_figures import CORRUPTIONS, OOD_SETS, corrupted_acc, shifted, table_of

from swalab.checkpoint import atomic_save
from swalab.results import ood
from swalab.results.report import report
from swalab.results.shift_summary import corruption_markdown, ensemble_severity, ood_markdown


def line_of(lines, start: str) -> list[str]:
    found = [line for line in lines if line.startswith(f"| {start} |")]
    assert found, (start, lines)
    return [cell.strip() for cell in found[0].strip("|").split("|")]


def unscore_fog_of_swa_seed1(root) -> None:
    """As if SWA's seed 1 had never been scored on fog (at any severity)."""
    for folder in root.glob("cifar10/preresnet20/swa/*/seed1/scores/cifar10c-fog-*"):
        for f in folder.iterdir():
            f.unlink()
        folder.rmdir()


def test_each_severity_is_the_seeds_mean_over_corruptions_then_mean_and_std_over_seeds(tmp_path):
    shifted(tmp_path / "g")
    lines = corruption_markdown(table_of(tmp_path / "g"))
    swa = line_of(lines, "cifar10 / preresnet20 · dataset.train_size=1000 · SWA 1.5B (6 ep)")
    per_seed = [statistics.fmean(corrupted_acc("swa", s, c, 3) for c in CORRUPTIONS) for s in (0, 1)]
    assert swa[1] == "2"
    assert swa[5] == f"{statistics.fmean(per_seed):.2f} ± {statistics.stdev(per_seed):.2f}"  # severity 3
    assert swa[2] == "95.50 ± 0.71"  # clean: seeds 95 and 96


def test_a_corruption_one_seed_was_not_scored_on_is_left_out_for_every_seed_of_the_cell(tmp_path):
    shifted(tmp_path / "g")
    unscore_fog_of_swa_seed1(tmp_path / "g")
    swa = line_of(corruption_markdown(table_of(tmp_path / "g")), "cifar10 / preresnet20 · dataset.train_size=1000 · SWA 1.5B (6 ep)")
    per_seed = [statistics.fmean(corrupted_acc("swa", s, c, 2) for c in ("contrast", "gaussian_noise")) for s in (0, 1)]
    assert swa[4] == f"{statistics.fmean(per_seed):.2f} ± {statistics.stdev(per_seed):.2f}"


def test_every_cell_of_the_table_is_averaged_over_the_same_corruptions_which_the_table_names(tmp_path):
    """A corruption one cell lacks is left out of every cell, so SGD and SWA are never set side by side over
    different corruptions; the table says which corruptions each severity covers and which were left out."""
    shifted(tmp_path / "g")
    unscore_fog_of_swa_seed1(tmp_path / "g")
    lines = corruption_markdown(table_of(tmp_path / "g"))
    sgd = line_of(lines, "cifar10 / preresnet20 · dataset.train_size=1000 · SGD 1B (4 ep)")
    per_seed = [statistics.fmean(corrupted_acc("sgd", s, c, 2) for c in ("contrast", "gaussian_noise")) for s in (0, 1)]
    assert sgd[4] == f"{statistics.fmean(per_seed):.2f} ± {statistics.stdev(per_seed):.2f}"  # fog left out here too
    assert "- severity 2: 2 (contrast, gaussian_noise)" in lines
    assert any(line.startswith("- left out, not scored by every cell: fog-1, fog-2") for line in lines)


def test_columns_scored_on_more_corruptions_than_every_cell_get_a_second_summary_over_those_alone(tmp_path):
    """SWA's seed 1 lacks fog: the first summary leaves fog out for every cell; SGD and SGD+ts were scored on all three
    corruptions, so a second summary sets them side by side over all three, and names SWA's cells as left out."""
    shifted(tmp_path / "g")
    unscore_fog_of_swa_seed1(tmp_path / "g")
    lines = corruption_markdown(table_of(tmp_path / "g"))
    second = lines[lines.index("## Under corruption, over more corruptions: the columns scored on them"):]
    assert "- severity 2: 3 (contrast, fog, gaussian_noise)" in second
    sgd = line_of(second, "cifar10 / preresnet20 · dataset.train_size=1000 · SGD 1B (4 ep)")
    per_seed = [statistics.fmean(corrupted_acc("sgd", s, c, 2) for c in CORRUPTIONS) for s in (0, 1)]
    assert sgd[4] == f"{statistics.fmean(per_seed):.2f} ± {statistics.stdev(per_seed):.2f}"  # fog counted here
    assert not any(line.startswith("| cifar10 / preresnet20 · dataset.train_size=1000 · SWA") for line in second)
    assert "SWA 1.5B (6 ep)" in next(line for line in second if "other cells were not" in line)


def test_the_ensemble_of_seeds_is_scored_on_each_corrupted_set_from_their_kept_predictions(tmp_path):
    shifted(tmp_path / "g")
    labels = torch.tensor([0, 1, 0, 1])
    # seed 0 right on images 0 and 1, seed 1 on 2 and 3, each sure of itself; together right on all four
    confident = {0: torch.tensor([[0.9, 0.1], [0.1, 0.9], [0.4, 0.6], [0.6, 0.4]]),
                 1: torch.tensor([[0.4, 0.6], [0.6, 0.4], [0.9, 0.1], [0.1, 0.9]])}
    for seed in (0, 1):
        for folder in (tmp_path / "g").glob(f"cifar10/preresnet20/swa/*/seed{seed}/scores/cifar10c-*"):
            atomic_save({"log_probs": {"swa": confident[seed].log()}, "labels": labels}, folder / "predictions.pt")
    table = table_of(tmp_path / "g")
    swa = next(cell for column, cell in table.rows[0].cells.items() if column.method == "swa" and not column.scaled)
    assert {s: m["acc"] for s, m in ensemble_severity(swa).items()} == {s: 100.0 for s in range(1, 6)}
    sgd = next(cell for column, cell in table.rows[0].cells.items() if column.method == "sgd" and not column.scaled)
    assert ensemble_severity(sgd).startswith("seed 0: cifar10c-contrast-1 has no predictions.pt")
    lines = corruption_markdown(table)
    assert line_of(lines, "cifar10 / preresnet20 · dataset.train_size=1000 · SWA 1.5B (6 ep) x2")[1] == "accuracy %"
    assert any(line.startswith("- cifar10 / preresnet20 · dataset.train_size=1000 · SGD 1B (4 ep): seed 0") for line in lines)


def test_the_ood_summary_is_the_records_auroc_over_seeds(tmp_path):
    shifted(tmp_path / "g")
    table = table_of(tmp_path / "g")
    swa = next(cell for column, cell in table.rows[0].cells.items() if column.method == "swa" and not column.scaled)
    aurocs = [e.run.scores["ood-noise-gaussian"]["predictors"]["swa"]["msp"]["auroc"] for e in swa.entries]
    row = line_of([line for line in ood_markdown(table) if "| noise-gaussian |" in line],
                  "cifar10 / preresnet20 · dataset.train_size=1000 · SWA 1.5B (6 ep)")
    assert row[2] == "2" and row[3] == f"{statistics.fmean(aurocs):.4f} ± {statistics.stdev(aurocs):.4f}"


def test_the_report_puts_the_summaries_before_the_per_run_tables(tmp_path):
    shifted(tmp_path / "g")
    report([tmp_path / "g"], tmp_path / "out")
    text = (tmp_path / "out" / "table.md").read_text()
    assert text.index("## Under corruption: mean over corruptions per severity") < text.index("## Scored on other data")
    assert "## Out-of-distribution detection, per cell" in text


def test_runs_never_scored_under_shift_get_no_summary(tmp_path):
    shifted(tmp_path / "g")
    for folder in (tmp_path / "g").rglob("scores"):
        import shutil

        shutil.rmtree(folder)
    table = table_of(tmp_path / "g")
    assert corruption_markdown(table) == [] and ood_markdown(table) == []


def test_an_ood_set_whose_images_changed_between_seeds_is_not_averaged_and_the_summary_says_so(tmp_path):
    shifted(tmp_path / "g")
    for seed, fingerprint in ((0, "before"), (1, "after")):  # the folder changed between the two score commands
        for path in (tmp_path / "g").rglob(f"seed{seed}/scores/ood-noise-gaussian/metrics.json"):
            record = json.loads(path.read_text())
            record["data"]["fingerprint"] = fingerprint
            path.write_text(json.dumps(record))
    lines = ood_markdown(table_of(tmp_path / "g"))
    assert not [line for line in lines if "| noise-gaussian |" in line]
    assert any(line.startswith("- cifar10 / preresnet20 · dataset.train_size=1000 · SWA 1.5B (6 ep): noise-gaussian: "
                               "its seeds were scored on other images") for line in lines), lines
    folder = ood.spec_name(OOD_SETS[1]).removeprefix("ood-")  # folder-val-<8 hex of its path>
    assert [line for line in lines if f"| {folder} |" in line]  # the sets scored on the same images stay


def test_columns_scored_on_more_corruptions_get_their_seed_ensembles_over_those_in_their_own_summary(tmp_path):
    """SWA's seed 1 lacks fog, so the first summary (and its ensembles) leaves fog out; SGD's seeds were scored on all
    three corruptions and kept their predictions, so the second summary ensembles them over all three."""
    shifted(tmp_path / "g")
    unscore_fog_of_swa_seed1(tmp_path / "g")
    labels = torch.tensor([0, 1, 0, 1])
    right = {"cifar10c-fog": torch.tensor([[0.9, 0.1], [0.1, 0.9], [0.9, 0.1], [0.1, 0.9]])}  # all right on fog
    for seed in (0, 1):
        for folder in (tmp_path / "g").glob(f"cifar10/preresnet20/sgd/*/seed{seed}/scores/cifar10c-*"):
            wrong = torch.tensor([[0.1, 0.9], [0.9, 0.1], [0.1, 0.9], [0.9, 0.1]])  # all wrong elsewhere
            probs = right.get(folder.name.rpartition("-")[0], wrong)
            atomic_save({"log_probs": {"sgd": probs.log()}, "labels": labels}, folder / "predictions.pt")
    lines = corruption_markdown(table_of(tmp_path / "g"))
    second_at = lines.index("## Under corruption, over more corruptions: the columns scored on them")
    first, second = lines[:second_at], lines[second_at:]
    ensemble = "cifar10 / preresnet20 · dataset.train_size=1000 · SGD 1B (4 ep) x2"
    assert line_of(first, ensemble)[1:4] == ["accuracy %", "0.00", "0.00"]  # contrast and gaussian noise: all wrong
    assert line_of(second, ensemble)[1:4] == ["accuracy %", f"{100 / 3:.2f}", f"{100 / 3:.2f}"]  # fog counted too


def test_columns_scored_on_other_versions_of_one_ood_folder_are_told_apart_in_the_summary(tmp_path):
    """The folder changed between the score commands of the SGD runs and of the SWA runs: each column's seeds agree
    (so each is averaged), and each line names the images it was scored on, so no two lines of one set name compare
    other images unsaid."""
    shifted(tmp_path / "g")
    for path in (tmp_path / "g").rglob("scores/ood-noise-gaussian/metrics.json"):
        record = json.loads(path.read_text())
        record["data"]["fingerprint"] = "2222bbbb-after" if "/swa/" in str(path) else "1111aaaa-before"
        path.write_text(json.dumps(record))
    lines = ood_markdown(table_of(tmp_path / "g"))
    noise = [line.split(" | ")[1] for line in lines if "| noise-gaussian" in line]
    assert sorted(set(noise)) == ["noise-gaussian, images 1111aaaa", "noise-gaussian, images 2222bbbb"], noise
    folder = ood.spec_name(OOD_SETS[1]).removeprefix("ood-")
    assert [line for line in lines if f"| {folder} |" in line]  # a set scored on the same images keeps its name
