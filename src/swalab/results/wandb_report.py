"""The W&B Report of a report's table: what ``python -m swalab.results.report <dirs> --wandb`` publishes.

Built with W&B's own report library, ``wandb_workspaces.reports.v2`` (a dependency of swalab),
from the table ``swalab.results.table.build_table`` makes, so the W&B Report and ``table.md`` never differ:

1. **Table 1**: accuracy, NLL, ECE and Brier score per row and column as numbers (mean, std, n), the paper's
   numbers as rows of their own where it has them. W&B panels read tables from runs, so a
   ``job_type=report`` run logs these tables (``table1/acc``, ..., ``table1/brier``) and the curves of 3.
2. **Per table row, its training runs**: test error against epoch (the live model, and SWA's
   average) grouped by W&B group, i.e. by identity minus seed (mean and std over seeds); the
   reliability diagrams; each FGE run's ensemble accuracy against its members.
3. **FGE against SWA**: the FGE ensemble's accuracy against the number of members (mean over seeds)
   with each SWA column's accuracy as a flat line.

Every run set of 2 is filtered to the grid tags its runs recorded (``<run>/wandb_run.json``:
``grid:<date_time>``, one per grid launch) and to the W&B groups of its row, so each panel links to
exactly its training runs; the report run's set is filtered to that run's id.

Online, the report is saved and its URL printed. Offline, or when saving fails (no API key, no
network), the report's full spec (the view W&B stores, as JSON) goes to ``<out>/wandb_report.json``
with the offline runs it needs; ``python -m swalab.results.wandb_report publish <out>/wandb_report.json``
uploads those runs (``wandb sync``) and saves the report."""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any, Sequence

from swalab.cli import run_command
from swalab.results.plots import scored_during_training
from swalab.evaluate import reported_metrics
from swalab.results.table import Row, Table, mean_std
from swalab.results.write import paper_row, to_markdown
from swalab.tracking import WandbTracker, new_run_id, read_record
from swalab.rundir import first_line, write_text

SPEC_FILE = "wandb_report.json"
PUBLISH = "python -m swalab.results.wandb_report publish {spec}"
TITLE_MAX = 128  # characters W&B keeps of a report's title


class ReportUnavailable(ImportError):
    """The W&B report library is not installed."""


def workspaces():
    """``wandb_workspaces.reports.v2``, or an error that says how to install it."""
    try:
        from wandb_workspaces.reports import v2
    except ImportError as exc:
        raise ReportUnavailable(f"a W&B Report needs the wandb-workspaces package ({exc}): "
                                "pip install 'wandb-workspaces>=0.4' (a dependency of swalab since its W&B Reports)") from exc
    return v2


# -- the numbers the report shows ---------------------------------------------------------------

def parse_paper(text: str | None) -> tuple[float, float | None] | None:
    """``"72.55 ± 0.10"`` -> ``(72.55, 0.10)``; ``"74.26"`` -> ``(74.26, None)``; ``"–"`` -> None."""
    numbers = re.findall(r"-?\d+(?:\.\d+)?", text or "")
    if not numbers:
        return None
    return float(numbers[0]), float(numbers[1]) if len(numbers) > 1 else None


def numeric_tables(table: Table, paper: dict | None = None) -> dict[str, tuple[list[str], list[list]]]:
    """Table 1's layout as numbers, one table per metric (``table1/acc``, ``table1/nll``, ``table1/ece``,
    ``table1/brier``): a line per row (and ``<row> (paper)`` under it where the paper has the row), per column its
    mean, std (None for one seed) and n."""
    columns = table.columns
    header = ["row", "source"] + [f"{c.label} {part}" for c in columns for part in ("mean", "std", "n")]
    out = {}
    for metric in (m.name for m in reported_metrics()):
        lines = []
        for row in table.rows:
            line: list[Any] = [row.name, "swalab"]
            for column in columns:
                values = row.cells[column].values(metric) if column in row.cells else []
                mean, std = mean_std(values) if values else (None, None)
                line += [mean, std, len(values) or None]
            lines.append(line)
            published = paper_row(paper, row.dataset, row.model) if paper and metric == "acc" and not row.label else None
            if published:
                line = [f"{row.dataset} / {row.model} (paper)", "paper"]
                for column in columns:
                    mean, std = parse_paper(published.get(column.paper)) or (None, None)
                    line += [mean, std, None]
                lines.append(line)
        out[f"table1/{metric}"] = (header, lines)
    return out


