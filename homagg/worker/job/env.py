"""The environment a job's ranks read (homagg.attach, the homagg backend:
homagg/worker/job/setup.py)
and homagg-run writes for them (homagg/worker/job/launch.py): one name each, without torch, so the
launcher can name them without importing it. The credentials' names (the job token and its
file, the CA, plaintext) are homagg/api/credentials.py's."""

ENV_CONTROLLER = "HOMAGG_CONTROLLER"  # the controller's address, host:port
ENV_JOB_ID = "HOMAGG_JOB_ID"  # a job made outside the script (its token: HOMAGG_TOKEN_FILE)
ENV_CODEC = "HOMAGG_CODEC"  # the codec the ranks ask for (the launcher's job's codec)
ENV_IFACE = "HOMAGG_IFACE"  # the data-plane interface, when not the route to the controller
ENV_READY_TIMEOUT = "HOMAGG_READY_TIMEOUT"  # s: the wait for every rank (join, WaitReady)

__all__ = ["ENV_CODEC", "ENV_CONTROLLER", "ENV_IFACE", "ENV_JOB_ID", "ENV_READY_TIMEOUT"]
