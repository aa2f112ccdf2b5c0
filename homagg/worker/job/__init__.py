"""A switch job from a worker's side: the agent, the set-up a process group's ranks do
together, the session that ends it, the environment they read and `homagg-run`."""
