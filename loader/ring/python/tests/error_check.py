"""Against a `loader serve` that hits a bad record: iteration raises LoaderError
(not a timeout) whose text holds the producer's reason.

Usage: error_check.py JOB_ID REASON  (PYTHONPATH holds numa_loader)
"""
import sys

import numa_loader

job, reason = sys.argv[1], sys.argv[2]
n = 0
try:
    with numa_loader.Client(job, 0, timeout_s=60) as client:
        for b in client:
            n += 1
except numa_loader.LoaderTimeout as e:
    sys.exit("a timeout instead of the producer's error: %s" % e)
except numa_loader.LoaderError as e:
    assert isinstance(e, RuntimeError)
    assert reason in str(e), "the producer's reason %r is not in %r" % (reason, str(e))
    print("after %d batches: LoaderError: %s" % (n, e))
    sys.exit(0)
sys.exit("no error after %d batches" % n)
