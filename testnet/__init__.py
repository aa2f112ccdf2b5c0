"""Network namespaces and veth links that tests, benchmarks and demos create for
themselves, with sockets opened inside them. Needs root and iproute2."""
