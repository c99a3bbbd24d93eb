"""The plugin's options: forward passes bounded by rows and by padded tokens (TEI's budget)."""

from __future__ import annotations

import pytest
from servekit_huggingface.options import positive_option, token_batches


def test_short_rows_go_many_to_a_pass_and_long_ones_few():
    lengths = [512] * 8 + [10] * 100
    batches = token_batches(lengths, max_rows=256, max_tokens=2048)
    assert sorted(i for batch in batches for i in batch) == list(range(len(lengths)))
    assert [len(b) for b in batches] == [100, 4, 4]  # 100 x 10 tokens, then 4 x 512 twice
    assert all(len(b) * max(lengths[i] for i in b) <= 2048 for b in batches)


def test_rows_per_pass_still_bound_it_and_a_row_over_the_budget_runs_alone():
    assert [len(b) for b in token_batches([5] * 70, max_rows=32, max_tokens=None)] == [32, 32, 6]
    assert token_batches([3, 9000, 4], max_rows=32, max_tokens=1000) == [[0, 2], [1]]
    assert token_batches([], max_rows=32, max_tokens=1000) == []


def test_a_pass_cost_cuts_where_padding_would_cost_more_than_another_pass():
    lengths = [100, 10, 100, 10, 100, 10, 100, 10]
    # one pass pads 8 x 100 tokens; two spend 4 x 10 + 4 x 100 and a second pass's 32
    assert token_batches(lengths, max_rows=32, max_tokens=None, pass_tokens=32) == [[1, 3, 5, 7], [0, 2, 4, 6]]
    assert token_batches(lengths, max_rows=32, max_tokens=None, pass_tokens=1000) == [[1, 3, 5, 7, 0, 2, 4, 6]]
    assert token_batches(lengths, max_rows=32, max_tokens=None) == [[1, 3, 5, 7, 0, 2, 4, 6]]  # no cost: filled


@pytest.mark.parametrize("seed", range(5))
def test_the_cut_passes_keep_the_bounds_and_never_cost_more_than_filled_ones(seed):
    import random

    rng = random.Random(seed)
    lengths = [rng.randint(1, 600) for _ in range(rng.randint(1, 120))]

    def spent(batches):
        return sum(len(b) * max(lengths[i] for i in b) + 32 for b in batches)

    cut = token_batches(lengths, max_rows=16, max_tokens=4096, pass_tokens=32)
    assert sorted(i for batch in cut for i in batch) == list(range(len(lengths)))
    assert all(len(b) <= 16 and (len(b) == 1 or len(b) * max(lengths[i] for i in b) <= 4096) for b in cut)
    assert spent(cut) <= spent(token_batches(lengths, max_rows=16, max_tokens=4096))


@pytest.mark.parametrize("value", [0, -1, 1.5, "16384", True])
def test_a_bad_budget_is_refused_naming_the_option(value):
    with pytest.raises(ValueError, match="options.max_batch_tokens"):
        positive_option({"max_batch_tokens": value}, "max_batch_tokens")
