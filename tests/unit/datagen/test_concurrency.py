"""The adaptive concurrency controller (datagen.gen.concurrency): readings and the next limit, as tables."""

from __future__ import annotations

import pytest

from datagen.gen.concurrency import (
    LimitPolicy,
    WorkerLoad,
    all_empty,
    bounds,
    initial_limit,
    next_limit,
    parse_loads,
    queue_goal,
)

# a worker's /metrics as sglang 0.5.23 writes it (prometheus_client text, SchedulerMetricsCollector labels)
WORKER_PAGE = """\
# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="m",engine_type="unified",tp_rank="0",pp_rank="0",moe_ep_rank="0"} 37.0
# HELP sglang:num_queue_reqs The number of requests in the waiting queue.
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="m",engine_type="unified",tp_rank="0",pp_rank="0",moe_ep_rank="0"} 5.0
sglang:token_usage{model_name="m",engine_type="unified",tp_rank="0",pp_rank="0",moe_ep_rank="0"} 0.41
sglang:num_requests_total{model_name="m",engine_type="unified"} 1234.0
"""

# sglang-router 0.3.2's /engine_metrics: every worker's page, sglang: renamed sglang_, a worker_addr label
ROUTER_PAGE = """\
# TYPE sglang_num_running_reqs gauge
sglang_num_running_reqs{model_name="m",worker_addr="http://127.0.0.1:31001"} 16
sglang_num_running_reqs{model_name="m",worker_addr="http://127.0.0.1:31000"} 12

# TYPE sglang_num_queue_reqs gauge
sglang_num_queue_reqs{model_name="m",worker_addr="http://127.0.0.1:31000"} 0
sglang_num_queue_reqs{model_name="m",worker_addr="http://127.0.0.1:31001"} 9
"""


@pytest.mark.parametrize("page, expected", [
    (WORKER_PAGE, [WorkerLoad(37, 5, 0.41)]),
    (ROUTER_PAGE, [WorkerLoad(12, 0), WorkerLoad(16, 9)]),  # sorted by worker_addr, queues matched by labels
    # priority scheduling: one series per priority, added up per worker
    ('sglang:num_running_reqs{model_name="m",priority="0"} 3\nsglang:num_running_reqs{model_name="m",priority="1"} 4\n'
     'sglang:num_queue_reqs{model_name="m",priority="1"} 2\n', [WorkerLoad(7, 2)]),
    # data parallelism: one scheduler per dp_rank, each its own batch
    ('sglang:num_running_reqs{dp_rank="0"} 8\nsglang:num_running_reqs{dp_rank="1"} 2\n'
     'sglang:num_queue_reqs{dp_rank="1"} 1\n', [WorkerLoad(8, 0), WorkerLoad(2, 1)]),
    ("sglang:num_running_reqs 4\n", [WorkerLoad(4, 0)]),  # no queue gauge: an empty queue
    ("sglang:num_requests_total 9\n# nothing about load\n", []),
    ("<html>502 Bad Gateway</html>\nsglang:num_running_reqs{x=\"1\"} NaN\nsglang:num_running_reqs -3\n", []),
    ("", []),
])
def test_parse_loads(page, expected):
    assert parse_loads(page) == expected


P = LimitPolicy(queue_target=8, minimum=8, maximum=1024)


def loads(*queues, running=16):
    return [WorkerLoad(running, q) for q in queues]


