"""The asynchronous schedule's pure parts: which weights each step samples with, and each sample's age."""

from __future__ import annotations

import torch

from nemotron.rl.async_rollouts import schedule_version, trajectory_ages


def test_each_step_samples_the_weights_age_updates_before_its_own() -> None:
    # age 0: step j samples the weights after update j - 1, as the synchronous loop does
    assert [schedule_version(j, 0, 0) for j in (1, 2, 3)] == [0, 1, 2]
    # age 1: steps 1 and 2 both sample the starting weights, step 3 those after update 1
    assert [schedule_version(j, 1, 0) for j in (1, 2, 3, 4)] == [0, 0, 1, 2]
    # resumed at step 5 with age 2: no weights older than the checkpoint's exist
    assert [schedule_version(j, 2, 5) for j in (6, 7, 8, 9)] == [5, 5, 5, 6]


def test_a_samples_age_is_the_updates_between_its_weights_and_the_trainers() -> None:
    assert trajectory_ages(3, torch.tensor([3, 2, 1])).tolist() == [0, 1, 2]
