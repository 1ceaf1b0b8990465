#!/usr/bin/env bash
# Cloud TPU VM slices (v2-8 ... the v2-512 pod, v3, v4, v5e, v5p, v6e): create, set up, run on every worker,
# collect logs, stop, delete. Nothing is hard-coded: everything comes from the environment.
#
#   export PROJECT=my-project ZONE=us-central1-a TPU_NAME=resnet-pod ACCELERATOR_TYPE=v2-512
#   export CONFIG=configs/pod.py WORKDIR=gs://my-bucket/runs/pod
#   launch/tpu_vm.sh create && launch/tpu_vm.sh setup && launch/tpu_vm.sh run
#   launch/tpu_vm.sh run --config.training.num_train_steps=200   # more train.py flags, one per argument
#   launch/tpu_vm.sh logs      # copies every worker's log to ./logs/$TPU_NAME/worker-N.log
#   launch/tpu_vm.sh stop      # SIGTERM to the training process `run` recorded on each worker
#   launch/tpu_vm.sh delete
#
# Optional: RUNTIME_VERSION (default: the TPU software version Google lists for ACCELERATOR_TYPE's
# generation), SPOT=1 (a spot slice), PYTHON_VERSION (default 3.11: the images ship 3.10, so `setup`
# installs this one with uv), BUCKET (gs://... where `logs` also uploads), STOP_TIMEOUT_SEC (default 180:
# how long `stop` waits for the checkpoint and exit before SIGKILL), EXTRA_ARGS (more train.py flags split
# at whitespace, without quote handling; a value with spaces goes in an argument after `run`).
# Values are data, not code: CONFIG, WORKDIR and every flag reach train.py as one argument each on every
# worker (quoted with printf %q for the worker's bash, the login shell of the TPU VM images).
set -euo pipefail

: "${PROJECT:?set PROJECT}" "${ZONE:?set ZONE}" "${TPU_NAME:?set TPU_NAME}"
REPO_DIR="$(cd "$(dirname "$0")/.." && pwd)"
REMOTE_DIR="resnet_scaling"  # on each worker, under the home directory; the venv is $REMOTE_DIR/.venv
LOG="train.log"
PID_FILE="resnet_scaling_train.pid"  # written by `run`, read by `stop`, in the home directory
gcloud_tpu() { gcloud compute tpus tpu-vm "$@" --project="$PROJECT" --zone="$ZONE"; }
on_all_workers() { gcloud_tpu ssh "$TPU_NAME" --worker=all --command="$1"; }
die() { echo "error: $*" >&2; exit 2; }

runtime_version_for() {  # the TPU software version for PyTorch and JAX, per generation (launch/README.md)
  case "$1" in
    v2-* | v3-* | v4-*) echo "tpu-ubuntu2204-base" ;;
    v5litepod-*) echo "v2-alpha-tpuv5-lite" ;;  # v5e
    v5p-*) echo "v2-alpha-tpuv5" ;;
    v6e-*) echo "v2-alpha-tpuv6e" ;;
    *) die "no default runtime version for ACCELERATOR_TYPE=$1: set RUNTIME_VERSION (list them with" \
      "gcloud compute tpus tpu-vm versions list --zone=$ZONE)" ;;
  esac
}

num_workers() {
  gcloud_tpu describe "$TPU_NAME" --format='value(networkEndpoints[].ipAddress)' | sed 's/[;,]/\n/g' \
    | grep -c .
}

setup_script() {  # runs on each worker: unpack, Python >= 3.11 through uv, a venv, the package with libtpu
  printf 'remote_dir=%q python_version=%q\n' "$REMOTE_DIR" "${PYTHON_VERSION:-3.11}"
  cat <<'EOF'
set -e
mkdir -p "$remote_dir" && tar -xzf src.tar.gz -C "$remote_dir" && cd "$remote_dir"
export PATH="$HOME/.local/bin:$PATH"
command -v uv > /dev/null || python3 -m pip install --user -q uv \
  || curl -LsSf https://astral.sh/uv/install.sh | sh
[ -x .venv/bin/python ] || uv venv --python "$python_version" .venv
uv pip install --python .venv/bin/python -q -e '.[tpu]'
.venv/bin/python -c 'import jax, sys; print(sys.version.split()[0], "jax", jax.__version__)'
EOF
}

