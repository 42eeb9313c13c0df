"""``swalab.results.table``: the rules that put runs into cells, rows and pairs, each on the smallest set of hand-made
run directories that shows it (the run directories are those of ``tests/test_report.py``). Most of these came from
mutation testing of the module (docs/mutation.md): each fails on an edit of the rule it names."""

from __future__ import annotations

import csv
import json
import os

import pytest
import yaml
from test_report import m, make_run, table_lines, with_apart

from swalab.results.report import report
from swalab.results.runs import Run, run_dirs
from swalab.results.table import _label, build_table, fmt_cell, paired_differences

PAIRED = "Paired differences against SGD (accuracy points, per seed)"


def table_of(*roots):
    return build_table([Run(p) for p in run_dirs(roots)])


def row_names(out):
    return [line.split(" | ")[0].removeprefix("| ") for line in table_lines(out)[2:]]


def test_a_cell_shows_mean_and_sample_std_to_two_decimals_with_its_count_and_an_empty_one_a_dash():
    assert fmt_cell([90.0, 92.0]) == "91.00 ± 1.41 (n=2)"
    assert fmt_cell([90.0]) == "90.00 (n=1)"
    assert fmt_cell([0.1234, 0.2], 4) == "0.1617 ± 0.0542 (n=2)"  # std = 0.0766 / sqrt(2)
    assert fmt_cell([]) == "–"


def test_a_row_label_names_a_target_by_its_class_and_a_key_a_run_lacks_by_a_dash():
    values = {"schedule._target_": "swalab.schedules.Cosine", "trainer.batch_size": 64}
    assert _label(["schedule._target_", "trainer.batch_size"], values) == "schedule=Cosine, trainer.batch_size=64"
    assert _label(["schedule._target_", "dataset.train_size"], {}) == "schedule=–, dataset.train_size=–"


def test_runs_without_records_are_labelled_by_the_identity_keys_that_vary_between_their_rows(tmp_path):
    """Runs of earlier versions keep no record of what was typed (no identity.json): their rows are told apart by
    the identity keys whose values differ, a schedule by its class."""
    root = tmp_path / "g"
    for name, target, acc in (("cos", "swalab.schedules.Cosine", 90.0), ("step", "swalab.schedules.Step", 91.0)):
        make_run(root, "sgd", 0, {"sgd": m(acc)}, name=name,
                 extra={"schedule": {"_target_": target}, "trainer": {"batch_size": 64 if name == "cos" else 128}})
    assert sorted(row.label for row in table_of(root).rows) == ["schedule=Cosine, trainer.batch_size=64",
                                                                "schedule=Step, trainer.batch_size=128"]


@pytest.mark.parametrize("first", ["lr05", "lr01"])
def test_of_two_unrecorded_variants_with_as_many_seeds_the_one_written_first_leads_the_row(tmp_path, first):
    root = tmp_path / "g"
    runs = {name: make_run(root, "swa", 0, {"swa": m(acc)}, budget=1.5, name=name,
                           extra={"method": {"_target_": "swalab.methods.SWA"}, "model": {"swa": {"lr": lr}}})
            for name, lr, acc in (("lr05", 0.05, 93.0), ("lr01", 0.01, 91.0))}
    make_run(root, "sgd", 0, {"sgd": m(90.0)})
    second = next(name for name in runs if name != first)
    os.utime(runs[first] / "config.yaml", (1_000_000, 1_000_000))
    os.utime(runs[second] / "config.yaml", (2_000_000, 2_000_000))
    lead, other = table_of(root).rows
    assert lead.label == ""
    swa_cells = [cell for column, cell in lead.cells.items() if column.method == "swa"]
    assert [e.run.path for cell in swa_cells for e in cell.entries] == [runs[first]]
    assert [e.run.path for cell in other.cells.values() for e in cell.entries] == [runs[second]]


def test_a_predictor_listed_after_one_the_run_does_not_own_is_still_counted(tmp_path):
    """A SWA run's metrics.json may list its last iterate (``sgd``, not its column) before ``swa``."""
    root = tmp_path / "g"
    make_run(root, "swa", 0, {"sgd": m(10.0), "swa": m(93.0)}, budget=1.5)
    [row] = table_of(root).rows
    assert [(c.label, cell.values("acc")) for c, cell in row.cells.items()] == [("SWA 1.5B (6 ep)", [93.0])]


