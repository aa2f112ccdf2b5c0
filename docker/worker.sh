#!/bin/sh
# One rank of the docker-compose job: eth1 is this worker's link to the switch (its port
# RANK+1), eth0 the control network (controller, torchrun rendezvous and gloo).
# The controller serves TLS: every rank verifies it with the CA of the credentials volume, and
# rank 0, which creates the job, alone uses the (tenant) operator credential. The job token
# goes through a file of the shared volume, never a command line.
# Usage: worker.sh RANK WORLD
set -eu
RANK=$1
WORLD=$2
ip route add 10.0.0.0/16 dev eth1 2>/dev/null || true    # the service address and peers: via the switch
python -c 'from homagg.lab.rawsock import disable_offloads; disable_offloads("eth1")'
while [ ! -s /credentials/controller.toml ]; do sleep 0.5; done    # the controller's secrets are made
export HOMAGG_CA_FILE=/credentials/ca.crt
if [ "$RANK" = 0 ]; then
  # retried (for a minute) until the controller serves and has read the switch back
  tries=0
  until HOMAGG_OPERATOR_TOKEN_FILE=/credentials/tenant.token python -m homagg.worker create \
      --controller controller:50051 --name compose --world-size "$WORLD" \
      --codec "${CODEC:-lossless}" --pool-size 8 --token-file /shared/job.token \
      --json > /shared/job.json.tmp; do
    tries=$((tries + 1))
    [ "$tries" -lt 60 ] || exit 1
    sleep 1
  done
  mv /shared/job.json.tmp /shared/job.json
fi
while [ ! -s /shared/job.json ]; do sleep 0.5; done
HOMAGG_JOB_ID=$(python -c 'import json; print(json.load(open("/shared/job.json"))["job_id"])')
mkdir -p /shared/out
export HOMAGG_JOB_ID HOMAGG_TOKEN_FILE=/shared/job.token HOMAGG_IFACE=eth1
GLOO_SOCKET_IFNAME=eth0 OMP_NUM_THREADS=1 exec python -m torch.distributed.run --nnodes "$WORLD" \
  --nproc-per-node 1 --node-rank "$RANK" --master-addr worker1 --master-port 29500 \
  -m run.train --mode switch --codec "${CODEC:-lossless}" --steps "${STEPS:-120}" \
  --controller controller:50051 --iface eth1 --out /shared/out
