"""Which environment variables belong to a host rather than to a cell: a rank on another host than the
launcher's keeps its own host's values for them, whatever host 0's environment says (Slurm's per-node
SLURM_*, the host name, the per-host temporary folder and cell token, the GPUs the host was given, where the
host keeps the cell's credentials). Standard library and harness.environment only."""

from __future__ import annotations

from harness.environment import CELL_TOKEN_ENV, HOSTS_CREDENTIALS_ENV

HOST_LOCAL_PREFIXES = ("SLURM_", "SLURMD_", "PMI_", "PMIX_", "OMPI_")
HOST_LOCAL_NAMES = frozenset({
    "HOSTNAME", "HOST", "TMPDIR", CELL_TOKEN_ENV, "CUDA_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL",
    "ROCR_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK",
    "WORLD_SIZE", "LOCAL_WORLD_SIZE", "OMP_NUM_THREADS", HOSTS_CREDENTIALS_ENV,
})


def is_host_local(name: str) -> bool:
    return name in HOST_LOCAL_NAMES or name.startswith(HOST_LOCAL_PREFIXES)


def portable(environ: dict[str, str]) -> dict[str, str]:
    """What of `environ` another host may take: everything but the host-local names."""
    return {name: value for name, value in environ.items() if not is_host_local(name)}


def for_host(sent: dict[str, str], host_environ: dict[str, str]) -> dict[str, str]:
    """The environment a rank on this host runs a call in: what the launcher sent, with this host's own
    values (and absences) for every host-local name."""
    return {**portable(sent), **{name: value for name, value in host_environ.items() if is_host_local(name)}}
