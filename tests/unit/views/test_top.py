"""`clusterctl top`'s view (issue 37): the rows of ranks.json with the promised keys, the table, and the advice
(data pipeline or communication?)."""
from clusterctl.model.ranks import RankView
from clusterctl.supervise.ranklook import RankWatch
from clusterctl.views import top

AR = {"pg": "0", "seq": 12, "op": "all_reduce"}


def doc_of(views_by_round, now=100.0):
    w = RankWatch(20)
    look = None
    for i, vs in enumerate(views_by_round):
        look = w.look(vs, now=now - len(views_by_round) + i + 1)
    return w.document(look, job_id="demo-1", attempt=2, wall=now)


def v(node, r, **kw):
    d = {"rank": r, "pid": 10 + r, "step": 40, "step_age_s": 0.2, "coll_age_s": 0.1, "cpu_s": 5.0, "rss": 3 << 30,
         "state": "training", "where": "train.py:40 step"}
    d.update(kw)
    return RankView.from_json(d, node=node)


def test_rows_have_the_promised_keys_and_values():
    first = {"a": {0: v("a", 0), 1: v("a", 1)}}
    second = {"a": {0: v("a", 0, step=44, cpu_s=6.0), 1: v("a", 1, step=42, cpu_s=5.5)}}
    rs = top.rows(doc_of([first, second]))
    assert [(r["node"], r["rank"], r["step"], r["state"]) for r in rs] == [("a", 0, 44, "training"),
                                                                          ("a", 1, 42, "training")]
    assert rs[0]["step_time_s"] == 0.25 and rs[0]["cpu_pct"] == 100.0 and rs[0]["rss_bytes"] == 3 << 30
    assert rs[1]["step_time_s"] == 0.5 and rs[1]["gpu_util_pct"] is None and rs[1]["waiting_s"] is None
    assert list(rs[0])[:5] == ["node", "rank", "step", "step_time_s", "state"]


def test_the_table_shows_each_rank_and_dashes_where_unknown():
    doc = doc_of([{"a": {0: v("a", 0)}, "b": {1: v("b", 1, step=None, state="starting")}}])
    lines = top.text(doc, "demo-1", now=101.0)
    assert lines[0].startswith("job demo-1  attempt 2  2 ranks")
    assert "node" in lines[1] and "state" in lines[1]
    assert any(" a " in f" {line} " and "training" in line and "3.0G" in line for line in lines[2:])
    assert any("starting" in line and " - " in line for line in lines[2:])


def test_advice_names_a_stuck_rank_and_communication():
    stuck = v("b", 1, state="still", step_age_s=25.0, coll_age_s=25.0, where="train.py:55 <module>")
    doc = doc_of([{"a": {0: v("a", 0, state="waiting", **{"in": dict(AR, for_s=24.0)})}, "b": {1: stuck}}])
    said = top.advice(top.rows(doc))
    assert said[0].startswith("STUCK: node b rank 1 stuck in train.py:55")
    assert said[1] == "communication: rank a/0 wait in collectives for rank b/1 (stuck)"
    lines = top.text(doc, "demo-1", now=101.0)
    assert any(line.startswith("STUCK:") for line in lines)


def test_advice_tells_the_data_pipeline_from_communication():
    loader = v("b", 1, state="still", step_age_s=3.0, where="/x/torch/utils/data/dataloader.py:1 _get_data")
    waiter = v("a", 0, state="waiting", **{"in": dict(AR, for_s=2.5)})
    said = top.advice(top.rows(doc_of([{"a": {0: waiter}, "b": {1: loader}}])))
    assert said == ["data pipeline: rank b/1 wait for their DataLoader workers (more workers, faster storage, or "
                    "prefetch)"]
    slow = v("b", 1, state="training")
    said = top.advice(top.rows(doc_of([{"a": {0: waiter}, "b": {1: slow}}])))
    assert said == ["communication: rank a/0 wait in collectives for rank b/1 (the slow side)"]
    assert top.advice(top.rows(doc_of([{"a": {0: v("a", 0)}}]))) == []


def test_a_view_older_than_10_s_is_stale():
    assert top.stale(None, 0) and top.stale({"time": 0}, 11) and not top.stale({"time": 5}, 11)