def test_an_entry_without_accuracy_is_no_column(tmp_path):
    """What a method adds to metrics.json beside its scored predictors (SWAG-diag's sampling settings, a SWA
    average's count) is not a predictor: it makes no column, not even an empty one."""
    root = tmp_path / "g"
    make_run(root, "swa", 0, {"swa_extra": {"n_averaged": 0}, "swa": m(93.0)}, budget=1.5)
    [row] = table_of(root).rows
    assert [c.method for c in row.cells] == ["swa"]


def test_a_pretrained_column_beside_sgd_is_not_paired_and_the_report_says_why(tmp_path):
    """method=pretrained trains nothing (budget 0): it has no B, so no SGD twin, even with SGD runs in its row."""
    root = tmp_path / "g"
    make_run(root, "pretrained", 0, {"pretrained": m(76.0, budget=0.0, epoch=0)}, budget=0)
    make_run(root, "sgd", 0, {"sgd": m(80.0)})
    make_run(root, "swa", 0, {"swa": m(81.0)}, budget=1.5)
    report([root], tmp_path / "out")
    lines = table_lines(tmp_path / "out", PAIRED, paragraph=1)
    assert lines[0] == "| row | Pretrained − SGD | SWA 1.5B (6 ep) − SGD |"  # no "0B (0 ep)": it trains nothing
    assert lines[2] == "| cifar10 / preresnet20 | nothing trained: no B to pair with SGD | +1.00 (+1.00) |"


def test_a_method_that_trains_nothing_is_labelled_by_its_name_alone_in_every_table(tmp_path):
    """Laplace and pretrained (``Method.trains`` False) have no budget and no epochs: ``Laplace``, ``Laplace+ts``,
    never ``Laplace 0B (0 ep)``; a training method keeps its budget and epochs."""
    root = tmp_path / "g"
    make_run(root, "laplace", 0, {"map": m(80.0, budget=0.0, epoch=0), "laplace": m(80.5, budget=0.0, epoch=0),
                                  "map+ts": m(80.0, budget=0.0, epoch=0, temperature=1.2),
                                  "laplace+ts": m(80.5, budget=0.0, epoch=0, temperature=1.1)}, budget=0)
    make_run(root, "sgd", 0, {"sgd": m(80.0)})
    assert sorted(c.label for row in table_of(root).rows for c in row.cells) == ["Laplace", "Laplace+ts", "SGD 1B (4 ep)"]
    report([root], tmp_path / "out")
    text = (tmp_path / "out" / "table.md").read_text()
    assert "| Laplace |" in text and "| Laplace+ts |" in text and "SGD 1B (4 ep)" in text
    assert "0B" not in text and "(0 ep)" not in text


def test_laplace_around_the_sgd_runs_of_a_row_stands_in_their_row_paired_seed_by_seed(tmp_path):
    """A Laplace run names its source by its group (``model.init_from=run-<group hash>``): it sits in its SGD runs'
    row as ``Laplace of SGD 1B (4 ep)``, each seed paired with the SGD run it was fitted around."""
    from swalab.identity import group_hash

    root = tmp_path / "g"
    sgd = [make_run(root, "sgd", seed, {"sgd": m(acc)}) for seed, acc in ((0, 80.0), (1, 82.0))]
    source = f"run-{group_hash(Run(sgd[0]).identity)}"
    for seed, acc in ((0, 80.5), (1, 82.25)):
        make_run(root, "laplace", seed, {"map": m(acc - 0.5, budget=0.0, epoch=0), "laplace": m(acc, budget=0.0, epoch=0)},
                 budget=0, extra={"method": {"_target_": "swalab.methods.LaplaceMethod"}, "model": {"init_from": source}})
    report([root], tmp_path / "out")
    assert table_lines(tmp_path / "out")[:3] == ["| row | SGD 1B (4 ep) | Laplace of SGD 1B (4 ep) |", "|---|---|---|",
                                                 "| cifar10 / preresnet20 | 81.00 ± 1.41 (n=2) | 81.38 ± 1.24 (n=2) |"]
    assert table_lines(tmp_path / "out", PAIRED, paragraph=1)[2:] == [
        "| cifar10 / preresnet20 | +0.38 ± 0.18 (+0.50, +0.25) |"]


