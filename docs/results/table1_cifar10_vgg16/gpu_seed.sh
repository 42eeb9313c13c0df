#!/usr/bin/env bash
# One seed of the paper's Table 1 CIFAR-10 VGG-16 row on a GPU, packed small enough to carry back and commit.
#
#   docs/results/table1_cifar10_vgg16/gpu_seed.sh <seed> <data folder> <packed output folder>
#
# Trains the row with the paper's recipe unchanged (B = 200; SWA branched off the SGD trunk at epoch 160, averaging from 161, scored at
# 1, 1.25 and 1.5 B; FGE branched at 0.8 B), on all 50,000 training images of the JPEG copy, in
# /tmp/table1 (override with SWALAB_TABLE1_RUNS). Checkpoints go every 25 epochs (run.checkpoint_every: how a run
# runs, not what it computes; the branch points are kept for good by the row itself). About 6.5 minutes on an H200
# (seed 0's SGD trunk: 0.8 s an epoch). Then every run directory of the seed is packed without its checkpoints and
# final.pt (weights: VGG-16's are 60 MB each) into <packed output folder>/seed<seed>.tgz: metrics, history,
# predictions, reliability, environment.json (the GPU named), config and identity remain.
# It needs the whole JPEG copy (../shared/gpu/prepare-carry's 20 MB tarball). Since the fifth seed was committed the
# tree and the tarball together exceed the 64 MiB a device call carries: move the five seed tarballs (44 MB) out of
# the working tree for that call and back afterwards (not yet tried that way).
set -uo pipefail
seed=${1:?seed}; data=${2:?data folder}; out=${3:?output folder}
runs=${SWALAB_TABLE1_RUNS:-/tmp/table1}
mkdir -p "$out" "$runs"
cd "$(dirname "$0")/../../.."
start=$SECONDS
python3 -m swalab.results.row --dataset cifar10 --model vgg16 --seeds "$seed" dataset.root="$data" run.download=false \
  logger=none paths.output_dir="$runs" run.checkpoint_every=25 > "$out/seed${seed}_row.log" 2>&1
rc=$?
echo "[gpu_seed] row exit $rc after $((SECONDS - start)) s" | tee -a "$out/seed${seed}_row.log"
tar czf "$out/seed${seed}.tgz" --exclude=checkpoints --exclude=final.pt -C "$runs" .
ls -la "$out"
exit $rc
