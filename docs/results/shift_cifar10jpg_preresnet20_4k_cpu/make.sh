#!/usr/bin/env bash
# A CPU-sized companion of shift_cifar10jpg_preresnet20_10k_val: the same pipeline (row with SWAG and FGE, a last-layer
# Laplace around each SGD run, every run scored under corruption and against two OOD sets, the report) on a row small
# enough for 2 CPU cores, so that the questions the GPU row left open (MultiSWAG under corruption, SWAG against noise,
# ROC curves) are answered on runs whose weights are all on one machine.
#
#   docs/results/shift_cifar10jpg_preresnet20_4k_cpu/make.sh [runs folder] [report folder]
#
# 4,000 training images, 1,000 held out for validation, 2,000 test images (class-stratified), B = 16 epochs, seeds 0
# and 1 (SEEDS: the third did not fit the session that made the page); five corruptions, one of each family and one
# more digital (Gaussian noise, defocus blur, fog, contrast, JPEG), at severity 5 (SEVERITIES="3 5" adds 3); SWAG
# scored with 10 samples. Each step skips what is done. Run from the repository root.
set -euo pipefail
runs=${1:-outputs/shift_4k_cpu}
out=${2:-docs/results/shift_cifar10jpg_preresnet20_4k_cpu/report}
data=${SWALAB_CIFAR10_JPG:-../shared/data/cifar10-jpg}
py=${PYTHON:-python}
seeds=${SEEDS:-0 1}
size=(dataset.root="$data" run.download=false dataset.train_size=4000 dataset.val_size=1000 dataset.test_size=2000
      logger=none paths.output_dir="$runs")

# 1. the row: SGD trunk (1 B = 16 epochs), SWAG branched to 1.5 B (SWA's columns too), FGE; the finished checkpoints
#    (SWAG's moments) and FGE's members kept, so that score can draw and score them again
$py -m swalab.results.row --dataset cifar10 --model preresnet20 --seeds $seeds --swag model.budget_epochs=16 \
  run.keep_finished_checkpoints=true model.fge.save_members=true "${size[@]}"

# 2. a last-layer Laplace around each seed's SGD run (trains nothing; prior precision on the validation split)
for seed in $seeds; do
  sgd=$(ls -d "$runs"/cifar10/preresnet20/sgd/*/seed$seed | head -1)
  $py run.py dataset=cifar10 model=preresnet20 method=laplace model.init_from="$sgd" seed=$seed "${size[@]}"
done

# 3. every run on the clean test set, the corrupted sets and two OOD sets
sets=()
for c in gaussian_noise defocus_blur fog contrast jpeg_compression; do
  for s in ${SEVERITIES:-5}; do sets+=(--data "cifar10c:$c:$s"); done
done
for run in $(ls -d "$runs"/cifar10/preresnet20/*/*/seed*); do
  $py -m swalab.results.score "$run" --data test "${sets[@]}" --ood folder:../shared/data/imagenette/val \
    --ood noise:gaussian --swag-samples 10
done

# 4. the report
$py -m swalab.results.report "$runs" --out "$out"