def test_laplace_in_its_sources_row_never_names_the_row_or_the_sgd_runs_by_its_source(tmp_path):
    """Laplace runs record what they were launched with, their source among it (model.init_from=run-<group>); in
    the row of their SGD runs that names neither the row nor the SGD column, and a Laplace of another prior range is
    a row named by its range alone."""
    from swalab.identity import group_hash

    root = tmp_path / "g"
    sgd = [with_apart(make_run(root, "sgd", seed, {"sgd": m(80.0 + seed)}), {}) for seed in (0, 1)]
    source = f"run-{group_hash(Run(sgd[0]).identity)}"
    laplace = {"_target_": "swalab.methods.LaplaceMethod"}
    for name, more in (("default", {}), ("range", {"prior_range": [-2, 2]})):
        for seed in (0, 1):
            with_apart(make_run(root, "laplace", seed, {"laplace": m(80.5 + seed, budget=0.0, epoch=0)}, budget=0,
                                name=name, extra={"method": {**laplace, **more}, "model": {"init_from": source}}),
                       {"model.init_from": source, **{f"method.{k}": v for k, v in more.items()}})
    rows = table_of(root).rows
    assert [row.name for row in rows] == ["cifar10 / preresnet20", "cifar10 / preresnet20 · method.prior_range=[-2,2]"]
    assert {c.label: rows[0].setting_of(c) for c in rows[0].cells} == {"SGD 1B (4 ep)": "",
                                                                       "Laplace of SGD 1B (4 ep)": ""}


def test_laplace_around_a_run_not_in_the_table_keeps_a_row_of_its_own(tmp_path):
    root = tmp_path / "g"
    make_run(root, "sgd", 0, {"sgd": m(80.0)})
    make_run(root, "laplace", 0, {"laplace": m(80.5, budget=0.0, epoch=0)}, budget=0,
             extra={"method": {"_target_": "swalab.methods.LaplaceMethod"}, "model": {"init_from": "run-0123456789ab"}})
    assert sorted(c.label for row in table_of(root).rows for c in row.cells) == ["Laplace", "SGD 1B (4 ep)"]
    assert len(table_of(root).rows) == 2


def test_a_setting_every_method_of_a_row_shares_labels_the_row_and_keeps_sgd_and_swa_together(tmp_path):
    root = tmp_path / "g"
    with_apart(make_run(root, "sgd", 0, {"sgd": m(90.0)}, extra={"dataset": {"train_size": 1000}}),
               {"dataset.train_size": 1000})
    with_apart(make_run(root, "swa", 0, {"swa": m(93.0)}, budget=1.5, extra={"dataset": {"train_size": 1000}}),
               {"dataset.train_size": 1000})
    report([root], tmp_path / "out")
    assert table_lines(tmp_path / "out")[2:] == ["| cifar10 / preresnet20 · dataset.train_size=1000 | 90.00 (n=1) | "
                                                 "93.00 (n=1) |"]


def test_a_row_of_runs_launched_by_an_experiment_names_the_experiment_whose_settings_are_its_defaults(tmp_path):
    root = tmp_path / "g"
    for method, metrics, budget in (("sgd", {"sgd": m(90.0)}, 1.0), ("swa", {"swa": m(93.0)}, 1.5)):
        run = with_apart(make_run(root, method, 0, metrics, budget=budget, extra={"optimizer": {"name": "adamw"}}),
                         {"optimizer": "adamw"})  # set by the experiment: apart from the primary config's choice
        (run / "overrides.yaml").write_text(yaml.safe_dump([f"method={method}", "experiment=my_recipe"]))
    report([root], tmp_path / "out")
    assert row_names(tmp_path / "out") == ["cifar10 / preresnet20 · experiment=my_recipe, optimizer=adamw"]


def test_a_soup_of_several_seeds_is_paired_with_no_one_seeds_sgd_run(tmp_path):
    """A soup is stored under its lowest seed's run, but it averages every seed: its seed-0 SGD run is no pair of it."""
    root = tmp_path / "g"
    make_run(root, "sgd", 0, {"sgd": m(90.0)})
    swa = make_run(root, "swa", 0, {"swa": m(93.0)})
    for folder, label, acc, runs in (("lawa2", "lawa2", 94.0, ["."]),
                                     ("soup-uniform_3", "soup-uniform(3)", 95.0, [".", "../../x/seed1", "../../x/seed2"])):
        (swa / "posthoc" / folder).mkdir(parents=True)
        (swa / "posthoc" / folder / "metrics.json").write_text(json.dumps({label: {**m(acc), "rebuild_runs": runs}}))
    report([root], tmp_path / "out")
    paired = (tmp_path / "out" / "table.md").read_text().split(f"## {PAIRED}")[1].split("\n\n")[2]
    header, _, line = paired.splitlines()
    cells = dict(zip(header.strip("| ").split(" | "), line.strip("| ").split(" | ")))
    lawa = next(k for k in cells if k.startswith("lawa2"))
    soup = next(k for k in cells if k.startswith("soup-uniform(3)"))
    assert cells[lawa].startswith("+4.00") and cells[soup] == "built from several runs: no seed to pair"


