"""Issue 35 item 1, the last part: NCCL on sockets where InfiniBand is expected (the supervisor's ``network``
event) is shown by `status` on its own line and in `status -o json` as ``warnings``, for the current attempt."""
from __future__ import annotations

import json

from clusterctl.model.events import EventKind
from clusterctl.store.ledger import Ledger
from clusterctl.store.state import ACTIVE_STATES, Store
from clusterctl.views import status

WARNING = ("WARNING: n2: NCCL uses sockets where InfiniBand is expected (10-100x slower; check the IB devices, port "
           "state and nvidia_peermem with `clusterctl preflight`): [n2/1] n2:42:42 [0] NCCL INFO Using network Socket")


def test_the_socket_fallback_warning_is_a_line_of_status_and_a_field_of_its_json(tmp_path):
    store = Store(tmp_path / "state.db")
    ledger = Ledger(store)
    job_id = store.create_job("demo", "{}", None, None)
    ledger.attempt_started(job_id, 1, "n1", ["n1", "n2"], None, "start", expect=ACTIVE_STATES)
    ledger.event(job_id, EventKind.NETWORK, WARNING, attempt=1, node="n2", klass="socket")

    v = status.job_view(store, store.get_job(job_id))
    got = json.loads(json.dumps(v))["warnings"]
    assert [(w["kind"], w["node"], w["attempt"], w["message"]) for w in got] == [("network", "n2", 1, WARNING)]
    assert WARNING in status.text(v)            # on its own line, whole
    assert status.text(v).index(WARNING) < [i for i, line in enumerate(status.text(v)) if line.startswith("job ")][0]

    ledger.attempt_started(job_id, 2, "n1", ["n1", "n3"], None, "start", expect=ACTIVE_STATES)
    v = status.job_view(store, store.get_job(job_id))
    assert v["warnings"] == [] and WARNING not in status.text(v)   # an earlier attempt's: not about these nodes
    store.close()
