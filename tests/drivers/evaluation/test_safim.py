"""SAFIM cases: the hole's line as the region, the program spliced back, its tests."""

from __future__ import annotations

import itertools

import pytest
from dlm.drivers.evaluation import safim as sf

RECORD = {
    "lang": "python",
    "task_id": "block_completion_test",
    "eval_prompt": "n = int(input())\r\nfor i in range(n):\r\n    if i % 2 == 0:\r\n        {{completion}}\r\nprint('end')",
    "ground_truth": "print(i)",
    "unit_tests": [{"input": "3", "output": ["0\n2\nend"]}, {"input": "1", "output": ["0\nend"]}],
}


def test_safim_case_region_is_the_hole_line():
    case = sf.safim_case(RECORD)
    p = case.prompt
    assert p.region == "        \n" and p.cursor == 8
    assert p.prefix.endswith("    if i % 2 == 0:\n") and p.suffix == "print('end')"
    assert case.target == "        print(i)\n"
    assert sf.passes_tests(case.program(case.target), case.tests)
    assert sf.passes_tests(case.program("        print(i)"), case.tests)  # missing newline is restored
    assert not sf.passes_tests(case.program("        print(i + 1)\n"), case.tests)
    assert not sf.passes_tests(case.program(p.region), case.tests)  # an empty block is a syntax error
    assert sf.safim_case({**RECORD, "unit_tests": []}) is None


def test_safim_ground_truth_passes_on_real_records():
    try:
        cases = list(itertools.islice(sf.iter_safim("control"), 2))
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    assert len(cases) == 2
    for c in cases:
        assert hole_free(c.program(c.target))
        assert sf.passes_tests(c.program(c.target), c.tests)


def hole_free(program: str) -> bool:
    return sf.HOLE not in program


