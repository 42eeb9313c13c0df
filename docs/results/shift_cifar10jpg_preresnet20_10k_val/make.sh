#!/usr/bin/env bash
# Issue 43's evidence: the three-seed CIFAR-10 10k row with a validation split (docs/results/cifar10jpg_preresnet20_10k_val's
# recipe) trained again keeping what re-scoring needs, then every predictor scored under corruption and OOD, with a
# last-layer Laplace on each seed's SGD run beside them.
#
#   docs/results/shift_cifar10jpg_preresnet20_10k_val/make.sh [runs folder] [score options...]
#
# Runs go to $1 (default outputs/shift_10k_val), the report to $2 (default: this folder's report/). SCORE_DATA (default:
# cifar10c:all) and SWAG_SAMPLES (default: the run's 30) set how much is scored; SEEDS (default 0 1 2) and EXTRA
# (overrides added to every run, e.g. a smaller row to try the script: EXTRA="dataset.train_size=300 ...") are for
# trying it. Each step skips what is done (the row and run.py skip finished runs; score rewrites its own records), so
# the script can be stopped and started again. Run from the repository root.
set -euo pipefail
runs=${1:-outputs/shift_10k_val}
out=${2:-docs/results/shift_cifar10jpg_preresnet20_10k_val/report}
seeds=${SEEDS:-0 1 2}
read -r -a extra <<< "${EXTRA:-}"
data=${SWALAB_CIFAR10_JPG:-../shared/data/cifar10-jpg}
common=(dataset=cifar10 model=preresnet20 dataset.root="$data" run.download=false dataset.train_size=10000
        dataset.val_size=5000 logger=none paths.output_dir="$runs" "${extra[@]}")
py=${PYTHON:-python}

# 1. the row: SGD trunk (1 B = 30 epochs), SWAG branched at epoch 24 to 1.5 B (SWA columns too), FGE; keep the
#    finished checkpoints (SWAG's moments are in its last one: score draws its samples again from there) and FGE's
#    members (score needs their weights)
$py -m swalab.results.row --dataset cifar10 --model preresnet20 --seeds $seeds --swag dataset.root="$data" \
  run.download=false dataset.train_size=10000 dataset.val_size=5000 model.budget_epochs=30 logger=none \
  run.keep_finished_checkpoints=true model.fge.save_members=true paths.output_dir="$runs" "${extra[@]}"

# 2. a last-layer Laplace around each seed's SGD run (trains nothing; prior precision on the validation split)
for seed in $seeds; do
  sgd=$(ls -d "$runs"/cifar10/preresnet20/sgd/*/seed$seed | head -1)
  $py run.py method=laplace model.init_from="$sgd" seed=$seed "${common[@]}"
done

# 3. every run under corruption and against two OOD sets
score_data=${SCORE_DATA:-cifar10c:all}
swag=()
[ -n "${SWAG_SAMPLES:-}" ] && swag=(--swag-samples "$SWAG_SAMPLES")
for run in $(ls -d "$runs"/cifar10/preresnet20/*/*/seed*); do
  $py -m swalab.results.score "$run" --data test --data "$score_data" --ood folder:../shared/data/imagenette/val \
    --ood noise:gaussian "${swag[@]}"
done

# 4. the report
$py -m swalab.results.report "$runs" --out "$out"
