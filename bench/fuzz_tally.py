"""Run the hostile-input table of tests/fuzz_cases.py and print what happened, per category (issue 25's tally):
clear error / correctly accepted / traceback / silent / hang / crash, then every case that is neither of the first
two.

    PYTHONPATH=. python bench/fuzz_tally.py            # all cases (the child-process ones take a few seconds each)
    PYTHONPATH=. python bench/fuzz_tally.py --json tally.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.fuzz_cases import CASES, CATEGORIES, OUTCOMES, classify, tally  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", help="also write {case id: [outcome, detail]} here")
    args = parser.parse_args()
    results = {case_id: classify(case) for case_id, case in CASES.items()}
    counts = tally({case_id: outcome for case_id, (outcome, _) in results.items()})
    width = max(len(c) for c in CATEGORIES)
    print(f"{'category':<{width}}  " + "  ".join(f"{o:>18}" for o in OUTCOMES) + f"  {'cases':>6}")
    totals = dict.fromkeys(OUTCOMES, 0)
    for category in CATEGORIES:
        row = counts[category]
        for outcome in OUTCOMES:
            totals[outcome] += row[outcome]
        print(f"{category:<{width}}  " + "  ".join(f"{row[o]:>18}" for o in OUTCOMES) + f"  {sum(row.values()):>6}")
    print(f"{'total':<{width}}  " + "  ".join(f"{totals[o]:>18}" for o in OUTCOMES) + f"  {sum(totals.values()):>6}")
    failures = {k: v for k, v in results.items() if v[0] not in ("clear error", "correctly accepted")}
    for case_id, (outcome, detail) in failures.items():
        print(f"\n{outcome}: {case_id}\n    {detail[:400]}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
