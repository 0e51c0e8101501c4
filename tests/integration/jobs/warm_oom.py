"""A rank the OOM killer ends in a warm attempt (tests/integration/test_warm.py), without torch: attempt 1, every
rank waits (the test kills one node's job so that attempt 2 is a warm relaunch); attempt 2, the rank on the node
named by the job's ``OOM_NODE`` fills memory until the OOM killer of its container's memory cgroup (the zygote's,
``--memory``) ends it, the others wait; attempt 3, every rank exits 0."""
import os
import time

attempt = os.environ.get("CLUSTERCTL_ATTEMPT")
if attempt == "2" and os.environ.get("CLUSTERCTL_NODE") == os.environ.get("OOM_NODE"):
    print(f"warm_oom.py: rank {os.environ.get('RANK')} fills memory", flush=True)
    hog = []
    while True:
        hog.append(b"\x01" * (32 << 20))       # written pages: resident, charged to the cgroup
if attempt in ("1", "2"):
    time.sleep(600)
print(f"warm_oom.py: rank {os.environ.get('RANK')} done", flush=True)