@pytest.mark.parametrize("case, limit, in_flight, reading, empty_before, expected", [
    ("no reading: hold", 256, 256, [], True, 256),
    ("every queue empty twice running, limit binding: double", 256, 256, loads(0, 0), True, 512),
    ("every queue empty once (a batch that just finished?): add the target", 256, 256, loads(0, 0), False, 272),
    ("every queue empty, small limit: at least the target queue more", 16, 16, loads(0, 0), True, 32),
    ("every queue empty but fewer in flight than the limit (input ending): hold", 256, 100, loads(0, 0), True, 256),
    ("a short queue: fill it to the target", 40, 40, loads(2), True, 46),
    ("queues at the target: hold", 64, 64, loads(8, 10), True, 64),
    ("queues up to twice the target: hold", 64, 64, loads(16, 16), True, 64),
    ("flooded: the excess goes at once", 256, 256, loads(224), True, 40),
    ("flooded while tasks above a lowered limit finish: from what is in flight", 48, 256, loads(224), True, 40),
    ("flooded, but the limit is already below the correction: keep the lower", 30, 256, loads(224), True, 30),
    ("two workers flooded: the common excess goes", 256, 256, loads(100, 40), True, 192),
    ("one worker idle behind a router that keeps the other's queue long: grow", 96, 96, loads(80, 0), True, 112),
    ("a big batch's between-steps queue is no sign of a full worker: grow", 216, 216, [WorkerLoad(206, 10)], True,
     231),
    ("a big batch with an eighth of it waiting: hold", 450, 450, [WorkerLoad(400, 50)], True, 450),
    ("a big batch with half of it waiting: flooded", 600, 600, [WorkerLoad(400, 200)], True, 450),
    ("a short queue, but the KV cache is full: hold", 40, 40, [WorkerLoad(32, 0, 0.97)], True, 40),
    ("one worker's KV cache full, the other has room: grow", 96, 96,
     [WorkerLoad(16, 0, 0.97), WorkerLoad(16, 0, 0.5)], False, 112),
    ("bounded below: n x minimum", 100, 100, loads(5000), True, 8),
    ("bounded above: n x maximum", 1500, 1500, loads(0), True, 1024),
    ("bounded above, two workers", 1800, 1800, loads(0, 0), True, 2048),
])
def test_next_limit(case, limit, in_flight, reading, empty_before, expected):
    assert next_limit(limit, in_flight, reading, P, empty_before) == expected, case


@pytest.mark.parametrize("capacity", [4, 16, 96, 300, 700, 1000])
@pytest.mark.parametrize("start", [8, 128, 1024])
def test_a_closed_loop_settles_at_capacity_with_a_small_queue(capacity, start):
    """A worker that runs ``capacity`` at once and queues the rest, the client keeping ``limit`` in flight:
    from any start the limit settles within a few readings at capacity + a queue of about the target."""
    limit = initial_limit(1, start, P)
    history = []
    empty = False
    for _reading in range(16):
        running = min(capacity, limit)
        reading = [WorkerLoad(running, limit - running)]
        limit = next_limit(limit, limit, reading, P, empty)
        empty = all_empty(reading)
        history.append(limit)
    settled = history[-4:]
    assert len(set(settled)) == 1, history  # it holds still once there
    queued = settled[0] - capacity
    goal = queue_goal(WorkerLoad(capacity, queued), P)  # the target, or an eighth of the batch
    assert goal // 2 <= queued <= 2 * goal or settled[0] in (P.minimum, P.maximum), history
    assert all(P.minimum <= x <= P.maximum for x in history), history


def test_capacity_above_the_maximum_stays_at_the_maximum():
    limit = 128
    for _reading in range(16):
        limit = next_limit(limit, limit, [WorkerLoad(limit, 0)], P, True)
    assert limit == P.maximum


def test_bounds_and_start():
    assert bounds(3, P) == (24, 3072)
    assert bounds(0, P) == (8, 1024)  # no reading yet: one worker's worth
    assert initial_limit(2, 128, P) == 256
    assert initial_limit(1, 4096, P) == 1024
    assert initial_limit(1, 1, P) == 8


@pytest.mark.parametrize("kwargs", [
    {"minimum": 0}, {"minimum": 64, "maximum": 32}, {"queue_target": 0}, {"growth": 1.0},
])
def test_policy_refuses_nonsense(kwargs):
    with pytest.raises(ValueError):
        LimitPolicy(**dict({"queue_target": 8, "minimum": 8, "maximum": 1024}, **kwargs))
