"""A rank the OOM killer ends, cold then warm (tests/integration/test_warm.py), without torch. On the node named by
the job's ``OOM_NODE`` the rank fills memory until the OOM killer of its container's memory cgroup (``--memory``)
ends it: in attempt 1 (cold: the attempt's container) once the file ``OOM_GO`` exists (the test creates it when
every node's zygote is up), in attempt 2 at once (a warm rank: the zygote's container). Every other rank waits;
from attempt 3 on every rank exits 0."""
import os
import time

attempt = int(os.environ.get("CLUSTERCTL_ATTEMPT", "0"))
if attempt <= 2 and os.environ.get("CLUSTERCTL_NODE") == os.environ.get("OOM_NODE"):
    while attempt == 1 and not os.path.exists(os.environ["OOM_GO"]):
        time.sleep(0.2)
    print(f"warm_oom.py: rank {os.environ.get('RANK')} fills memory", flush=True)
    hog = []
    while True:
        hog.append(b"\x01" * (32 << 20))       # written pages: resident, charged to the cgroup
if attempt <= 2:
    time.sleep(600)
print(f"warm_oom.py: rank {os.environ.get('RANK')} done", flush=True)
