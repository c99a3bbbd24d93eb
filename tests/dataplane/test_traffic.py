"""Traffic control in process: the priority queue, its settings, canary splits and the shadow's difference."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest
from servekit.control.triton_load_config import settings_for
from servekit.dataplane import call_gate, traffic
from servekit.errors import BadRequest
from servekit.folders import triton_config
from servekit.folders.servekit_yaml import ConfigError, parse_model_config
from servekit.types import QueueConfig, TrafficConfig


def queue_of(**raw) -> QueueConfig:
    config = parse_model_config({"queue": raw}).queue
    assert config is not None
    return config


def wait_for(condition) -> None:
    deadline = time.monotonic() + 10
    while not condition():
        assert time.monotonic() < deadline, "the condition never held"
        time.sleep(0.005)


def queued_calls(gate: call_gate.PriorityGate, tickets: list[traffic.Ticket]) -> tuple[list[int], dict[int, str]]:
    """Hold the gate's one place, queue a call per ticket (in order), let them in; who ran in which order."""
    order: list[int] = []
    failed: dict[int, str] = {}
    held = threading.Event()

    def call(i: int, ticket: traffic.Ticket) -> None:
        traffic.start(ticket)
        try:
            with gate:
                order.append(i)
        except Exception as exc:
            failed[i] = type(exc).__name__

    with gate:  # the model is busy
        threads = []
        for i, ticket in enumerate(tickets):
            threads.append(threading.Thread(target=call, args=(i, ticket)))
            threads[-1].start()
            wait_for(lambda n=i + 1: gate.queued + len(failed) >= n)
        held.set()
    for thread in threads:
        thread.join(10)
    return order, failed


def test_a_high_priority_call_goes_before_every_low_priority_one_queued_before_it():
    gate = call_gate.PriorityGate(1, queue_of(priority_levels=3), "m")
    tickets = [traffic.Ticket(priority=3) for _ in range(100)] + [traffic.Ticket(priority=1), traffic.Ticket()]
    order, failed = queued_calls(gate, tickets)
    assert not failed
    assert order[0] == 100  # level 1 first
    assert order[1] == 101  # no priority: the default level (the middle, 2)
    assert order[2:] == list(range(100))  # each level first come, first served
    assert gate.free == 1 and gate.queued == 0


def test_a_queued_call_whose_client_left_or_whose_timeout_passed_is_never_let_in():
    gate = call_gate.PriorityGate(1, queue_of(priority_levels=2), "m")
    gone = threading.Event()
    tickets = [
        traffic.Ticket(cancelled=gone.is_set),
        traffic.Ticket(timeout_ms=1, arrival=time.monotonic() - 10),  # long past its timeout
        traffic.Ticket(),
    ]
    gone.set()
    order, failed = queued_calls(gate, tickets)
    assert order == [2]
    assert failed == {0: "ClientGone", 1: "QueueTimeout"}
    assert gate.free == 1 and gate.queued == 0


def test_delay_puts_a_late_call_behind_those_still_in_time_and_a_full_queue_refuses():
    gate = call_gate.PriorityGate(1, queue_of(priority_levels=2, timeout_action="delay", max_queue_size=3), "m")
    late = traffic.Ticket(priority=1, timeout_ms=1, arrival=time.monotonic() - 10)
    tickets = [late, traffic.Ticket(priority=2), traffic.Ticket(), traffic.Ticket()]
    order, failed = queued_calls(gate, tickets)
    assert order == [2, 1, 0] and failed == {3: "QueueFull"}  # no priority: the default level, 1 of 2


def test_a_priority_outside_the_levels_or_a_timeout_the_policy_forbids_is_a_400_naming_it():
    config = queue_of(priority_levels=2, allow_timeout_override=False)
    with pytest.raises(BadRequest, match="'priority' is 3; this model has priority levels 1 to 2"):
        traffic.Ticket(priority=3).place_in(config)
    with pytest.raises(BadRequest, match="'timeout' cannot be set"):
        traffic.Ticket(timeout_ms=5).place_in(config)


