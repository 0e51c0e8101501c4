"""The runtimes' warm-recovery commands run for real with a fake ``podman`` on the PATH (it logs its argv)."""
from __future__ import annotations

import os
import subprocess

from clusterctl import runtimes
from clusterctl.runtimes import RunRequest

FAKE = '''#!/bin/sh
printf '%s\\n' "$*" >>"$LOG"
case $1 in ps) echo abc123;; esac
exit 0
'''


def _env(tmp_path):
    (tmp_path / "podman").write_text(FAKE)
    (tmp_path / "podman").chmod(0o755)
    return dict(os.environ, PATH=f"{tmp_path}:{os.environ['PATH']}", LOG=str(tmp_path / "log"))


def test_zygote_start_writes_zygote_py_into_a_fresh_private_dir_then_runs_the_container(tmp_path):
    rt = runtimes.get("podman")
    job_id, node = f"w-{os.getpid()}-x", "n 1"
    wdir = runtimes.warm_dir(job_id, node)
    req = RunRequest(job="w", job_id=job_id, attempt=1, node=node, name="c", image="img:1", workdir="/w",
                     node_dir="/nd", command=("torchrun",), gpus=0, ulimits=())
    try:
        r = subprocess.run(rt.zygote_start_argv(req, wdir), input=b"print('zygote')\n", env=_env(tmp_path),
                           capture_output=True, timeout=30)
        assert r.returncode == 0, r.stderr
        assert open(f"{wdir}/zygote.py").read() == "print('zygote')\n"
        assert oct(os.stat(wdir).st_mode & 0o777) == "0o700"
        line = (tmp_path / "log").read_text()
        assert line.startswith(f"run -d --name=clusterctl-zygote-{job_id}_{node} --label=clusterctl.warm={job_id} "
                               f"--label=clusterctl.node={node} --network=host")
        assert line.rstrip().endswith(f"--volume={wdir}:{wdir} img:1 python3 {wdir}/zygote.py serve {wdir}/z.sock")
        r = subprocess.run(rt.zygote_remove_argv(job_id, node, wdir), env=_env(tmp_path), capture_output=True,
                           timeout=30)
        assert r.returncode == 0, r.stderr
        log = (tmp_path / "log").read_text().splitlines()
        assert log[1:] == [f"ps -aq --filter=label=clusterctl.warm={job_id} --filter=label=clusterctl.node={node}",
                           "rm -f --time=0 abc123"]
        assert not os.path.exists(wdir)
    finally:
        subprocess.run(["rm", "-rf", "--", wdir])
