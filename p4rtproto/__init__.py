"""Protocol buffers: P4Runtime (generated from the p4runtime wheel) and the project's own services."""
