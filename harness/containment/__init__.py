"""Process containment: nothing a cell starts on this machine outlives it, however it forks. The cell's own cgroup
(cgroup.py) and the namespaces that keep its processes in it (confine.py), harness as the subreaper of what it
starts (reaper.py), the token its processes carry (cell_token.py) and kills through pidfds in rounds (pidkill.py),
all ended together by containment.py; and the tether that ends a child with the process that started it (tether.py).

Used by what starts processes for a cell (harness run, harness host, environment builds, a pack's member runs), never
by rank code, which ends with its launcher (harness.ranks.lifecycle). Needs only harness.contract and harness.errors.
"""
