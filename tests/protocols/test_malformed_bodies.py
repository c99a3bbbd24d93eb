"""1,000 random malformed bodies (fixed seed) against every POST endpoint: each a 4xx JSON error."""

from __future__ import annotations

import json
import random
from collections import Counter

import pytest
import requests

pytestmark = pytest.mark.slow  # starts real servers or subprocesses

POST_PATHS = [
    "/v1/models/iris:predict",
    "/v1/models/iris/versions/1:predict",
    "/v1/models/iris/labels/stable:classify",
    "/v1/models/linear:regress",
    "/v1/models/iris:explain",
    "/v1/models/echo:predict",
    "/predict",
    "/explain",
]

_ATOMS = [None, True, False, 0, -1, 1.5, 1e308, 2**70, "", "x", "NaN", {}, [], {"b64": "!!"}, {"b64": 3}]
_KEYS = ["instances", "inputs", "examples", "context", "signature_name", "parameters", "stream", "b64", "x"]


def _value(rng: random.Random, depth: int = 0):
    roll = rng.random()
    if depth > 3 or roll < 0.4:
        return rng.choice(_ATOMS)
    if roll < 0.7:
        return [_value(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    return {rng.choice(_KEYS): _value(rng, depth + 1) for _ in range(rng.randint(0, 3))}


def malformed_body(rng: random.Random) -> bytes:
    kind = rng.randrange(6)
    if kind == 0:  # broken JSON text
        text = json.dumps({"instances": [[1, 2, 3, 4]]})
        cut = rng.randrange(1, len(text))
        return text[:cut].encode() + bytes([rng.randrange(256)])
    if kind == 1:  # random bytes
        return bytes(rng.randrange(256) for _ in range(rng.randint(0, 64)))
    if kind == 2:  # a JSON value that is not an object
        return json.dumps(_value(rng)).encode()
    if kind == 3:  # wrong types under the right keys
        return json.dumps({rng.choice(["instances", "inputs", "examples"]): rng.choice(_ATOMS[:11])}).encode()
    if kind == 4:  # ragged, mixed or mistyped tensors
        rows = [
            [rng.choice([1, 2.5, "a", None, True, [1]]) for _ in range(rng.randint(1, 4))]
            for _ in range(rng.randint(1, 3))
        ]
        rows.append([1] * rng.randint(0, 6))
        return json.dumps(
            {rng.choice(["instances", "inputs"]): rows, "signature_name": rng.choice([None, 3, "nope"])}
        ).encode()
    return json.dumps({k: _value(rng) for k in rng.sample(_KEYS, rng.randint(1, 4))}).encode()


def test_malformed_bodies_get_4xx_json_errors(sklearn_server):
    rng = random.Random(20261130)
    statuses: Counter[int] = Counter()
    unexpected = []
    with requests.Session() as s:
        for i in range(1000):
            path = POST_PATHS[i % len(POST_PATHS)]
            body = malformed_body(rng)
            r = s.post(sklearn_server.url + path, data=body, headers={"Content-Type": "application/json"}, timeout=30)
            statuses[r.status_code] += 1
            ok_json = r.headers.get("Content-Type", "").startswith("application/json") and "error" in r.json()
            if r.status_code == 200:
                continue  # a random body can be valid (e.g. {"instances": []} on the echo model)
            if not (400 <= r.status_code < 500 and ok_json):
                unexpected.append((path, body[:120], r.status_code, r.text[:200]))
    print(f"malformed bodies: {sum(statuses.values())} sent, statuses {dict(sorted(statuses.items()))}")
    assert unexpected == []
    assert statuses[200] < 100  # nearly all are rejected, not silently served
    # the server still answers correctly afterwards
    r = requests.post(
        sklearn_server.url + "/v1/models/iris:predict", json={"instances": [[5.1, 3.5, 1.4, 0.2]]}, timeout=10
    )
    assert r.json() == {"predictions": ["setosa"]}
