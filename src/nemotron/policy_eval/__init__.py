"""Evaluating a policy (steps/eval/policy): the scores of each response and the statistics of the report, as pure
functions the step composes and the tests check by hand."""