@pytest.mark.parametrize(
    ("raw", "key"),
    [
        ({"priority_levels": -1}, "queue.priority_levels"),
        ({"priority_levels": 2, "default_priority_level": 3}, "queue.default_priority_level"),
        ({"timeout_action": "drop"}, "queue.timeout_action"),
        ({"default_timeout_ms": "soon"}, "queue.default_timeout_ms"),
        ({"allow_timeout_override": "yes"}, "queue.allow_timeout_override"),
        ({"max_queue_size": 1.5}, "queue.max_queue_size"),
        ({"priority_levels": 2, "levels": {3: {"max_queue_size": 1}}}, "queue.levels"),
        ({"levels": "fast"}, "queue.levels"),
        ({"priority": 2}, "'queue' takes"),
    ],
)
def test_every_bad_queue_setting_is_an_error_naming_its_key(raw, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        parse_model_config({"queue": raw})


def test_tritons_priorities_and_queue_policy_become_the_queue_from_config_pbtxt_and_a_load_request():
    dynamic = {
        "priority_levels": 2,
        "default_priority_level": 2,
        "default_queue_policy": {"timeout_action": "DELAY", "default_timeout_microseconds": 5000},
        "priority_queue_policy": [{"key": 1, "value": {"max_queue_size": 4, "allow_timeout_override": True}}],
    }
    mapped = triton_config.queue({"dynamic_batching": dynamic})
    config = parse_model_config({"queue": mapped}).queue
    assert config is not None and config.priority_levels == 2 and config.default_priority_level == 2
    assert config.default_policy.timeout_action == "delay" and config.default_policy.default_timeout_ms == 5.0
    assert config.policy(1).max_queue_size == 4 and config.policy(1).timeout_action == "delay"
    loaded = settings_for(
        "m", {"max_batch_size": 8, "dynamic_batching": {**dynamic, "priority_queue_policy": {"1": {}}}}
    )
    assert loaded["queue"]["priority_levels"] == 2 and loaded["batching"] == {"max_batch_size": 8}
    with pytest.raises(BadRequest, match="timeout_action must be REJECT or DELAY"):
        settings_for("m", {"dynamic_batching": {"default_queue_policy": {"timeout_action": "LATER"}}})


def test_a_queue_gives_a_version_one_place_or_a_batch_worth():
    def version(batch: int) -> SimpleNamespace:
        raw = {"queue": {"priority_levels": 2}, "batching": {"max_batch_size": batch}}
        return SimpleNamespace(config=parse_model_config(raw), loaded_by="sklearn", gate=None, name="m")

    assert call_gate.places_of(version(0)) == 1
    assert call_gate.places_of(version(8)) == 8
    assert isinstance(call_gate.turn(version(0)), call_gate.PriorityGate)


def test_ten_thousand_requests_split_90_10_land_within_two_percent_of_the_weights():
    config = parse_model_config({"traffic": {"weights": {1: 90, "candidate": 10}}}).traffic
    assert config is not None
    picks = [traffic.route(config, traffic.Ticket()) for _ in range(10_000)]
    assert abs(picks.count(1) / 10_000 - 0.9) <= 0.02
    assert abs(picks.count("candidate") / 10_000 - 0.1) <= 0.02


def test_a_sticky_split_keeps_each_client_on_one_target_and_still_splits_clients_by_weight():
    config = TrafficConfig([(1, 90.0), (2, 10.0)], "x-user")

    def ticket(user: str) -> traffic.Ticket:
        return traffic.Ticket(lookup={"x-user": user}.get)

    assert len({traffic.route(config, ticket("ada")) for _ in range(50)}) == 1
    picks = [traffic.route(config, ticket(f"user-{i}")) for i in range(10_000)]
    assert abs(picks.count(2) / 10_000 - 0.1) <= 0.02


@pytest.mark.parametrize(
    ("raw", "key"),
    [
        ({"traffic": {"weights": {1: -1}}}, "traffic.weights.1"),
        ({"traffic": {"weights": {1: 0}}}, "traffic.weights"),
        ({"traffic": {"weights": {0: 1}}}, "traffic.weights.0"),
        ({"traffic": {"weights": {1: 1}, "sticky": "a b"}}, "traffic.sticky"),
        ({"traffic": {"split": {1: 1}}}, "'traffic' takes"),
        ({"shadow": {"target": 2, "fraction": 1.5}}, "shadow.fraction"),
        ({"shadow": {"fraction": 1}}, "'shadow' takes"),
        ({"shadow": {"target": True}}, "shadow.target"),
    ],
)
def test_every_bad_traffic_or_shadow_setting_is_an_error_naming_its_key(raw, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        parse_model_config(raw)


def test_the_shadow_difference_is_the_largest_gap_between_matching_outputs():
    served = {"y": np.array([1.0, 2.0]), "label": np.array(["a", "b"])}
    assert traffic.difference(served, {"y": np.array([1.0, 2.5]), "label": np.array(["a", "b"])}) == 0.5
    assert traffic.difference(served, {"y": np.array([1.0, 2.0]), "label": np.array(["a", "c"])}) == 1.0
    assert traffic.difference(served, {"y": np.array([1.0])}) is None