def fge_against_swa(table: Table) -> dict[str, tuple[list[str], list[list]]]:
    """Per row with FGE members curves (``fge_vs_swa/<row number>``): ``members, acc, series`` with each FGE
    column's ensemble accuracy (mean over seeds) and each SWA column's accuracy at every member count."""
    out = {}
    for number, row in enumerate(table.rows):
        ordered = sorted(row.cells.items(), key=lambda kv: kv[0].order)
        lines, ks = [], set()
        for column, cell in ordered:
            if column.method != "fge":
                continue
            points: dict[int, list[float]] = defaultdict(list)
            for entry in cell.entries:
                for p in entry.metrics.get("curve") or []:
                    points[int(p["members"])].append(float(p["acc"]))
            ks |= set(points)
            lines += [[k, statistics.fmean(points[k]), f"{column.label} ensemble"] for k in sorted(points)]
        if not lines:
            continue
        for column, cell in ordered:
            if column.method == "swa" and cell.values("acc"):
                lines += [[k, statistics.fmean(cell.values("acc")), f"{column.label} model"] for k in sorted(ks)]
        out[f"fge_vs_swa/{number}"] = (["members", "acc", "series"], lines)
    return out


# -- the runs the panels link to --------------------------------------------------------------------

def row_links(row: Row) -> dict[str, Any]:
    """The W&B runs of ``row`` (from each run's ``wandb_run.json``): their groups, grid tags, ids, and the
    project and entity they were logged to; runs logged without W&B have no record."""
    records = [read_record(e.run.path) for cell in row.cells.values() for e in cell.entries]
    found = [r for r in records if r]
    return {"groups": sorted({r["group"] for r in found}),
            "grid_tags": sorted({t for r in found for t in r.get("tags", []) if t.startswith("grid:")}),
            "ids": sorted(r["id"] for r in found), "missing": len(records) - len(found),
            "projects": sorted({r.get("project") for r in found if r.get("project")}),
            "entities": sorted({r.get("entity") for r in found if r.get("entity")})}


def runset_of(row: Row, links: dict[str, Any], name: str):
    """The runs of ``row``: those of its grid launches (tags) and its W&B groups (configs)."""
    from wandb_workspaces import expr

    wr = workspaces()
    filters = [expr.Metric("Group").isin(links["groups"])]
    if links["grid_tags"]:
        filters.insert(0, expr.Tags().isin(links["grid_tags"]))
    return wr.Runset(name=name, filters=expr.And(*filters), groupby=["group"])


def line_chart(wr, table_key: str, x: str, y: str, title: str, stroke: str | None = None, width: int = 12):
    """A line chart of a table logged by a run (``wandb.plot.line`` logs ``<key>_table``)."""
    fields = {"x": x, "y": y, **({"stroke": stroke} if stroke else {})}
    chart = wr.CustomChart.from_table(table_key, chart_fields=fields, chart_strings={"title": title})
    chart.chart_name = "wandb/line/v0"
    chart.layout = wr.Layout(w=width, h=8)
    return chart


def row_blocks(wr, row: Row, link: dict[str, Any], name: str) -> list:
    """A row's section of the report: its training runs' test error and reliability (and FGE's ensemble curve) as
    W&B logged them, in a run set of its groups (:func:`runset_of`), or a line saying they were not logged."""
    blocks = [wr.H2(f"{row.name}: training runs")]
    if not link["groups"]:
        return [*blocks, wr.P("These runs were not logged to W&B (logger=none): see test_error.png.")]
    own = [key.replace("_test_acc", "_test_error") for key in scored_during_training(row.runs())]
    panels = [wr.LinePlot(title="Test error (%) against epoch, mean ± std over seeds", x="epoch",
                          y=["test_error", *own], groupby="Group", groupby_aggfunc="mean",
                          groupby_rangefunc="stddev", title_x="epoch", title_y="test error (%)",
                          layout=wr.Layout(w=12, h=8)),
              line_chart(wr, "reliability_table", "confidence", "accuracy",
                         "Reliability: accuracy against confidence", stroke="predictor")]
    if any(c.method == "fge" for c in row.cells):
        panels.append(line_chart(wr, "fge/curve_table", "members", "acc",
                                 "FGE: test accuracy (%) against ensemble members", width=24))
    note = f" ({link['missing']} of its runs were not logged to W&B)" if link["missing"] else ""
    return [*blocks, wr.P(f"W&B groups {', '.join(link['groups'])}{note}."),
            wr.PanelGrid(runsets=[runset_of(row, link, name)], panels=panels)]


