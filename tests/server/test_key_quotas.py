"""Per-key quotas in one process: the key file's bounds, and what each bound admits.

The bounds held across two workers are shown through a real server in ``tests/e2e/test_quotas.py``.
"""

from __future__ import annotations

import pytest
from servekit.server.auth import ApiKey, Quota, parse_entries, parse_keys
from servekit.server.quotas import Quotas


def test_old_key_files_stay_valid_and_bounds_are_read():
    text = "infer,metrics abc==\n* def name=batch requests_per_minute=50 tokens_per_minute=1000 max_concurrent=2\n"
    assert len(parse_keys(text, "f")) == 2  # a key may end in '=' (base64), as before
    (_, _, plain), (_, _, bounded) = parse_entries(text, "f")
    assert not plain
    assert plain.name.startswith("sha256:") and "abc" not in plain.name
    assert bounded == Quota("batch", requests_per_minute=50, tokens_per_minute=1000, max_concurrent=2)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("infer k name=a requests_per_minute=0", "line 1, key 'a': requests_per_minute='0' must be a positive"),
        ("infer k max_concurrent=-1 name=b", "line 1, key 'b': max_concurrent='-1' must be a positive"),
        ("infer k name=c rpm=5", "line 1, key 'c': unknown field 'rpm'"),
        ("infer k name=has/slash", "name='has/slash' must be"),
    ],
)
def test_bad_bounds_name_the_key_and_the_field(line, message):
    with pytest.raises(ValueError, match=message):
        parse_entries(line, "keys.txt")


def test_a_key_is_found_by_its_bearer_token(tmp_path):
    key_file = tmp_path / "keys.txt"
    key_file.write_text("infer one name=one max_concurrent=1\ninfer two\n")
    keys = ApiKey(key_file=str(key_file))
    assert keys.quota_of("Bearer one") == Quota("one", max_concurrent=1)
    assert keys.quota_of("Bearer two") is None
    assert keys.quota_of(None) is None


def test_concurrent_requests_free_their_place_when_answered():
    quotas, quota = Quotas(), Quota("pair", max_concurrent=2)
    first, _, _ = quotas.admit(quota)
    second, _, _ = quotas.admit(quota)
    refused, exhausted, _ = quotas.admit(quota)
    assert first is not None and second is not None
    assert (refused, exhausted) == (None, "concurrency")
    quotas.done(quota, first, 0)
    assert quotas.admit(quota)[0] is not None


def test_requests_per_minute_say_what_is_left():
    quotas, quota = Quotas(), Quota("three", requests_per_minute=3)
    standings = [quotas.admit(quota)[2] for _ in range(4)]
    assert [s.headers(False)[1][1].split(";t=")[0] for s in standings] == [
        '"requests";r=2',
        '"requests";r=1',
        '"requests";r=0',
        '"requests";r=0',
    ]
    assert dict(standings[3].headers(True))["x-ratelimit-remaining-requests"] == "0"
