"""The post-hoc table of this page: every average `python -m swalab.posthoc` wrote under the SWA run, and the online
SGD, SWA and EMA of the three runs, with their validation and test scores, as posthoc.csv and posthoc.json beside
this file and a markdown table on stdout.

    python docs/results/posthoc_cifar10jpg_preresnet20_10k/table.py <swa run> <ema run> <sgd run> [--out <folder>]

``--out``: where posthoc.csv and posthoc.json go instead (the B = 30 page, posthoc_cifar10jpg_preresnet20_10k_b30,
uses this script so).
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
COLUMNS = ["predictor", "kind", "val_acc", "val_nll", "acc", "nll", "ece", "brier", "nll_ts"]


def row(name: str, kind: str, m: dict, ts: dict | None) -> dict:
    val = m.get("val", {})
    return {"predictor": name, "kind": kind, "val_acc": val.get("acc"), "val_nll": val.get("nll"), "acc": m["acc"],
            "nll": m["nll"], "ece": m["ece"], "brier": m["brier"], "nll_ts": (ts or {}).get("nll")}


def rows(swa: Path, ema: Path, sgd: Path) -> list[dict]:
    out = []
    for run, name in ((sgd, "sgd"), (swa, "swa"), (ema, "ema")):
        metrics = json.loads((run / "metrics.json").read_text())
        out.append(row(name, "online", metrics[name], metrics.get(f"{name}+ts")))
    for path in sorted((swa / "posthoc").glob("*/metrics.json")):
        metrics = json.loads(path.read_text())
        label = next(k for k in metrics if not k.endswith("+ts"))
        out.append(row(label, "post-hoc", metrics[label], metrics.get(f"{label}+ts")))
    return out


def shown(column: str, v) -> str:
    return "" if v is None else f"{v:.2f}" if column.endswith("acc") else f"{v:.4f}"


def main(argv: list[str]) -> None:
    out = HERE
    if "--out" in argv:
        at = argv.index("--out")
        out, argv = Path(argv[at + 1]), argv[:at] + argv[at + 2:]
    table = rows(*(Path(a) for a in argv))
    (out / "posthoc.json").write_text(json.dumps(table, indent=1) + "\n")
    with open(out / "posthoc.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(table)
    print("| " + " | ".join(COLUMNS) + " |\n|" + "---|" * len(COLUMNS))
    for r in table:
        print("| " + " | ".join(r[c] if isinstance(r[c], str) else shown(c, r[c]) for c in COLUMNS) + " |")


if __name__ == "__main__":
    main(sys.argv[1:])
