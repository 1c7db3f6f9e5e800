"""Engines: what starts, watches and cancels a cell's hosts. `local` is harness.run.command itself (one host);
`slurm` submits one job to a login node's Slurm (slurm.py); `jobset` renders a Kubernetes JobSet and drives
kubectl (jobset.py). Every engine starts `harness host` on each host (host.py) and leaves the same results
folder as a local cell."""
