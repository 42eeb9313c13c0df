#!/usr/bin/env bash
# The first thing to run when a GPU is there: the GPU tests, then each GPU benchmark, every result into one folder
# to commit. About 7 to 9 minutes on one H100 or H200 (272 s on an H200 before the compiled variants were added);
# each stage has its own time limit, so a stage that hangs costs its limit and the next stage still runs.
#
#   bench/gpu_suite.sh [results folder]     (default: bench/results/gpu_suite)
#
# Run from the repository root with swalab installed (pip install -e .); SWALAB_CIFAR10_JPG names the CIFAR-10
# JPEG folder the data benchmarks read (throughput.py, method_overheads.py; default ../shared/data/cifar10-jpg).
# PYTHON picks the interpreter (default python3); STAGES="tests gpu_step_wrn28_10" runs only the stages it names
# (a short window: the compiled WRN-28-10 variants and the tests, about 3 minutes). The folder receives suite.log (versions, device, every stage's
# output and exit code), pytest_gpu.txt and the JSON results; its JSONs are copied into bench/results/ afterwards
# by whoever commits them.
#
# On a lent GPU machine the repository travels with what the call carries, 64 MiB in all. The tracked tree is about
# 54 MB (Table 1's seed tarballs are 44 MB of it), so the whole CIFAR-10 JPEG tarball (20 MB) no longer fits beside
# it. The suite's data stages read at most 3,840 training images, so on 2026-11-28 the call carried hydra's wheels
# and a 6,000-image part of the training split (the first 600 files of each class) with the whole test split,
# 5.7 MB, in .gpu2/ (ignored through .git/info/exclude), with carry [".gpu2"]:
#   python3 -m pip install -q --no-deps --no-index .gpu2/wheels/*.whl && python3 -m pip install -q --no-deps \
#     --no-build-isolation -e . && mkdir -p /tmp/data && tar xzf .gpu2/cifar-sub.tgz -C /tmp/data \
#     && SWALAB_CIFAR10_JPG=/tmp/data/cifar10-jpg bench/gpu_suite.sh $OUT/suite
# Writing into $OUT directly keeps what finished when a call runs out of time. ../shared/gpu/prepare-carry stages
# the wheels and the whole tarball in .gpu/; the part was cut from it with `ls | sort | tail -n +601 | xargs rm`
# in each class folder of train/.
set -uo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-python3}
out=${1:-bench/results/gpu_suite}
data=${SWALAB_CIFAR10_JPG:-../shared/data/cifar10-jpg}
mkdir -p "$out"
log="$out/suite.log"
export PYTHONUNBUFFERED=1 WANDB_MODE=${WANDB_MODE:-disabled}
: > "$log"
say() { echo "[gpu_suite $(date -u +%H:%M:%S)] $*" | tee -a "$log"; }

# stage <name> <seconds> <command...>: run it under its limit, its output into the log, its JSONs into $out
stage() {
  local name=$1 limit=$2; shift 2
  if [ -n "${STAGES:-}" ] && [[ " $STAGES " != *" $name "* ]]; then say "stage $name: skipped (STAGES)"; return; fi
  local stamp; stamp=$(mktemp); local t0=$SECONDS
  say "stage $name (limit ${limit}s): $*"
  timeout --kill-after=10 "$limit" "$@" >> "$log" 2>&1
  local rc=$?
  find bench/results -maxdepth 1 -name '*.json' -newer "$stamp" -exec cp {} "$out/" \;
  rm -f "$stamp"
  say "stage $name: exit $rc after $((SECONDS - t0))s"
}

say "commit $(git rev-parse --short HEAD 2>/dev/null) dirty=$(git status --porcelain --untracked-files=no 2>/dev/null | wc -l)"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >> "$log" 2>&1
$py -c "import torch, torchvision; print('torch', torch.__version__, 'torchvision', torchvision.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0))" >> "$log" 2>&1

# 1. the GPU tests (bit-equal graphed and eager runs, no host sync, resumes) and the CPU-side graph tests
stage tests 240 $py -m pytest -m gpu -q -rA -p no:cacheprovider tests/test_gpu.py tests/test_graphed.py \
  --junitxml="$out/pytest_gpu.xml"
# 2. eager against graphed per precision, beside the reference with cudnn.benchmark; VGG-16's real epochs
stage gpu_step_vgg16 90 $py bench/gpu_step.py --device cuda --models vgg16 --rounds 3 --full-epochs 2 --out-dir "$out"
stage gpu_step_preresnet164 90 $py bench/gpu_step.py --device cuda --models preresnet164 --rounds 3 --out-dir "$out"
# WRN-28-10 is compute-bound, not launch-bound: also time it under run.compile (fused BN/ReLU; eager, graphed by
# swalab, and compile's own reduce-overhead graphs), the open 3x target
stage gpu_step_wrn28_10 320 $py bench/gpu_step.py --device cuda --models wrn28_10 --rounds 3 --compile --out-dir "$out"
# WRN-28-10's graphed compiled step with kernels chosen by timing: inductor's, and cuDNN's under run.deterministic=false
# (the 3x target is 2.4% away from the default-mode compiled and graphed step). Autotuning takes minutes, so this
# stage runs only when STAGES names it:
#   STAGES="gpu_step_wrn28_10_autotune" bench/gpu_suite.sh <folder>
[[ " ${STAGES:-} " == *" gpu_step_wrn28_10_autotune "* ]] && stage gpu_step_wrn28_10_autotune 540 $py bench/gpu_step.py \
  --device cuda --models wrn28_10 --rounds 3 --compile --autotune --out-dir "$out/autotune"
# 3. the methods' overheads on the trainer's own paths (EMA: EmaTensors), as fractions of a graphed epoch
stage method_overheads 80 $py bench/method_overheads.py --device cuda --model wrn28_10 --data "$data" --steps 20 \
  --warmup 5 --bn-batches 40 --test-images 10000 --ema-updates 100 --rounds 3
# 4. the whole pipeline (JPEG data, the trainer's loader) against the reference's DataLoader with cudnn.benchmark
for model in preresnet164 wrn28_10; do
  stage "throughput_$model" 60 $py bench/throughput.py --device cuda --model "$model" --data "$data" --images 3840 \
    --batch-size 128 --workers 4 --warmup 5 --rounds 3
done
say "done; results in $out"