# -- the report -------------------------------------------------------------------------------------

def build_report(table: Table, *, project: str, entity: str | None, report_run: str, paper: dict | None = None,
                 title: str | None = None, description: str = ""):
    """The W&B Report (a ``wandb_workspaces.reports.v2.Report``) of ``table`` (module doc); builds offline.

    ``report_run``: the id of the ``job_type=report`` run that logs :func:`numeric_tables` and
    :func:`fge_against_swa`; ``paper``: ``swalab/paper_tables.json``, for the paper's rows."""
    from wandb_workspaces import expr

    wr = workspaces()
    names = list(dict.fromkeys(f"{r.dataset} / {r.model}" for r in table.rows))
    title = title or f"swalab: {', '.join(names)}"
    if len(title) > TITLE_MAX:
        title = title[:TITLE_MAX - 1] + "…"
    links = [row_links(row) for row in table.rows]
    grid_tags = sorted({t for link in links for t in link["grid_tags"]})
    seeds = sorted({str(s) for row in table.rows for cell in row.cells.values() for s in cell.seeds})
    report_runs = wr.Runset(name="report run", filters=expr.And(expr.Metric("ID") == report_run))
    # each run once: one SWA run fills its 1B, 1.25B and 1.5B columns, a branched run its trunk's row too
    runs = len({e.run.path for r in table.rows for c in r.cells.values() for e in c.entries})
    rows = f"{len(table.rows)} table row{'s' if len(table.rows) != 1 else ''}"

    blocks: list = [wr.MarkdownBlock(
        f"{runs} finished run{'s' if runs != 1 else ''} in {rows}, seeds {', '.join(seeds)}. A cell holds the runs of one config (its identity minus the seed: "
        "one W&B group), each seed once; mean and sample std over seeds. "
        + (f"Training runs: grid launches {', '.join(f'`{t}`' for t in grid_tags)}; each run set below is "
           "filtered to those tags and its row's groups, so every panel links to its training runs."
           if grid_tags else "The training runs were launched outside a grid: run sets are filtered by W&B group."))]

    blocks += [wr.H2("Table 1: test accuracy, NLL, ECE and Brier score"),
               wr.P("Mean, sample std and number of seeds per column, as numbers; rows marked (paper) are "
                    "Izmailov et al. (2018), where the paper has the row."),
               wr.PanelGrid(runsets=[report_runs], panels=[
                   wr.WeavePanelSummaryTable(table_name=f"table1/{metric}", layout=wr.Layout(w=24, h=8))
                   for metric in (m.name for m in reported_metrics())])]

    for number, (row, link) in enumerate(zip(table.rows, links)):
        blocks += row_blocks(wr, row, link, f"row {number + 1}")

    curves = fge_against_swa(table)
    if curves:
        blocks += [wr.H2("FGE against SWA"),
                   wr.P("FGE ensemble test accuracy against the number of members (mean over seeds); each SWA "
                        "column's test accuracy as a flat line (section 3.5 of the paper)."),
                   wr.PanelGrid(runsets=[report_runs], panels=[
                       line_chart(wr, f"{key}_table", "members", "acc", f"{table.rows[int(key.rsplit('/', 1)[1])].name}",
                                  stroke="series", width=24) for key in curves])]

    blocks += [wr.H2("The tables as text (table.md)"), wr.MarkdownBlock(to_markdown(table, paper))]
    return wr.Report(project=project, entity=entity or "", title=title, description=description,
                     blocks=blocks, width="fluid")


def spec_of(report) -> dict:
    """The report as W&B stores it (its view spec), as plain JSON; no network."""
    return report._to_model().model_dump(by_alias=True, exclude_none=True, mode="json")


def report_from_spec(spec: dict):
    """The ``Report`` of a view spec written by :func:`spec_of`."""
    from wandb_workspaces.reports.v2 import internal

    return workspaces().Report._from_model(internal.ReportViewspec.model_validate(spec))


