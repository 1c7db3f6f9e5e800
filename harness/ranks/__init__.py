"""Running functions on N ranks: the protocol (protocol.py), the errors a launch raises (failures.py) and what
a rank says of what it raised (raised.py), what a rank does (rank.py), the launcher's side
(launcher.py), one spawn per call (spawn.py), the zygote (zygote.py), pools of fresh ranks per test (pool.py), what
ranks hand on to later tests' ranks as files (handover.py), nothing
outliving its launcher (lifecycle.py; what ends a whole cell is harness.containment),
checks that fail on every rank together (agree.py), each call's output
captured on its ranks (output.py) and the pytest plugin with the `ranks` fixture (plugin.py), which puts that
output into the test's report (sections.py) and says how far a long session is (progress.py); across hosts, host
0's hub (hosts.py), each other host's agent (agent.py) and the TLS wire between them (tls.py)."""

from harness.ranks.agree import together
from harness.ranks.failures import DistributedError, RankFailedError, RankTimeoutError
from harness.ranks.protocol import DEFAULT_TIMEOUT_S, RankResult
from harness.ranks.raised import PeerFailure
from harness.ranks.spawn import run_distributed

__all__ = ["DEFAULT_TIMEOUT_S", "DistributedError", "PeerFailure", "RankFailedError", "RankResult",
           "RankTimeoutError", "run_distributed", "together"]
