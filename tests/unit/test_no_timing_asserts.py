"""No unit or controller test asserts how long something took: time on a shared two-core machine is
a figure (the `figure` fixture), never a pass or a fail. A wait for a state, with a deadline, is not
a timing assertion (the state is what it checks), and neither is a duration that must be positive.

The check reads each test function's syntax: the names it assigns from the clock (time.monotonic,
perf_counter, time.time), from those, or appends such values to; then any assert that orders such a
value against another (<, <=, >, >=), unless one side is a deadline or the bound is zero.

It also finds an assert right after a sleep: what it checks then depends on how much the machine got
done in that time (a count "between 2 and 5", or "nothing happened", which also holds when the
watch never ran). Such a test waits for a state instead: the thing it waited for, shown to have run
(so many more looks in the fake's request log, a line in the journal), then asserts."""

from __future__ import annotations

import ast
import itertools
from collections.abc import Callable

from tests.conftest import ROOT

DIRS = ("tests/unit", "tests/controller")
CLOCKS = {"monotonic", "perf_counter", "time", "monotonic_ns", "perf_counter_ns"}
ORDER = (ast.Lt, ast.LtE, ast.Gt, ast.GtE)


def _names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _calls_time(node: ast.AST, functions: set[str]) -> bool:
    """Whether ``node`` is a call ``time.F(...)`` of one of ``functions``."""
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in functions
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "time"
    )


def _reads_clock(node: ast.AST) -> bool:
    return any(_calls_time(n, CLOCKS) for n in ast.walk(node))


def _test_functions(source: str) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    return [
        func
        for func in ast.walk(ast.parse(source))
        if isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)) and func.name.startswith("test")
    ]


def _in_the_tests(finder: Callable[[str], list[int]]) -> list[str]:
    """``finder``'s lines in every test file of DIRS, as PATH:LINE."""
    found = []
    for directory in DIRS:
        for path in sorted((ROOT / directory).rglob("*.py")):
            found += [f"{path.relative_to(ROOT)}:{line}" for line in finder(path.read_text())]
    return found


def _timed_names(func: ast.AST) -> set[str]:
    """Names holding a clock reading or a value computed from one (to a fixed point)."""
    timed: set[str] = set()
    while True:
        before = len(timed)
        for node in ast.walk(func):
            if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)) and node.value is not None:
                if _reads_clock(node.value) or _names(node.value) & timed:
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    timed |= {n for t in targets for n in _names(t)}
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "append"
                and isinstance(node.func.value, ast.Name)
                and any(_reads_clock(a) or _names(a) & timed for a in node.args)
            ):
                timed.add(node.func.value.id)
        if len(timed) == before:
            return timed


def _is_exempt(side: ast.AST) -> bool:
    """A deadline (a wait for a state), or a zero bound (a duration that must be positive)."""
    if any("deadline" in name for name in _names(side)):
        return True
    return isinstance(side, ast.Constant) and side.value == 0


def timing_asserts(source: str) -> list[int]:
    """Line numbers of the asserts in ``source``'s test functions that order a clock-derived value."""
    found = []
    for func in _test_functions(source):
        timed = _timed_names(func)
        for node in ast.walk(func):
            if not isinstance(node, ast.Assert):
                continue
            for cmp in (n for n in ast.walk(node.test) if isinstance(n, ast.Compare)):
                sides = [cmp.left, *cmp.comparators]
                for op, left, right in zip(cmp.ops, sides[:-1], sides[1:], strict=True):
                    involved = [s for s in (left, right) if _reads_clock(s) or _names(s) & timed]
                    if isinstance(op, ORDER) and involved and not (_is_exempt(left) or _is_exempt(right)):
                        found.append(node.lineno)
    return sorted(set(found))


def _is_sleep(node: ast.stmt) -> bool:
    return isinstance(node, ast.Expr) and _calls_time(node.value, {"sleep"})


def asserts_after_a_sleep(source: str) -> list[int]:
    """Line numbers of the asserts that directly follow a ``time.sleep`` in ``source``'s tests."""
    found = []
    for func in _test_functions(source):
        for node in ast.walk(func):
            body = getattr(node, "body", None)
            if not isinstance(body, list):
                continue
            for before, after in itertools.pairwise(body):
                if _is_sleep(before) and isinstance(after, ast.Assert):
                    found.append(after.lineno)
    return sorted(set(found))


def test_the_check_finds_each_kind_of_timing_assertion() -> None:
    """What this project's tests once asserted: a bound on an elapsed time, on a value measured
    from the clock, and on a statistic of such values; and what they may keep."""
    source = """
import statistics, time
def test_bound():
    t0 = time.monotonic()
    assert time.monotonic() - t0 < 60
def test_measured():
    started = time.monotonic()
    first_at = time.monotonic() - started
    assert first_at < 0.25
def test_statistic():
    hops = []
    last = time.monotonic()
    hops.append(time.monotonic() - last)
    assert statistics.median(hops[1:]) < 0.1
def test_allowed():
    deadline = time.monotonic() + 5
    while True:
        assert time.monotonic() < deadline
    wall = time.monotonic() - deadline
    assert wall > 0
"""
    assert timing_asserts(source) == [5, 9, 14]


def test_the_check_finds_an_assert_right_after_a_sleep() -> None:
    """What spot recovery's tests once did (a count after a sleep, nothing after a sleep), and what
    they do now: wait for a state, then assert."""
    source = """
import time
def test_count():
    time.sleep(1.2)
    assert 2 <= watcher.attempts <= 5
def test_nothing():
    with stack() as s:
        time.sleep(2)
        assert s.starts() == []
def test_allowed():
    wait(lambda: looks() >= 3, "three more looks")
    assert starts() == []
    time.sleep(0.1)
    wait(lambda: done(), "done")
"""
    assert asserts_after_a_sleep(source) == [5, 9]


def test_no_test_asserts_a_time() -> None:
    assert _in_the_tests(timing_asserts) == [], (
        "report these with the `figure` fixture instead (CONTRIBUTING.md)"
    )


def test_no_test_asserts_right_after_a_sleep() -> None:
    assert _in_the_tests(asserts_after_a_sleep) == [], (
        "wait for the state the sleep was for (and show the watch ran), then assert"
    )
