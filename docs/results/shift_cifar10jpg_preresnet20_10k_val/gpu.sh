#!/usr/bin/env bash
# make.sh's pipeline in one command of a lent GPU machine (about 9 minutes on one H200), everything that can run side by
# side run so: the 75 corrupted test sets made on the CPU cores while the three seeds train at once, the Laplace fits
# at once, every run scored in its own process. Stages that would outrun the command's limit are cut at a deadline and
# what they finished is kept (score writes each test set as it goes); the report and the packing always run.
#
#   docs/results/shift_cifar10jpg_preresnet20_10k_val/gpu.sh <out folder> [deadline in seconds, default 555]
#
# Needs, in the repository's git-ignored .gpu/ (../shared/gpu/prepare-carry, then the wheels and the OOD folder that
# README.md's "On a GPU" names): the CIFAR-10 JPEG tarball, hydra's wheels, laplace-torch's and imagecorruptions'
# wheels, imagenette-val-32.tar.gz. Writes to <out>: gpu.log, seed<N>.tgz (each seed's runs without the per-set
# predictions and checkpoints), report.tgz, logs.tgz.
set -uo pipefail
out=$1
deadline=${2:-555}
mkdir -p "$out"
exec > >(tee -a "$out/gpu.log") 2>&1
export PYTHONUNBUFFERED=1 WANDB_MODE=disabled
# SMOKE=1 tries the script here on a CPU at a tiny scale (the installed environment, the data in ../shared/data)
if [ -z "${SMOKE:-}" ]; then
  python3 -m pip install -q --no-deps --no-index .gpu/wheels/*.whl && python3 -m pip install -q --no-deps \
    --no-build-isolation -e . || exit 2
  mkdir -p /tmp/data && tar xzf .gpu/cifar10-jpg.tar.gz -C /tmp/data && tar xzf .gpu/imagenette-val-32.tar.gz -C /tmp/data
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
fi
py=${PYTHON:-python3}
device=${DEVICE:-cuda}
data=${SWALAB_CIFAR10_JPG:-/tmp/data/cifar10-jpg}
ood_folder=${OOD_FOLDER:-/tmp/data/imagenette-val-32}
work=${WORK:-/tmp/shift}
read -r -a extra <<< "${EXTRA:-}"  # overrides added to every run (the smoke's tiny row)
read -r -a severities <<< "${SEVERITIES:-1 2 3 4 5}"
read -r -a corruption_names <<< "${CORRUPTIONS:-gaussian_noise shot_noise impulse_noise defocus_blur glass_blur motion_blur \
zoom_blur snow frost fog brightness contrast elastic_transform pixelate jpeg_compression}"
$py -c "import torch; from importlib.metadata import version as v; print('torch', torch.__version__, 'laplace-torch', v('laplace-torch'), 'imagecorruptions', v('imagecorruptions'))"
git log -1 --format='commit %H (the device copy'"'"'s .git; the working tree may be newer)'
stamp() { echo "[gpu.sh] $(date -u +%H:%M:%S) t=${SECONDS}s $*"; }
left() { local t=$(( deadline - SECONDS - ${1:-0} )); echo $(( t > 1 ? t : 1 )); }  # timeout 0 would mean none

runs=$work/runs
logs=$work/logs
mkdir -p "$runs" "$logs"
here=docs/results/shift_cifar10jpg_preresnet20_10k_val
row_args=(dataset.root="$data" run.download=false dataset.train_size=10000 dataset.val_size=5000 model.budget_epochs=30
          logger=none run.keep_finished_checkpoints=true model.fge.save_members=true run.progress=false
          paths.output_dir="$runs" "${extra[@]}")
swag_samples=${SWAG_SAMPLES:-10}

stamp "0. the JPEGs decoded once into the cache (every process below reads it)"
$py -c "from swalab.data.cifar import load_cifar; load_cifar('cifar10', '$data', download=False)"

stamp "1. corrupted sets (background, 12 processes); the row, three seeds at once"
$py "$here/make_corrupted.py" "$data" --workers ${WORKERS:-12} \
  --corruptions "${corruption_names[@]}" --severities "${severities[@]}" > "$logs/corrupted.log" 2>&1 &
corrupted=$!
pids=()
for seed in 0 1 2; do
  timeout "$(left 330)" $py -m swalab.results.row --dataset cifar10 --model preresnet20 --seeds $seed --swag \
    "${row_args[@]}" > "$logs/row$seed.log" 2>&1 &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p" || stamp "a row process ended with $?"; done
stamp "row done"; tail -n 12 "$logs"/row*.log

stamp "2. Laplace around each seed's SGD run, three at once"
pids=()
for seed in 0 1 2; do
  sgd=$(ls -d "$runs"/cifar10/preresnet20/sgd/*/seed$seed | head -1)
  timeout "$(left 300)" $py run.py method=laplace model.init_from="$sgd" seed=$seed dataset=cifar10 \
    model=preresnet20 dataset.root="$data" run.download=false dataset.train_size=10000 dataset.val_size=5000 \
    logger=none run.progress=false paths.output_dir="$runs" "${extra[@]}" > "$logs/laplace$seed.log" 2>&1 &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p" || stamp "a Laplace process ended with $?"; done
