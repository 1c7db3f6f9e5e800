"""For the small suites that pytester runs packed (test_packed_tests.py, test_gpu_share.py): the source of `meet`,
appended to a suite's text, which its tests call after recording their pid in a JSON-lines file."""

# With one queue, a worker that starts first could take every test before another starts; tests that meet go on only
# once `peers` processes have each run one, so the count of workers is the packing's and not that race's.
MEET = '''

def meet(seen, peers):
    import json
    import time

    deadline = time.monotonic() + 300  # bounds the failure only
    while len({json.loads(line)["pid"] for line in open(seen).read().splitlines()}) < peers:
        assert time.monotonic() < deadline, f"no {peers} processes ran tests at once"
        time.sleep(0.05)
'''
