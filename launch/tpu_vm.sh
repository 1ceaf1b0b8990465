#!/usr/bin/env bash
# Cloud TPU VM slices (v2-8 ... the v2-512 pod, v4, v5e, v5p): create, set up, run on every worker,
# collect logs, delete. Nothing is hard-coded: everything comes from the environment.
#
#   export PROJECT=my-project ZONE=us-central1-a TPU_NAME=resnet-pod ACCELERATOR_TYPE=v2-512
#   export RUNTIME_VERSION=tpu-ubuntu2204-base CONFIG=configs/pod.py WORKDIR=gs://my-bucket/runs/pod
#   launch/tpu_vm.sh create && launch/tpu_vm.sh setup && launch/tpu_vm.sh run
#   launch/tpu_vm.sh logs      # copies every worker's log to ./logs/$TPU_NAME/worker-N.log
#   launch/tpu_vm.sh delete
#
# Optional: BUCKET (gs://... where `logs` also uploads), EXTRA_ARGS (more train.py flags, e.g.
# "--config.data.data_dir=gs://my-bucket/tensorflow_datasets", where imagenet2012 is prepared, or
# "--config.training.num_train_steps=200"), SPOT=1 (a preemptible/spot slice).
set -euo pipefail

: "${PROJECT:?set PROJECT}" "${ZONE:?set ZONE}" "${TPU_NAME:?set TPU_NAME}"
REPO_DIR="$(cd "$(dirname "$0")/.." && pwd)"
REMOTE_DIR="resnet_scaling"
LOG="train.log"
gcloud_tpu() { gcloud compute tpus tpu-vm "$@" --project="$PROJECT" --zone="$ZONE"; }
on_all_workers() { gcloud_tpu ssh "$TPU_NAME" --worker=all --command="$1"; }

num_workers() {
  gcloud_tpu describe "$TPU_NAME" --format='value(networkEndpoints[].ipAddress)' | tr ';,' '\n\n' \
    | grep -c .
}

case "${1:-}" in
  create)
    : "${ACCELERATOR_TYPE:?set ACCELERATOR_TYPE (e.g. v2-512)}" "${RUNTIME_VERSION:?set RUNTIME_VERSION}"
    gcloud_tpu create "$TPU_NAME" --accelerator-type="$ACCELERATOR_TYPE" --version="$RUNTIME_VERSION" \
      ${SPOT:+--spot}
    ;;
  setup)  # the same checkout on every worker, installed with libtpu
    tarball="$(mktemp -d)/src.tar.gz"
    git -C "$REPO_DIR" ls-files -z | tar -C "$REPO_DIR" --null -T - -czf "$tarball"
    gcloud_tpu scp "$tarball" "$TPU_NAME":src.tar.gz --worker=all
    on_all_workers "mkdir -p $REMOTE_DIR && tar -xzf src.tar.gz -C $REMOTE_DIR && \
      cd $REMOTE_DIR && python3 -m pip install -q -e '.[tpu]'"
    ;;
  run)  # one process per worker; they find each other through the TPU runtime (distributed.py)
    : "${CONFIG:?set CONFIG (e.g. configs/pod.py)}" "${WORKDIR:?set WORKDIR (gs:// on multi-host slices)}"
    on_all_workers "cd $REMOTE_DIR && RESNET_SCALING_DISTRIBUTED=auto nohup python3 -m resnet_scaling.train \
      --config=$CONFIG --workdir=$WORKDIR ${EXTRA_ARGS:-} > ~/$LOG 2>&1 < /dev/null &"
    echo "Started on every worker; follow with: $0 logs (or ssh --worker=0 'tail -f ~/$LOG')"
    ;;
  logs)
    out="logs/$TPU_NAME"; mkdir -p "$out"
    for ((w = 0; w < $(num_workers); w++)); do
      gcloud_tpu scp "$TPU_NAME:~/$LOG" "$out/worker-$w.log" --worker="$w"
    done
    if [[ -n "${BUCKET:-}" ]]; then gsutil -m cp "$out"/*.log "$BUCKET/logs/$TPU_NAME/"; fi
    tail -n 5 "$out/worker-0.log"
    ;;
  stop)
    on_all_workers "pkill -f 'resnet_scaling.train' || true"
    ;;
  delete)
    gcloud_tpu delete "$TPU_NAME" --quiet
    ;;
  *)
    echo "usage: $0 create|setup|run|logs|stop|delete (settings from the environment; see the header)" >&2
    exit 2
    ;;
esac
