"""The WiSE-FT table and figure of this page: the pretrained weights and the fine-tune as their runs scored them, and
every ``wiseft<alpha>`` and ``wiseft<alpha>[bn-interp]`` that `python -m swalab.posthoc` wrote under the fine-tune,
with validation and test scores, as wiseft.csv and wiseft.json beside this file and a markdown table on stdout; and
both curves in one figure, wiseft.png/.pdf, drawn by the command's own plotting code (``swalab.posthoc.figure``) from
the metrics the two commands wrote, nothing scored again (each command drew its own family alone).

    python docs/results/wiseft_lite0_imagenette/table.py <sgd run> <pretrained run> [--out DIR]

``--out``: where the files go (default: beside this file); the figure's title names the runs' test and validation
sizes, read from their ``data.json``.
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

from swalab.posthoc import Result, select
from swalab.posthoc.__main__ import online_of
from swalab.posthoc.figure import plot

HERE = Path(__file__).resolve().parent
COLUMNS = ["predictor", "kind", "val_acc", "val_nll", "acc", "top5", "nll", "ece", "brier", "nll_ts", "ece_ts"]


def row(name: str, kind: str, m: dict, ts: dict | None) -> dict:
    val = m.get("val", {})
    ts = ts or {}
    return {"predictor": name, "kind": kind, "val_acc": val.get("acc"), "val_nll": val.get("nll"), "acc": m["acc"],
            "top5": m.get("top5"), "nll": m["nll"], "ece": m["ece"], "brier": m["brier"], "nll_ts": ts.get("nll"),
            "ece_ts": ts.get("ece")}


def results_of(sgd: Path) -> list[Result]:
    """The WiSE-FT results written under the fine-tune, as the command's :class:`swalab.posthoc.Result`, in order of
    family (BN recomputed first) and alpha."""
    out = []
    for path in (sgd / "posthoc").glob("wiseft*/metrics.json"):
        metrics = json.loads(path.read_text())
        label = next(k for k in metrics if not k.endswith("+ts"))
        alpha = float(label.removeprefix("wiseft").removesuffix("[bn-interp]"))
        out.append(Result(label, metrics[label]["posthoc"], alpha, sgd, metrics, metrics[label]["built_from"],
                          path.parent))
    return sorted(out, key=lambda r: (r.family != "wiseft", r.knob))


def rows(sgd: Path, pretrained: Path) -> list[dict]:
    out = []
    for run, name in ((pretrained, "pretrained"), (sgd, "sgd")):
        metrics = json.loads((run / "metrics.json").read_text())
        out.append(row(name, "online", metrics[name], metrics.get(f"{name}+ts")))
    for r in results_of(sgd):
        kind = f"post-hoc, BN {r.metrics[r.label].get('bn', 'recomputed')}"  # written before metrics.json said
        out.append(row(r.label, kind, r.metrics[r.label], r.metrics.get(f"{r.label}+ts")))
    return out


def shown(column: str, v) -> str:
    return "" if v is None else f"{v:.2f}" if column.endswith(("acc", "top5")) else f"{v:.4f}"


def sizes_of(run: Path) -> str:
    """"test 3925, val 200 images": the sizes the run scored on, from its data.json."""
    data = json.loads((run / "data.json").read_text())
    return f"test {data['test_images']}, val {data['val_images']} images"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sgd", type=Path, help="the fine-tune's run directory (its posthoc/wiseft* are read)")
    parser.add_argument("pretrained", type=Path, help="the method=pretrained run on the same data")
    parser.add_argument("--out", type=Path, default=HERE, help="folder for wiseft.csv/.json/.png/.pdf")
    args = parser.parse_args(argv)
    sgd, pretrained, out = args.sgd, args.pretrained, args.out
    out.mkdir(parents=True, exist_ok=True)
    results = results_of(sgd)
    chosen = select(results, "nll")
    for (_, family), best in chosen.items():
        print(f"chosen on validation NLL ({family}): {best.label}")
    plot(results, online_of([str(sgd), str(pretrained)]), out / "wiseft.png",
         title=f"WiSE-FT, tf_efficientnet_lite0 fine-tuned on imagenette (1000-way; {sizes_of(sgd)})",
         chosen=[best.label for best in chosen.values()])
    table = rows(sgd, pretrained)
    (out / "wiseft.json").write_text(json.dumps(table, indent=1) + "\n")
    with open(out / "wiseft.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(table)
    print("| " + " | ".join(COLUMNS) + " |\n|" + "---|" * len(COLUMNS))
    for r in table:
        print("| " + " | ".join(r[c] if isinstance(r[c], str) else shown(c, r[c]) for c in COLUMNS) + " |")


if __name__ == "__main__":
    main()