def test_a_setting_typed_under_method_sets_its_run_apart(tmp_path):
    root = tmp_path / "g"
    with_apart(make_run(root, "ema", 0, {"ema": m(91.0)}), {})
    with_apart(make_run(root, "ema", 0, {"ema": m(92.0)}, name="d99", extra={"method": {"decay": 0.99}}),
               {"method.decay": 0.99})
    report([root], tmp_path / "out")
    assert row_names(tmp_path / "out") == ["cifar10 / preresnet20", "cifar10 / preresnet20 · method.decay=0.99"]


def test_a_rows_label_is_what_its_methods_share_even_when_its_first_run_has_settings_of_its_own(tmp_path):
    """The row's label comes from its first run's record (here an EMA run of its own decay, found first): of that
    record only what every method of the row shares (not ``method.*``, not the epochs its column shows)."""
    shared = {"dataset.train_size": 1000, "trainer.epochs": 6}
    extra = {"dataset": {"train_size": 1000}, "trainer": {"epochs": 6}}
    with_apart(make_run(tmp_path / "a", "ema", 0, {"ema": m(93.0)}, extra={**extra, "method": {"decay": 0.99}}),
               {**shared, "method.decay": 0.99})
    with_apart(make_run(tmp_path / "b", "ema", 0, {"ema": m(92.0)}, extra=extra), shared)
    with_apart(make_run(tmp_path / "b", "sgd", 0, {"sgd": m(90.0)}, extra=extra), shared)
    report([tmp_path / "a", tmp_path / "b"], tmp_path / "out")
    assert row_names(tmp_path / "out") == ["cifar10 / preresnet20 · dataset.train_size=1000",
                                           "cifar10 / preresnet20 · dataset.train_size=1000, method.decay=0.99"]


def test_a_run_whose_metrics_name_no_budget_or_epoch_takes_both_from_its_config(tmp_path):
    """Runs of earlier versions wrote no ``budget`` or ``epoch`` beside a predictor's metrics: its column comes from
    ``method.budget`` and ``trainer.epochs``, zero for a pretrained model, never a budget it did not run."""
    root = tmp_path / "g"
    make_run(root, "pretrained", 0, {"pretrained": m(76.0)}, budget=0)
    make_run(root, "swa", 0, {"swa": m(81.0)}, budget=1.25)
    columns = [c for row in table_of(root).rows for c in row.cells]
    assert [(c.budget, c.epochs) for c in columns] == [(0, 0), (1.25, 5)]
    assert [c.label for c in columns] == ["Pretrained", "SWA 1.25B (5 ep)"]  # a method that trains nothing: its name


def test_of_the_sgd_runs_whose_half_budget_gives_a_columns_epochs_its_twin_is_the_one_of_its_own_b(tmp_path):
    """Half a budget of 7, 8 or 9 epochs is 4 epochs (3.5 and 4.5 rounded as run.py rounds them), so each SGD run
    could have made SWA 0.5B (4 ep); its twin is the SGD run whose B is the column's own, 4 / 0.5 = 8."""
    root = tmp_path / "g"
    for epochs, acc in ((7, 90.0), (8, 91.0), (9, 92.0)):
        make_run(root, "sgd", 0, {"sgd": m(acc)}, name=f"e{epochs}", extra={"trainer": {"epochs": epochs}})
    make_run(root, "swa", 0, {"swa": m(95.0)}, budget=0.5, extra={"trainer": {"epochs": 4}})
    [(column, diffs)] = [(c, d) for row in table_of(root).rows for c, d in paired_differences(row).items()]
    assert (column.label, diffs) == ("SWA 0.5B (4 ep)", [4.0])


def test_per_seed_differences_follow_the_seed_order_of_the_cells(tmp_path):
    root = tmp_path / "g"
    for seed, (sgd, swa) in ((2, (90.0, 91.0)), (10, (90.0, 93.0))):
        make_run(root, "sgd", seed, {"sgd": m(sgd)})
        make_run(root, "swa", seed, {"swa": m(swa)}, budget=1.5)
    [row] = table_of(root).rows
    [(column, diffs)] = paired_differences(row).items()
    by_seed = {2: 1.0, 10: 3.0}
    assert diffs == [by_seed[s] for s in row.cells[column].seeds]


