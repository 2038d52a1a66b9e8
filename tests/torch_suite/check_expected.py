"""Compares a run of ``spawn_suite.py`` (its JUnit XML) with ``expected.py``.

    BACKEND=pccl_aio python -m pytest tests/torch_suite/spawn_suite.py -p no:cacheprovider \\
        -q --timeout 300 --junitxml=/tmp/suite_pccl.xml
    python -m tests.torch_suite.check_expected /tmp/suite_pccl.xml

Every test in ``GLOO_PASSES`` but those in ``GLOO_ONLY`` must have passed: the exit status
is 1 if one did not (``KNOWN_GAPS`` names the ones known to fail, with their error), 0 when
all did. ``--counts`` prints the passed / failed / errored / skipped counts of any run (gloo's
too) and nothing else.
"""

from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ET

from tests.torch_suite.expected import GLOO_ONLY, GLOO_PASSES, KNOWN_GAPS


def outcomes(path: str) -> dict[str, str]:
    """Test name -> "passed", "failed", "error" or "skipped", from pytest's JUnit XML."""
    result = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        kinds = {child.tag for child in case}
        if "error" in kinds:
            outcome = "error"
        elif "failure" in kinds:
            outcome = "failed"
        elif "skipped" in kinds:
            outcome = "skipped"
        else:
            outcome = "passed"
        name = case.get("name", "")
        # a setup/teardown error of a test that passed is its second <testcase>: keep the worse
        if result.get(name) in (None, "passed", "skipped"):
            result[name] = outcome
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("junit_xml")
    parser.add_argument("--counts", action="store_true", help="only print the counts")
    args = parser.parse_args(argv)
    got = outcomes(args.junit_xml)
    counts = {k: sum(v == k for v in got.values())
              for k in ("passed", "failed", "error", "skipped")}
    print(f"{len(got)} tests: " + ", ".join(f"{n} {k}" for k, n in counts.items()))
    if args.counts:
        return 0
    missing = sorted(set(GLOO_PASSES) - set(got))
    if missing:
        print(f"{len(missing)} of gloo's passing tests did not run (partial run?)")
    bad = []
    for name in GLOO_PASSES:
        if name not in got or got[name] == "passed":
            continue
        if name in GLOO_ONLY:
            print(f"  gloo only ({got[name]}): {name}: {GLOO_ONLY[name]}")
        else:
            bad.append(name)
    for name in bad:
        note = f"known: {KNOWN_GAPS[name]}" if name in KNOWN_GAPS else "NEW"
        print(f"  {got[name].upper()}: {name} ({note})")
    fixed = sorted(n for n in KNOWN_GAPS if got.get(n) == "passed")
    for name in fixed:
        print(f"  now passes, drop it from KNOWN_GAPS: {name}")
    print(f"{len(bad)} of gloo's passing tests do not pass here "
          f"({len(GLOO_ONLY)} gloo-only tests excepted)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
