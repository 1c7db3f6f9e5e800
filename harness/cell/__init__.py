"""One cell on its host: the preflight that writes the cell's folder before anything can fail, the GPUs seen
through NVML, and the memory monitor that samples each GPU's peak while the suite runs.

Runs on the host that runs the cell: in `harness run`, and in `harness host` on each host of a multi-host cell."""