def outline(spec: dict) -> list[str]:
    """One line per block of a view spec (headings, text, run sets with their filters, panels with what
    they plot): what the report shows, for a reader without W&B."""
    lines = []
    for block in spec["spec"]["blocks"]:
        kind = block.get("type")
        text = " ".join(("".join(c.get("text", "") for c in block.get("children", [])) or block.get("content", "")).split())
        if kind == "heading":
            lines.append(f"H{block.get('level')} {text}")
        elif kind in ("paragraph", "markdown-block"):
            if text:
                lines.append(f"{kind}: {text[:70]}{'…' if len(text) > 70 else ''}")
        elif kind == "panel-grid":
            meta = block["metadata"]
            for rs in meta["runSets"]:
                parts = [f"{f['key']['name']} {f['op']} {f['value']}" for f in rs.get("filters", {}).get("filters", [])]
                lines.append(f"  runset {rs.get('name')!r}: {' and '.join(parts)}")
            for panel in meta["panelBankSectionConfig"]["panels"]:
                cfg = panel.get("config", {})
                if panel.get("viewType") == "Run History Line Plot":
                    lines.append(f"  panel line plot {cfg.get('metrics')} against {cfg.get('xAxis')}, grouped by "
                                 f"{cfg.get('groupBy')} ({cfg.get('groupAgg')}, {cfg.get('groupArea')})")
                elif panel.get("viewType") == "Vega2":
                    table = cfg["userQuery"]["queryFields"][0]["fields"][0]["args"][0]["value"]
                    lines.append(f"  panel chart {cfg.get('panelDefId')} of {table} {cfg.get('fieldSettings')}")
                elif panel.get("viewType") == "Weave":
                    table = cfg["panel2Config"]["exp"]["fromOp"]["inputs"]["key"]["val"]
                    lines.append(f"  panel table {table}")
                else:
                    lines.append(f"  panel {panel.get('viewType')}")
        else:
            lines.append(str(kind))
    return lines


def log_report_run(table: Table, paper: dict | None, out: Path, mode: str, project: str, entity: str | None,
                   run_id: str) -> WandbTracker:
    """The ``job_type=report`` run that holds the report's numeric tables and FGE-against-SWA curves."""
    tracker = WandbTracker(project=project, entity=entity, run_dir=out, mode=mode, job_type="report",
                           name=f"report {out.name}", tags=["swa-lab", "report"], run_id=run_id,
                           run_config={"report": {"out": str(out), "rows": [r.name for r in table.rows]}})

    def write():
        import wandb

        data: dict[str, Any] = {key: wandb.Table(columns=header, data=lines)
                                for key, (header, lines) in numeric_tables(table, paper).items()}
        for key, (header, lines) in fge_against_swa(table).items():
            data[key] = wandb.plot.line(wandb.Table(columns=header, data=lines), x="members", y="acc",
                                        stroke="series", title="FGE ensemble against SWA")
        tracker.run.log(data)
    tracker._call("report tables", write)
    tracker.finish()
    return tracker


def offline_runs(table: Table, out: Path) -> list[str]:
    """The offline W&B run folders the report shows: every run's, and the report run's."""
    folders = [p for row in table.rows for cell in row.cells.values() for e in cell.entries
               for p in sorted((e.run.path / "wandb").glob("offline-run-*"))]
    folders += sorted((out / "wandb").glob("offline-run-*"))
    return [str(p.resolve()) for p in dict.fromkeys(folders)]


def publish_report(table: Table, out: str | Path, mode: str, project: str | None = None, entity: str | None = None,
                   paper: dict | None = None, made_by: str | None = None) -> dict[str, Any]:
    """Log the report run and build the report of ``table``: saved online (``url``), else its spec written to
    ``<out>/wandb_report.json`` (``spec``) with the ``command`` that publishes it later. ``made_by``: the command
    that made the report (its inputs and ``--out``), recorded as the report's description."""
    workspaces()  # fail before anything is logged when the library is missing
    out = Path(out)
    links = [row_links(row) for row in table.rows]
    project = project or next((p for link in links for p in link["projects"]), None) or "swalab"
    entity = entity or next((e for link in links for e in link["entities"]), None)
    run_id = new_run_id()
    tracker = log_report_run(table, paper, out, mode, project, entity, run_id)
    report = build_report(table, project=project, entity=entity, report_run=run_id, paper=paper,
                          description=made_by or f"python -m swalab.results.report ... --out {out} --wandb")
    result: dict[str, Any] = {"url": None, "spec": None, "command": None, "error": None,
                              "report": report, "not_logged": tracker.not_logged}
    if mode == "online" and tracker.mode == "online" and not tracker.not_logged:
        try:
            import wandb

            if not report.entity:
                report.entity = wandb.Api().default_entity
            report.save()
            result["url"] = report.url
            return result
        except Exception as exc:  # no API key, no network, no access to the project
            result["error"] = first_line(exc)
    spec_path = out / SPEC_FILE
    write_text(spec_path, json.dumps({"report": spec_of(report), "offline_runs": offline_runs(table, out)}, indent=1)
               + "\n")
    result.update(spec=spec_path, command=PUBLISH.format(spec=spec_path))
    return result


