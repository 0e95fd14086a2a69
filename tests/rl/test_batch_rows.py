"""The sampler's batch rows: prompts encoded once per distinct prompt, finished rows dropped once few are left."""

from __future__ import annotations

import torch

from nemotron.rl.batch_rows import distinct_prompts, rows_to_keep


def test_repeated_prompts_map_to_one_distinct_row_each() -> None:
    # Rows 0 and 2 are one prompt; row 3 has row 0's ids but its pad id 0 is a real token there.
    input_ids = torch.tensor([[0, 5, 6], [7, 8, 9], [0, 5, 6], [0, 5, 6]])
    mask = torch.tensor([[0, 1, 1], [1, 1, 1], [0, 1, 1], [1, 1, 1]])
    prompts = distinct_prompts(input_ids, mask)
    # torch.unique sorts the rows of [ids | mask]: [0,5,6,0,1,1] < [0,5,6,1,1,1] < [7,8,9,1,1,1].
    assert prompts.input_ids.tolist() == [[0, 5, 6], [0, 5, 6], [7, 8, 9]]
    assert prompts.mask.tolist() == [[0, 1, 1], [1, 1, 1], [1, 1, 1]]
    assert prompts.copies is not None and prompts.copies.tolist() == [0, 2, 0, 1]
    # Copying the distinct rows back gives the batch.
    assert prompts.input_ids[prompts.copies].equal(input_ids) and prompts.mask[prompts.copies].equal(mask)


def test_distinct_prompts_stay_as_given() -> None:
    input_ids = torch.tensor([[7, 8], [0, 5]])
    mask = torch.tensor([[1, 1], [0, 1]])
    prompts = distinct_prompts(input_ids, mask)
    assert prompts.copies is None
    assert prompts.input_ids is input_ids and prompts.mask is mask  # the batch's own order, not sorted


def test_finished_rows_leave_once_at_most_half_the_batch_is_going() -> None:
    going = torch.tensor([True, False, False, True])  # 2 of 4: half, so they leave
    kept = rows_to_keep(going, 2)
    assert kept is not None and kept.tolist() == [0, 3]
    assert rows_to_keep(torch.tensor([True, True, False, True]), 3) is None  # 3 of 4 still going
    assert rows_to_keep(torch.tensor([False, True, True]), 2) is None  # 2 of 3 > 1.5
    kept = rows_to_keep(torch.tensor([False, False, True]), 1)
    assert kept is not None and kept.tolist() == [2]