def test_a_key_only_some_unrecorded_rows_hold_still_labels_them(tmp_path):
    """A run of an earlier version may lack a key a later one has (here ``trainer.batch_size``): the row without it
    says ``–`` rather than dropping the key, whichever row is found first."""
    root = tmp_path / "g"
    make_run(root, "sgd", 0, {"sgd": m(90.0)}, name="a_step", extra={"schedule": {"_target_": "swalab.schedules.Step"}})
    make_run(root, "sgd", 0, {"sgd": m(91.0)}, name="b_cos",
             extra={"schedule": {"_target_": "swalab.schedules.Cosine"}, "trainer": {"batch_size": 64}})
    assert sorted(row.label for row in table_of(root).rows) == ["schedule=Cosine, trainer.batch_size=64",
                                                                "schedule=Step, trainer.batch_size=–"]


def test_of_unrecorded_variants_the_one_with_most_seeds_leads_and_a_seed_never_labels_a_row(tmp_path):
    root = tmp_path / "g"
    swa = {"_target_": "swalab.methods.SWA"}
    for seed in (0, 1):
        make_run(root, "swa", seed, {"swa": m(93.0)}, budget=1.5, name="b_two_seeds",
                 extra={"method": swa, "model": {"swa": {"lr": 0.05}}})
    make_run(root, "swa", 1, {"swa": m(91.0)}, budget=1.5, name="a_one_seed",
             extra={"method": swa, "model": {"swa": {"lr": 0.01}}})
    lead, other = table_of(root).rows
    assert [len(cell.entries) for cell in lead.cells.values()] == [2] and lead.label == ""
    assert other.label == "method.lr=0.01"  # no record of the key typed: the identity's key


def test_a_row_whose_every_run_has_settings_of_its_own_is_named_with_them(tmp_path):
    root = tmp_path / "g"
    with_apart(make_run(root, "swa", 0, {"swa": m(93.0)}, budget=1.5, extra={"method": {"_target_": "swalab.methods.SWA"}}),
               {"model.swa.lr": 0.05})
    report([root], tmp_path / "out")
    assert row_names(tmp_path / "out") == ["cifar10 / preresnet20 · SWA: model.swa.lr=0.05"]


def test_the_budget_marks_of_a_labelled_swa_run_share_its_row(tmp_path):
    """A SWA run of its own lr scored at 1B and 1.5B, beside the default SWA, is one row with two columns, not two
    rows of one label."""
    root = tmp_path / "g"
    swa = {"_target_": "swalab.methods.SWA"}
    with_apart(make_run(root, "sgd", 0, {"sgd": m(90.0)}), {})
    with_apart(make_run(root, "swa", 0, {"swa": m(92.0)}, budget=1.5, extra={"method": swa}), {})
    with_apart(make_run(root, "swa", 0, {"swa": m(93.0), "swa@1": m(91.0, budget=1.0, epoch=4)}, budget=1.5,
                        name="lr", extra={"method": {**swa, "lr": 0.05}}), {"model.swa.lr": 0.05})
    report([root], tmp_path / "out")
    assert table_lines(tmp_path / "out")[2:] == [
        "| cifar10 / preresnet20 | 90.00 (n=1) | not run | 92.00 (n=1) |",
        "| cifar10 / preresnet20 · model.swa.lr=0.05 | not run | 91.00 (n=1) | 93.00 (n=1) |"]


def test_two_swa_configs_of_one_label_never_share_a_row_the_branch_keeps_its_budget_marks_together(tmp_path):
    """A grid's SWA of model.swa.pre_schedule=base trained straight through and the row tool's SWA branch (the same
    setting, scored at its budget marks, on the SGD run's horizon) are two configs of one label: each is a row of its
    own, named apart, the branch's SWA 1B, 1.25B and 1.5B together, never the grid's 1.5B beside the branch's marks."""
    root = tmp_path / "g"
    swa = {"_target_": "swalab.methods.SWA", "pre_schedule": "base"}
    with_apart(make_run(root, "sgd", 0, {"sgd": m(90.0)}), {})
    with_apart(make_run(root, "swa", 0, {"swa": m(92.0)}, budget=1.5, name="straight", extra={"method": swa}),
               {"model.swa.pre_schedule": "base"})
    with_apart(make_run(root, "swa", 0, {"swa": m(93.0), "swa@1": m(91.0, budget=1.0, epoch=4),
                                         "swa@1.25": m(91.5, budget=1.25, epoch=5)}, budget=1.5, name="branch",
                        extra={"method": {**swa, "score_at_budgets": [1, 1.25], "score_every": 1},
                               "schedule": {"horizon": 4}}),
               {"model.swa.pre_schedule": "base", "model.swa.score_at_budgets": [1, 1.25], "model.swa.score_every": 1,
                "schedule.horizon": 4})
    rows = table_of(root).rows
    for row in rows:  # one config of SWA per row
        assert len({e.run.path for cell in row.cells.values() for e in cell.entries if e.run.method == "swa"}) <= 1
    branch = next(row for row in rows if any(c.budget == 1.25 for c in row.cells))
    assert sorted(cell.entries[0].metrics["acc"] for cell in branch.cells.values()) == [91.0, 91.5, 93.0]
    assert len({row.name for row in rows}) == len(rows) == 3


