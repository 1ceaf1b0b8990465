#!/usr/bin/env bash
# TPU slices on GKE through xpk (https://github.com/AI-Hypercomputer/xpk): one container per TPU host,
# each running the same command; GKE sets TPU_WORKER_HOSTNAMES, which
# resnet_scaling/job/distributed.py reads.
#
#   export PROJECT=my-project ZONE=us-east5-a CLUSTER=my-cluster TPU_TYPE=v5p-128 CAPACITY=on-demand
#   export WORKLOAD=resnet-v5p CONFIG=configs/tpu_v5p_128.py WORKDIR=gs://my-bucket/runs/v5p
#   launch/gke_xpk.sh cluster   # once: create the cluster (or use an existing one)
#   launch/gke_xpk.sh run       # build an image from this checkout and start the workload
#   launch/gke_xpk.sh run --config.training.num_train_steps=200   # more train.py flags, one per argument
#   launch/gke_xpk.sh list | logs | delete
#
# CAPACITY (required by `cluster`): how the TPUs are obtained, one of on-demand, spot, flex (DWS flex-start,
# queued) or reservation (then RESERVATION=the reservation's name).
# Optional: NUM_SLICES (default 1), BASE_IMAGE (default python:3.11-slim), MAX_RESTARTS (default 10: times
# the workload is restarted after a failure or preemption; each restart resumes from WORKDIR's checkpoint),
# EXTRA_ARGS (more train.py flags split at whitespace, without quote handling; a value with spaces goes in
# an argument after `run`).
# Values are data, not code: CONFIG, WORKDIR and every flag reach train.py as one argument each (quoted
# with printf %q for the container's bash).
set -euo pipefail

: "${PROJECT:?set PROJECT}" "${ZONE:?set ZONE}" "${CLUSTER:?set CLUSTER}"
REPO_DIR="$(cd "$(dirname "$0")/.." && pwd)"
common=(--cluster="$CLUSTER" --project="$PROJECT" --zone="$ZONE")
die() { echo "error: $*" >&2; exit 2; }

capacity_flag() {  # xpk cluster create needs exactly one capacity flag
  case "${CAPACITY:-}" in
    on-demand | spot | flex) echo "--$CAPACITY" ;;
    reservation) echo "--reservation=${RESERVATION:?set RESERVATION to the name of the reservation}" ;;
    *) die "set CAPACITY to how the cluster gets its TPUs: on-demand, spot, flex or reservation (with" \
      "RESERVATION=NAME); xpk cluster create needs one of --on-demand, --spot, --flex, --reservation" ;;
  esac
}

case "${1:-}" in
  cluster)
    : "${TPU_TYPE:?set TPU_TYPE (e.g. v5p-128)}"
    capacity="$(capacity_flag)"
    xpk cluster create "${common[@]}" --tpu-type="$TPU_TYPE" --num-slices="${NUM_SLICES:-1}" "$capacity"
    ;;
  run)
    : "${TPU_TYPE:?set TPU_TYPE}" "${WORKLOAD:?set WORKLOAD}" "${CONFIG:?set CONFIG}" \
      "${WORKDIR:?set WORKDIR (gs://)}"
    max_restarts="${MAX_RESTARTS:-10}"
    [[ "$max_restarts" =~ ^[0-9]+$ ]] || die "MAX_RESTARTS must be a whole number"
    shift
    if [[ "${1:-}" == "--" ]]; then shift; fi
    read -r -a extra <<< "${EXTRA_ARGS:-}"
    train=(python3 -m resnet_scaling.train "--config=$CONFIG" "--workdir=$WORKDIR"
      ${extra[@]+"${extra[@]}"} "$@")
    flex=()
    if [[ "${CAPACITY:-}" == "flex" ]]; then flex=(--flex); fi  # flex-start capacity is queued per workload
    # xpk copies the script directory into an image built on BASE_IMAGE and runs --command with bash.
    cd "$REPO_DIR"
    xpk workload create "${common[@]}" --workload="$WORKLOAD" --tpu-type="$TPU_TYPE" \
      --num-slices="${NUM_SLICES:-1}" --base-docker-image="${BASE_IMAGE:-python:3.11-slim}" \
      --script-dir="$REPO_DIR" --max-restarts="$max_restarts" ${flex[@]+"${flex[@]}"} \
      --command="pip install -q -e '.[tpu]' &&$(printf ' %q' "${train[@]}")"
    ;;
  list)
    xpk workload list "${common[@]}"
    ;;
  logs)  # the first pod's log; GKE keeps all of them in Cloud Logging
    : "${WORKLOAD:?set WORKLOAD}"
    kubectl logs -f "$(kubectl get pods -o name | grep -F "$WORKLOAD" | head -n 1)"
    ;;
  delete)
    : "${WORKLOAD:?set WORKLOAD}"
    xpk workload delete "${common[@]}" --workload="$WORKLOAD"
    ;;
  *)
    echo "usage: $0 cluster|run [TRAIN_FLAG...]|list|logs|delete (settings from the environment; see the" \
      "header)" >&2
    exit 2
    ;;
esac
