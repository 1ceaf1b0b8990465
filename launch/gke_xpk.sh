#!/usr/bin/env bash
# TPU slices on GKE through xpk (https://github.com/AI-Hypercomputer/xpk): one container per TPU host,
# each running the same command; GKE sets TPU_WORKER_HOSTNAMES, which distributed.py reads.
#
#   export PROJECT=my-project ZONE=us-east5-a CLUSTER=my-cluster TPU_TYPE=v5p-128
#   export WORKLOAD=resnet-v5p CONFIG=configs/tpu_v5p_128.py WORKDIR=gs://my-bucket/runs/v5p
#   launch/gke_xpk.sh cluster   # once: create the cluster (or use an existing one)
#   launch/gke_xpk.sh run       # build an image from this checkout and start the workload
#   launch/gke_xpk.sh list | logs | delete
#
# Optional: NUM_SLICES (default 1), BASE_IMAGE (default python:3.11-slim), EXTRA_ARGS.
set -euo pipefail

: "${PROJECT:?set PROJECT}" "${ZONE:?set ZONE}" "${CLUSTER:?set CLUSTER}"
REPO_DIR="$(cd "$(dirname "$0")/.." && pwd)"
common=(--cluster="$CLUSTER" --project="$PROJECT" --zone="$ZONE")

case "${1:-}" in
  cluster)
    : "${TPU_TYPE:?set TPU_TYPE (e.g. v5p-128)}"
    xpk cluster create "${common[@]}" --tpu-type="$TPU_TYPE" --num-slices="${NUM_SLICES:-1}"
    ;;
  run)
    : "${TPU_TYPE:?}" "${WORKLOAD:?set WORKLOAD}" "${CONFIG:?set CONFIG}" "${WORKDIR:?set WORKDIR (gs://)}"
    # xpk copies the script directory into an image built on BASE_IMAGE.
    cd "$REPO_DIR"
    xpk workload create "${common[@]}" --workload="$WORKLOAD" --tpu-type="$TPU_TYPE" \
      --num-slices="${NUM_SLICES:-1}" --base-docker-image="${BASE_IMAGE:-python:3.11-slim}" \
      --script-dir="$REPO_DIR" \
      --command="pip install -q -e '.[tpu]' && python3 -m resnet_scaling.train --config=$CONFIG \
--workdir=$WORKDIR ${EXTRA_ARGS:-}"
    ;;
  list)
    xpk workload list "${common[@]}"
    ;;
  logs)  # the first pod's log; GKE keeps all of them in Cloud Logging
    : "${WORKLOAD:?set WORKLOAD}"
    kubectl logs -f "$(kubectl get pods -o name | grep "$WORKLOAD" | head -n 1)"
    ;;
  delete)
    : "${WORKLOAD:?set WORKLOAD}"
    xpk workload delete "${common[@]}" --workload="$WORKLOAD"
    ;;
  *)
    echo "usage: $0 cluster|run|list|logs|delete (settings from the environment; see the header)" >&2
    exit 2
    ;;
esac
