"""Evaluation metrics: edit similarity, next-edit location, Codeforces-style output checks."""

from __future__ import annotations

import pytest
from dlm.drivers.evaluation import metrics as mt


def test_levenshtein_and_edit_similarity():
    assert mt.levenshtein("kitten", "sitting") == 3
    assert mt.levenshtein("", "abc") == 3 and mt.levenshtein("abc", "") == 3
    assert mt.edit_similarity("abc", "abc") == 1.0
    assert mt.edit_similarity("", "abcd") == 0.0
    assert mt.edit_similarity("kitten", "sitting") == pytest.approx(1 - 3 / 7)
    # the difflib fallback for long strings stays in range and ranks similar above different
    long_a, long_b = "x = 1\n" * 500, "x = 1\n" * 499 + "y = 2\n"
    assert 0.9 < mt.edit_similarity(long_a, long_b, max_cells=10) < 1.0
    assert mt.edit_similarity(long_a, "z" * 3000, max_cells=10) < 0.1


def test_location_correct():
    region = "a = 1\nb = 2\nc = 3\n"
    target = "a = 1\nb = 20\nc = 3\n"
    assert mt.location_correct(region, "a = 1\nb = 21\nc = 3\n", target)  # right line, wrong text
    assert not mt.location_correct(region, "a = 10\nb = 2\nc = 3\n", target)  # wrong line
    assert not mt.location_correct(region, region, target)  # no edit at all
    assert not mt.location_correct(region, region, region)  # nothing to locate


def test_output_matches_like_codeforces_checkers():
    assert mt.output_matches("29 23 35\n", "29\n23\n35")
    assert mt.output_matches("YES\nno\n", "Yes\nNO")
    assert mt.output_matches("0.3333333", "0.33333333")
    assert not mt.output_matches("1 2", "1 2 3")
    assert not mt.output_matches("0.34", "0.33333333")
    assert not mt.output_matches("12", "13")