def test_two_swa_configs_apart_only_in_the_schedules_horizon_are_rows_named_by_it(tmp_path):
    """The row tool's SWA branch (on the SGD run's horizon) and the same settings typed for a run trained straight
    through (the horizon its own length) differ in nothing the row names otherwise: the horizon names them apart."""
    root = tmp_path / "g"
    swa = {"_target_": "swalab.methods.SWA", "pre_schedule": "base", "score_at_budgets": [1]}
    typed = {"model.swa.pre_schedule": "base", "model.swa.score_at_budgets": [1]}
    with_apart(make_run(root, "sgd", 0, {"sgd": m(90.0)}), {})
    with_apart(make_run(root, "swa", 0, {"swa": m(92.0), "swa@1": m(91.0, budget=1.0, epoch=4)}, budget=1.5,
                        name="straight", extra={"method": swa}), typed)
    with_apart(make_run(root, "swa", 0, {"swa": m(93.0), "swa@1": m(91.5, budget=1.0, epoch=4)}, budget=1.5,
                        name="branch", extra={"method": swa, "schedule": {"horizon": 4}}), {**typed, "schedule.horizon": 4})
    rows = {row.label: sorted(c.entries[0].metrics["acc"] for c in row.cells.values()) for row in table_of(root).rows}
    assert rows == {"": [90.0], "model.swa.pre_schedule=base, model.swa.score_at_budgets=[1]": [91.0, 92.0],
                    "model.swa.pre_schedule=base, model.swa.score_at_budgets=[1], schedule.horizon=4": [91.5, 93.0]}


def test_the_schedules_horizon_of_a_swa_branch_never_names_the_row_whichever_run_is_read_first(tmp_path):
    """The row tool's SWA branch runs on the SGD run's horizon (schedule.horizon=B), a setting of its method's: read
    before the SGD run (its folder sorts first), it names neither the row nor the SGD column's setting."""
    swa = {"_target_": "swalab.methods.SWA", "pre_schedule": "base"}
    with_apart(make_run(tmp_path / "a", "swa", 0, {"swa": m(92.0)}, budget=1.5, extra={"method": swa,
                                                                                      "schedule": {"horizon": 4}}),
               {"model.swa.pre_schedule": "base", "schedule.horizon": 4})
    with_apart(make_run(tmp_path / "b", "sgd", 0, {"sgd": m(90.0)}), {})
    [row] = table_of(tmp_path / "a", tmp_path / "b").rows
    assert row.name == "cifar10 / preresnet20 · SWA: model.swa.pre_schedule=base"
    assert {c.label: row.setting_of(c) for c in row.cells} == {"SGD 1B (4 ep)": "",
                                                               "SWA 1.5B (6 ep)": "model.swa.pre_schedule=base"}


def test_a_sweep_of_a_methods_own_setting_puts_each_config_in_a_row_of_its_own(tmp_path):
    """Two SWA lrs and no SWA of the defaults: neither stands in SGD's row (which would set one lr above the
    other); each has its row, labelled with its lr, paired with SGD."""
    root = tmp_path / "g"
    swa = {"_target_": "swalab.methods.SWA"}
    with_apart(make_run(root, "sgd", 0, {"sgd": m(90.0)}), {})
    for name, lr, acc in (("a", 0.01, 91.0), ("b", 0.05, 92.0)):
        with_apart(make_run(root, "swa", 0, {"swa": m(acc)}, budget=1.5, name=name, extra={"method": {**swa, "lr": lr}}),
                   {"model.swa.lr": lr})
    report([root], tmp_path / "out")
    assert table_lines(tmp_path / "out")[2:] == [
        "| cifar10 / preresnet20 | 90.00 (n=1) | not run |",
        "| cifar10 / preresnet20 · model.swa.lr=0.01 | not run | 91.00 (n=1) |",
        "| cifar10 / preresnet20 · model.swa.lr=0.05 | not run | 92.00 (n=1) |"]


