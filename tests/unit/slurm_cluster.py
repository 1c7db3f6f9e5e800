"""A real Slurm cluster on this machine, for the multi-host tests: slurmctld and N slurmd "hosts", each in its
own network namespace (its own address, eth0 and, through a UTS namespace, hostname), on a bridge that has
no leg in the root namespace. Debian's slurm-wlm and munge (`.ci/run` installs them; `ensure_packages`
does too where apt works).

    cluster = SlurmCluster.up(4, root)      # hosts h1..h4, login node "ctl"
    cluster.login("sbatch", ...)            # a client command on the login node
    cluster.on_host(2, "ps", "-e")          # a command inside host h2's namespace
    cluster.down()

Facts this depends on (seen on Slurm 22.05): `ip netns exec` mounts a fresh /sys, so each slurmd needs the
cgroup v1 freezer mounted again, with a subtree of its own (this build has no multiple-slurmd); PID 1 is
not systemd, so daemons start directly with pid files; a lost node requeues a job unless --no-requeue;
SlurmdTimeout decides how soon a lost node fails its job.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

PACKAGES = ("slurmctld", "slurmd", "slurm-client", "munge", "iproute2", "util-linux")
PREFIX = "hsl"  # namespaces hsl-ctl, hsl-h1..: apart from any other cluster on the machine
SUBNET = "10.79.0"
SLURMD_TIMEOUT_S = 30  # longer than harness's heartbeat loss (10 s): harness names a partitioned host first


def why_not_here() -> str | None:
    """Why no cluster can run on this machine, or None."""
    if os.geteuid() != 0:
        return "needs root (network namespaces, slurmd)"
    for tool in ("ip", "unshare"):
        if shutil.which(tool) is None:
            return f"needs {tool}"
    if not all(shutil.which(tool) for tool in ("slurmctld", "slurmd", "munged")) and shutil.which("apt-get") is None:
        return "needs Slurm and munge (apt-get install slurmctld slurmd slurm-client munge)"
    probe = subprocess.run(["unshare", "--net", "--uts", "true"], capture_output=True, text=True)
    if probe.returncode:
        return f"cannot create namespaces: {probe.stderr.strip()}"
    return None


def ensure_packages() -> None:
    missing = [name for name in PACKAGES if subprocess.run(
        ["dpkg-query", "-W", "-f=${Status}", name], capture_output=True, text=True).stdout.find("ok installed") < 0]
    if missing:
        environ = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "update", "-qq"], check=True, env=environ)
        subprocess.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing], check=True,
                       env=environ, stdout=subprocess.DEVNULL)


def _run(*command: str, check: bool = True, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(command, check=check, capture_output=True, text=True, **kwargs)


class SlurmCluster:
    def __init__(self, hosts: int, root: Path):
        self.hosts = hosts
        self.root = root
        self.conf = root / "etc" / "slurm.conf"
        self.names = [f"h{i}" for i in range(1, hosts + 1)]

    # ------------------------------------------------------------ use

    def namespace(self, host: int | str) -> str:
        return f"{PREFIX}-{host if isinstance(host, str) else self.names[host - 1]}"

    def address(self, host: int) -> str:
        return f"{SUBNET}.{10 + host}"

    def _in(self, namespace: str, hostname: str, command: tuple[str, ...]) -> list[str]:
        script = f'hostname {hostname}; export SLURM_CONF={self.conf}; exec "$@"'
        return ["ip", "netns", "exec", namespace, "unshare", "--uts", "sh", "-c", script, hostname, *command]

    def login_command(self, *command: str) -> list[str]:
        return self._in(self.namespace("ctl"), "ctl", command)

    def login(self, *command: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
        return _run(*self.login_command(*command), check=check, timeout=timeout)

    def on_host(self, host: int, *command: str) -> subprocess.CompletedProcess:
        return _run("ip", "netns", "exec", self.namespace(host), *command, check=False)

    def pids(self, host: int) -> list[int]:
        listed = _run("ip", "netns", "pids", self.namespace(host), check=False).stdout.split()
        return [int(pid) for pid in listed]

    def processes(self, host: int, pattern: str) -> list[str]:
        """`pid cmdline` of the processes in host's namespace whose command line holds `pattern`."""
        found = []
        for pid in self.pids(host):
            with contextlib.suppress(OSError):
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
                if pattern in cmdline:
                    found.append(f"{pid} {cmdline}")
        return found

    def partition(self, host: int, cut: bool) -> None:
        """Cut (or restore) host's only link: nothing reaches it, nothing leaves it."""
        _run("ip", "-n", self.namespace("ctl"), "link", "set", f"{PREFIX}v-{self.names[host - 1]}",
             "down" if cut else "up")

    # ------------------------------------------------------------ up and down

    @classmethod
    def up(cls, hosts: int, root: Path, timeout_s: float = 120) -> SlurmCluster:
        cluster = cls(hosts, root)
        cluster.down()  # what an earlier run left
        ensure_packages()
        cluster._munge()
        cluster._network()
        cluster._config()
        cluster._daemons()
        deadline = time.monotonic() + timeout_s
        while True:
            idle = cluster.login("sinfo", "-h", "-N", "-t", "idle", "-o", "%N", check=False).stdout.split()
            if len(set(idle)) >= hosts:
                return cluster
            if time.monotonic() > deadline:
                log = (root / "log" / "slurmctld.log").read_text()[-2000:] if (root / "log").is_dir() else ""
                raise RuntimeError(f"Slurm: only {sorted(set(idle))} of {hosts} hosts idle; slurmctld.log:\n{log}")
            time.sleep(0.5)

    def down(self) -> None:
        """Cancel every job, stop the daemons, kill what is left in the namespaces, remove them."""
        if self.conf.is_file() and self.namespace("ctl") in _run("ip", "netns", "list", check=False).stdout:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.login("scancel", "--full", "--signal=KILL", "-u", "root", check=False, timeout=10)
        for pid_file in sorted((self.root / "run").glob("*.pid")) if (self.root / "run").is_dir() else []:
            with contextlib.suppress(ValueError, OSError):
                if pid_file.name != "munged.pid":
                    os.kill(int(pid_file.read_text().strip()), signal.SIGKILL)
        namespaces = [line.split()[0] for line in _run("ip", "netns", "list", check=False).stdout.splitlines()
                      if line.startswith(f"{PREFIX}-")]
        for namespace in namespaces:
            for pid in _run("ip", "netns", "pids", namespace, check=False).stdout.split():
                with contextlib.suppress(OSError):
                    os.kill(int(pid), signal.SIGKILL)
        munged = self.root / "munge" / "munged.pid"
        if munged.is_file():
            with contextlib.suppress(ValueError, OSError):
                os.kill(int(munged.read_text().strip()), signal.SIGTERM)
        for namespace in namespaces:
            _run("ip", "netns", "del", namespace, check=False)
            shutil.rmtree(f"/etc/netns/{namespace}", ignore_errors=True)
        for subtree in Path("/sys/fs/cgroup/freezer").glob(f"{PREFIX}_*"):
            for folder in [*sorted(subtree.rglob("*"), key=lambda p: -len(p.parts)), subtree]:
                if folder.is_dir():
                    with contextlib.suppress(OSError):
                        folder.rmdir()
        shutil.rmtree(self.root, ignore_errors=True)

    @property
    def munge_socket(self) -> Path:
        return self.root / "munge" / "munge.socket"

    def _munge(self) -> None:
        for folder in ("etc", "log", "run", "state", "spool"):
            (self.root / folder).mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o755)
        # A munged of this cluster's own (its own key and socket): nothing else on the machine is touched.
        folder = self.root / "munge"
        folder.mkdir(exist_ok=True)
        os.chmod(folder, 0o755)  # munged: every user must reach its socket
        key = folder / "munge.key"
        _run("mungekey", "--create", "--keyfile", str(key))
        for path in (folder, key):
            shutil.chown(path, "munge", "munge")
        os.chmod(key, 0o600)
        _run("runuser", "-u", "munge", "--", "munged", f"--key-file={key}", f"--socket={self.munge_socket}",
             f"--pid-file={folder}/munged.pid", f"--log-file={folder}/munged.log", f"--seed-file={folder}/seed")
        for _ in range(50):
            encoded = _run("munge", f"--socket={self.munge_socket}", "-n", check=False).stdout
            if encoded and _run("unmunge", f"--socket={self.munge_socket}", check=False,
                                input=encoded).returncode == 0:
                return
            time.sleep(0.1)
        raise RuntimeError(f"munged did not start: {(folder / 'munged.log').read_text(errors='replace')[-500:]}")

    def _network(self) -> None:
        ctl = self.namespace("ctl")
        lines = [f"{SUBNET}.10 ctl"] + [f"{self.address(i)} {name}" for i, name in enumerate(self.names, 1)]
        _run("ip", "netns", "add", ctl)
        _run("ip", "-n", ctl, "link", "set", "lo", "up")
        _run("ip", "-n", ctl, "link", "add", "br0", "type", "bridge")
        _run("ip", "-n", ctl, "addr", "add", f"{SUBNET}.10/24", "dev", "br0")
        _run("ip", "-n", ctl, "link", "set", "br0", "up")
        for i, name in enumerate(self.names, 1):
            namespace, veth = self.namespace(i), f"{PREFIX}v-{name}"
            _run("ip", "netns", "add", namespace)
            _run("ip", "-n", namespace, "link", "set", "lo", "up")
            _run("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", namespace)
            _run("ip", "link", "set", veth, "netns", ctl)
            _run("ip", "-n", ctl, "link", "set", veth, "master", "br0", "up")
            _run("ip", "-n", namespace, "addr", "add", f"{self.address(i)}/24", "dev", "eth0")
            _run("ip", "-n", namespace, "link", "set", "eth0", "up")
        for namespace in [ctl, *(self.namespace(i) for i in range(1, self.hosts + 1))]:
            Path(f"/etc/netns/{namespace}").mkdir(parents=True, exist_ok=True)
            Path(f"/etc/netns/{namespace}/hosts").write_text("127.0.0.1 localhost\n" + "\n".join(lines) + "\n")

    def _config(self) -> None:
        root, cpus = self.root, os.cpu_count() or 1
        nodes = "\n".join(f"NodeName={name} NodeAddr={self.address(i)} NodeHostname={name} CPUs={cpus} "
                          f"RealMemory=2000 State=UNKNOWN" for i, name in enumerate(self.names, 1))
        self.conf.write_text(f"""ClusterName=harness
SlurmctldHost=ctl({SUBNET}.10)
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={self.munge_socket}
SlurmUser=root
SlurmdUser=root
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool/%n
SlurmctldPidFile={root}/run/slurmctld.pid
SlurmdPidFile={root}/run/slurmd-%n.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd-%n.log
ProctrackType=proctrack/cgroup
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
SlurmdTimeout={SLURMD_TIMEOUT_S}
KillWait=5
UnkillableStepTimeout=30
MessageTimeout=10
{nodes}
PartitionName=ci Nodes=h[1-{self.hosts}] Default=YES MaxTime=60 State=UP
""")
        (root / "etc" / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\n")

    def _daemons(self) -> None:
        environ = {**os.environ, "SLURM_CONF": str(self.conf)}
        _run(*self._in(self.namespace("ctl"), "ctl", ("slurmctld", "-i")), env=environ)
        for i, name in enumerate(self.names, 1):
            (self.root / "spool" / name).mkdir(parents=True, exist_ok=True)
            freezer = f"{PREFIX}_{name}"
            script = f"""set -e
hostname {name}
mount -t tmpfs -o mode=755 cgroup /sys/fs/cgroup
mkdir -p /sys/fs/cgroup/.all /sys/fs/cgroup/freezer
mount -t tmpfs -o mode=755 all /sys/fs/cgroup/.all
mkdir -p /sys/fs/cgroup/.all/freezer
mount -t cgroup -o freezer freezer /sys/fs/cgroup/.all/freezer
mkdir -p /sys/fs/cgroup/.all/freezer/{freezer}
mount --bind /sys/fs/cgroup/.all/freezer/{freezer} /sys/fs/cgroup/freezer
exec slurmd -N {name}"""
            _run("ip", "netns", "exec", self.namespace(i), "unshare", "--uts", "sh", "-c", script, env=environ)