class CannotPublish(RuntimeError):
    """Publishing stopped for a reason the user fixes (no W&B API key, ``wandb sync`` failed); the spec is kept."""


def wandb_api(spec_path: str | Path):
    """``wandb.Api()``, made before anything is uploaded, so that a machine without a W&B API key is told in one
    line how to log in (instead of ``wandb sync``'s exit status under a raw ``CalledProcessError``); on a terminal
    W&B itself asks for the key."""
    import wandb
    from wandb.errors import AuthenticationError, UsageError

    try:
        return wandb.Api()
    except (UsageError, AuthenticationError) as exc:
        problem = ("no W&B API key is configured" if isinstance(exc, UsageError)
                   else f"the W&B API key is not valid ({str(exc).strip().rstrip('.')})")
        raise CannotPublish(
            f"{problem}: run `wandb login` or set WANDB_API_KEY, then `{PUBLISH.format(spec=spec_path)}` again; "
            f"until then the report stays offline in {spec_path}") from None


def sync_runs(folders: list[str], spec_path: str | Path) -> None:
    """``wandb sync`` of the report's offline runs; its failure (its own message printed above) said in one line."""
    try:
        subprocess.run([sys.executable, "-m", "wandb", "sync", *folders], check=True)
    except subprocess.CalledProcessError as exc:
        raise CannotPublish(
            f"`wandb sync` of {len(folders)} offline run{'s' if len(folders) != 1 else ''} failed (exit status "
            f"{exc.returncode}; W&B's message is above) and no report was saved: fix that, then "
            f"`{PUBLISH.format(spec=spec_path)}` again") from None


def publish(spec_path: str | Path, entity: str | None = None, sync: bool = True) -> str:
    """Upload the offline runs a spec file names (``wandb sync``) and save its report; returns the report's URL."""
    data = json.loads(Path(spec_path).read_text())
    api = wandb_api(spec_path)
    folders = [f for f in data.get("offline_runs", []) if Path(f).is_dir()]
    if sync and folders:
        sync_runs(folders, spec_path)
    report = report_from_spec(data["report"])
    report.entity = entity or report.entity or api.default_entity
    report.save()
    return report.url


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m swalab.results.wandb_report",
                                     description="Publish a W&B Report that python -m swalab.results.report --wandb wrote "
                                                 "offline, or show its outline.")
    commands = parser.add_subparsers(dest="command", required=True)
    pub = commands.add_parser("publish", help="upload the report's offline runs (wandb sync) and save the report")
    pub.add_argument("spec", help=f"the {SPEC_FILE} written next to table.md")
    pub.add_argument("--entity", help="W&B entity to save the report under (default: the runs', else yours)")
    pub.add_argument("--no-sync", action="store_true", help="save the report only; the runs are uploaded already")
    show = commands.add_parser("outline", help="print the report's blocks, panels and run set filters")
    show.add_argument("spec", help=f"the {SPEC_FILE} written next to table.md")
    args = parser.parse_args(argv)
    try:
        if args.command == "outline":
            print("\n".join(outline(json.loads(Path(args.spec).read_text())["report"])))
            return 0
        url = publish(args.spec, entity=args.entity, sync=not args.no_sync)
    except (ReportUnavailable, OSError, CannotPublish) as exc:
        print(f"[swalab.results.wandb_report] {exc}", file=sys.stderr)
        return 2
    print(f"[swalab.results.wandb_report] saved {url}")
    return 0


if __name__ == "__main__":
    sys.exit(run_command(main, prog="swalab.results.wandb_report",
                         interrupted="nothing of this machine's was changed; the same command again publishes it"))