def test_a_method_of_settings_of_its_own_shares_the_row_and_its_paper_comparison(tmp_path):
    """SGD and FGE of the defaults with the row tool's SWA branch (model.swa.pre_schedule=base) are one row: the
    SWA columns beside SGD's, the row naming SWA's setting, the paper's published row beside it."""
    root = tmp_path / "g"
    swa = {"_target_": "swalab.methods.SWA", "pre_schedule": "base"}
    with_apart(make_run(root, "sgd", 0, {"sgd": m(90.0)}, model="vgg16"), {})
    with_apart(make_run(root, "swa", 0, {"swa": m(93.0), "swa@1": m(91.0, budget=1.0, epoch=4)}, budget=1.5,
                        model="vgg16", extra={"method": swa}), {"model.swa.pre_schedule": "base"})
    report([root], tmp_path / "out", paper=True)
    lines = table_lines(tmp_path / "out")
    assert lines[0] == "| row | SGD 1B (4 ep) | SWA 1B (4 ep) | SWA 1.5B (6 ep) |"
    assert lines[2] == "| cifar10 / vgg16 · SWA: model.swa.pre_schedule=base | 90.00 (n=1) | 91.00 (n=1) | 93.00 (n=1) |"
    assert lines[3].startswith("| cifar10 / vgg16 (paper) | 93.25 ± 0.16 | 93.59 ± 0.16 |"), lines[3]
    with (tmp_path / "out" / "table.csv").open() as f:  # the CSV's setting: what each column's runs ran with
        settings = {(r["column"], r["setting"]) for r in csv.DictReader(f)}
    assert settings == {("SGD 1B (4 ep)", ""), ("SWA 1B (4 ep)", "model.swa.pre_schedule=base"),
                        ("SWA 1.5B (6 ep)", "model.swa.pre_schedule=base")}


def test_a_cells_seeds_are_in_seed_order_wherever_their_directories_lie(tmp_path):
    make_run(tmp_path / "a", "sgd", 1, {"sgd": m(91.0)})
    make_run(tmp_path / "b", "sgd", 0, {"sgd": m(90.0)})
    [row] = table_of(tmp_path / "a", tmp_path / "b").rows
    [cell] = row.cells.values()
    assert cell.seeds == [0, 1] and cell.values("acc") == [90.0, 91.0]


def test_which_copy_of_a_run_counts_does_not_depend_on_the_order_the_runs_are_given(tmp_path):
    first, second = (make_run(tmp_path / root, "sgd", 0, {"sgd": m(90.0)}) for root in ("a", "b"))
    for runs in ([first, second], [second, first]):
        table = build_table([Run(p) for p in runs])
        assert table.duplicates == [f"{second} repeats {first} (same config and seed): counted once"]


def test_a_copy_of_a_run_of_several_predictors_is_named_once_under_not_in_the_table(tmp_path):
    """Two copies of one SWA run (its swa, sgd and a budget mark each a column): one line, not one per predictor."""
    scores = {"swa": m(93.0), "sgd": m(91.0), "swa@1": m(90.0, budget=1.0, epoch=4)}
    first, second = (make_run(tmp_path / root, "swa", 0, scores, budget=1.5) for root in ("a", "b"))
    table = build_table([Run(first), Run(second)])
    assert table.duplicates == [f"{second} repeats {first} (same config and seed): counted once"]


def test_a_repeat_of_a_run_still_adds_the_predictors_the_first_copy_lacks(tmp_path):
    """The same config and seed in a second directory, scored there at one more budget mark: that mark counts."""
    make_run(tmp_path / "a", "swa", 0, {"swa": m(93.0)}, budget=1.5)
    make_run(tmp_path / "b", "swa", 0, {"swa": m(93.0), "swa@1.25": m(92.0, budget=1.25, epoch=5)}, budget=1.5)
    table = table_of(tmp_path / "a", tmp_path / "b")
    [row] = table.rows
    assert sorted((c.label, cell.values("acc")[0]) for c, cell in row.cells.items()) == [
        ("SWA 1.25B (5 ep)", 92.0), ("SWA 1.5B (6 ep)", 93.0)]
    assert len(table.duplicates) == 1


def test_a_table_whose_columns_differ_in_b_names_each_columns_b_in_its_headers(tmp_path):
    """``trainer.epochs=6`` in a grid over methods gives SGD B = 6 and SWA (1.5 budgets in the same 6 epochs) B = 4;
    the headers ``SGD 1B (6 ep)`` beside ``SWA 1.5B (6 ep)`` hid it."""
    root = tmp_path / "g"
    make_run(root, "sgd", 0, {"sgd": m(80.0, budget=1.0, epoch=6)}, extra={"trainer": {"epochs": 6}})
    make_run(root, "swa", 0, {"swa": m(81.0, budget=1.5, epoch=6)}, budget=1.5, extra={"trainer": {"epochs": 6}})
    report([root], tmp_path / "out")
    assert table_lines(tmp_path / "out")[0] == "| row | SGD 1B (6 ep, B = 6) | SWA 1.5B (6 ep, B = 4) |"
    assert table_lines(tmp_path / "out", PAIRED, paragraph=1)[0] == "| row | SWA 1.5B (6 ep, B = 4) − SGD |"