stop_script() {  # runs on each worker: SIGTERM to the recorded pid if it is still our trainer, then wait
  printf 'pid_file=~/%q stop_timeout_sec=%q\n' "$PID_FILE" "$1"
  cat <<'EOF'
running() { kill -0 "$1" 2> /dev/null && ! grep -q '^State:[[:space:]]*Z' "/proc/$1/status"; }
if [ ! -f "$pid_file" ]; then echo "$(hostname): no $pid_file, nothing to stop"; exit 0; fi
pid=$(cat "$pid_file")
if running "$pid" && grep -qa resnet_scaling.train "/proc/$pid/cmdline"; then
  kill -TERM "$pid"  # the trainer saves a checkpoint at a step every process reaches, then exits
  for ((i = 0; i < stop_timeout_sec; i++)); do running "$pid" || break; sleep 1; done
  if running "$pid"; then
    kill -KILL "$pid" && echo "$(hostname): killed $pid after ${stop_timeout_sec} s"
  else
    echo "$(hostname): stopped $pid"
  fi
else
  echo "$(hostname): process $pid is not running (or is no longer the trainer)"
fi
rm -f "$pid_file"
EOF
}

case "${1:-}" in
  create)
    : "${ACCELERATOR_TYPE:?set ACCELERATOR_TYPE (e.g. v2-512, v4-32, v5litepod-16, v5p-128, v6e-64)}"
    version="${RUNTIME_VERSION:-$(runtime_version_for "$ACCELERATOR_TYPE")}"
    spot=()
    if [[ -n "${SPOT:-}" ]]; then spot=(--spot); fi
    gcloud_tpu create "$TPU_NAME" --accelerator-type="$ACCELERATOR_TYPE" --version="$version" \
      ${spot[@]+"${spot[@]}"}
    ;;
  setup)  # the same checkout on every worker, in a Python 3.11 venv with libtpu
    tarball="$(mktemp -d)/src.tar.gz"
    git -C "$REPO_DIR" ls-files -z | tar -C "$REPO_DIR" --null -T - -czf "$tarball"
    gcloud_tpu scp "$tarball" "$TPU_NAME":src.tar.gz --worker=all
    on_all_workers "$(setup_script)"
    ;;
  run)  # one process per worker; they find each other through the TPU runtime (resnet_scaling/job/distributed.py)
    : "${CONFIG:?set CONFIG (e.g. configs/pod.py)}" "${WORKDIR:?set WORKDIR (gs:// on multi-host slices)}"
    shift
    if [[ "${1:-}" == "--" ]]; then shift; fi
    read -r -a extra <<< "${EXTRA_ARGS:-}"
    train=(.venv/bin/python -m resnet_scaling.train "--config=$CONFIG" "--workdir=$WORKDIR"
      ${extra[@]+"${extra[@]}"} "$@")
    # $! is the trainer itself (nohup execs it): `stop` signals that pid, not every process with that name.
    on_all_workers "cd $REMOTE_DIR || exit 1
RESNET_SCALING_DISTRIBUTED=auto nohup$(printf ' %q' "${train[@]}") > ~/$LOG 2>&1 < /dev/null &
echo \$! > ~/$PID_FILE"
    echo "Started on every worker; follow with: $0 logs (or ssh --worker=0 'tail -f ~/$LOG')"
    ;;
  logs)
    out="logs/$TPU_NAME"
    mkdir -p "$out"
    n="$(num_workers)"
    for ((w = 0; w < n; w++)); do
      gcloud_tpu scp "$TPU_NAME:~/$LOG" "$out/worker-$w.log" --worker="$w"
    done
    if [[ -n "${BUCKET:-}" ]]; then gsutil -m cp "$out"/*.log "$BUCKET/logs/$TPU_NAME/"; fi
    tail -n 5 "$out/worker-0.log"
    ;;
  stop)
    timeout_sec="${STOP_TIMEOUT_SEC:-180}"
    [[ "$timeout_sec" =~ ^[0-9]+$ ]] || die "STOP_TIMEOUT_SEC must be a whole number of seconds"
    on_all_workers "$(stop_script "$timeout_sec")"
    ;;
  delete)
    gcloud_tpu delete "$TPU_NAME" --quiet
    ;;
  *)
    echo "usage: $0 create|setup|run [TRAIN_FLAG...]|logs|stop|delete (settings from the environment;" \
      "see the header)" >&2
    exit 2
    ;;
esac
