# BMv2 (p4lang/behavioral-model) with iproute2, which docker/close_data_ports.sh needs to close
# the data ports to the container's kernel, and homagg/lab/rawsock.py, which turns their offloads
# off under the image's Python 3 (docker/switch.sh; docs/run.md, Docker).
FROM p4lang/behavioral-model:latest
RUN apt-get update -qq \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends iproute2 \
    && rm -rf /var/lib/apt/lists/*
COPY docker/close_data_ports.sh docker/switch.sh homagg/lab/rawsock.py /homagg/
CMD ["sh", "/homagg/switch.sh"]