def test_a_table_whose_columns_share_b_keeps_headers_without_it_whatever_the_rounding_of_epochs(tmp_path):
    """SWA 1.25 budgets of B = 5 is 6 epochs (rounded from 6.25): the same B as SGD's 5 epochs."""
    root = tmp_path / "g"
    make_run(root, "sgd", 0, {"sgd": m(80.0, budget=1.0, epoch=5)}, extra={"trainer": {"epochs": 5}})
    make_run(root, "swa", 0, {"swa": m(81.0, budget=1.5, epoch=8), "swa@1.25": m(80.5, budget=1.25, epoch=6)},
             budget=1.5, extra={"trainer": {"epochs": 8}})
    report([root], tmp_path / "out")
    assert table_lines(tmp_path / "out")[0] == "| row | SGD 1B (5 ep) | SWA 1.25B (6 ep) | SWA 1.5B (8 ep) |"


def test_an_fge_run_recorded_with_save_members_shares_the_row_of_its_sgd_run(tmp_path):
    """Identity version 4 counted ``model.fge.save_members`` and recorded it as setting the run apart: today it only
    says what the run kept, so the FGE run sits in its SGD run's row, not in a row labelled by it."""
    import json

    from swalab.identity import identity_of

    root = tmp_path / "g"
    with_apart(make_run(root, "sgd", 0, {"sgd": m(90.0)}), {})
    fge = make_run(root, "fge", 0, {"fge": m(92.0)}, name="fge.save_members-True",
                   extra={"method": {"_target_": "swalab.methods.FGE"}, "model": {"fge": {"save_members": True}}})
    config = yaml.safe_load((fge / "config.yaml").read_text())
    identity = {**identity_of(config), "model.fge.save_members": True}  # as version 4 held it
    (fge / "identity.json").write_text(json.dumps({"version": 4, "identity": identity,
                                                   "apart": {"model.fge.save_members": True}}))
    report([root], tmp_path / "out")
    assert table_lines(tmp_path / "out")[2:] == ["| cifar10 / preresnet20 | 90.00 (n=1) | 92.00 (n=1) |"]


def on_data(run, fingerprint: str):
    """The run as trained on images of this fingerprint (``data.fingerprint`` in its identity, as run.py records it)."""
    import json

    record = json.loads((run / "identity.json").read_text())
    record["identity"]["data.fingerprint"] = fingerprint
    (run / "identity.json").write_text(json.dumps(record))
    return run


def test_runs_of_one_config_on_two_versions_of_an_image_folder_are_two_rows_each_named_by_its_data(tmp_path):
    """A folder of the user's images changed between two grids (an image added, removed or rewritten): the runs
    before and after are other experiments (``data.fingerprint``), whose settings as typed are the same. Their rows
    must not read alike: each names the data it trained on, and holds that data's SGD and SWA runs only."""
    for grid, fingerprint, (sgd, swa) in (("before", "aaaaaaaaaaaaaaaa", (90.0, 93.0)),
                                          ("after", "bbbbbbbbbbbbbbbb", (80.0, 84.0))):
        on_data(with_apart(make_run(tmp_path / grid, "sgd", 0, {"sgd": m(sgd)}), {}), fingerprint)
        on_data(with_apart(make_run(tmp_path / grid, "swa", 1, {"swa": m(swa)}, budget=1.5), {}), fingerprint)
    report([tmp_path / "before", tmp_path / "after"], tmp_path / "out")
    assert sorted(line.split(" | ", 1)[1] for line in table_lines(tmp_path / "out")[2:]) == [
        "80.00 (n=1) | 84.00 (n=1) |", "90.00 (n=1) | 93.00 (n=1) |"]
    assert sorted(row_names(tmp_path / "out")) == ["cifar10 / preresnet20 · data.fingerprint=aaaaaaaaaaaaaaaa",
                                                   "cifar10 / preresnet20 · data.fingerprint=bbbbbbbbbbbbbbbb"]
    rows = {row.label: row for row in table_of(tmp_path / "before", tmp_path / "after").rows}
    assert [e.run.path.parents[4].name for c in rows["data.fingerprint=aaaaaaaaaaaaaaaa"].cells.values()
            for e in c.entries] == ["before", "before"]