stamp "laplace done"; tail -n 5 "$logs"/laplace*.log

stamp "3. scoring: each run in its own process, the clean set and OOD first, then the corrupted sets"
while kill -0 "$corrupted" 2>/dev/null && [ "$(left 330)" -gt 1 ]; do sleep 2; done  # else score makes the rest
tail -n 3 "$logs/corrupted.log"
by_severity=()  # severity by severity, all 15 corruptions each: a cut leaves whole severities
for severity in "${severities[@]}"; do
  for c in "${corruption_names[@]}"; do by_severity+=(--data "cifar10c:$c:$severity"); done
done
pids=()
for run in $(ls -d "$runs"/cifar10/preresnet20/*/*/seed*); do
  name=$(echo "$run" | sed "s|$runs/||; s|/|_|g")
  ( timeout "$(left 150)" $py -m swalab.results.score "$run" --data test --ood folder:"$ood_folder" \
      --ood noise:gaussian --swag-samples "$swag_samples" --device "$device"
    timeout "$(left 150)" $py -m swalab.results.score "$run" "${by_severity[@]}" --swag-samples "$swag_samples" \
      --device "$device" ) > "$logs/score_$name.log" 2>&1 &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; done
stamp "scoring done or cut"; for f in "$logs"/score_*.log; do echo "$f: $(grep -c ' images):' "$f") sets"; done

stamp "4. the report"
timeout "$(left 25)" $py -m swalab.results.report "$runs" --out "$work/report" > "$logs/report.log" 2>&1 \
  || stamp "report ended with $?"
tail -n 40 "$logs/report.log"

stamp "5. packing"
tar czf "$out/report.tgz" -C "$work" report
for seed in 0 1 2; do
  (cd "$runs" && find . -path "*/seed$seed" -type d | sed 's|^\./||' > "$work/seed$seed.list")
  tar czf "$out/seed$seed.tgz" -C "$runs" --exclude=checkpoints --exclude='scores/*/predictions.pt' \
    --exclude='scores/*/per_image_scores.pt' -T "$work/seed$seed.list" rows
  if [ "$(stat -c %s "$out/seed$seed.tgz")" -gt 16000000 ]; then  # over what comes back: the runs' predictions too
    tar czf "$out/seed$seed.tgz" -C "$runs" --exclude=checkpoints --exclude='*predictions.pt' \
      --exclude='*per_image_scores.pt' --exclude=fge_member_probs.pt -T "$work/seed$seed.list" rows
  fi
done
tar czf "$out/logs.tgz" -C "$work" logs
ls -la "$out"
stamp "end"
