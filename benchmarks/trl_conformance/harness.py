"""Run TRL's GRPO test file on TRL and on grpokit, compare, print and write a summary (stdlib only).

run.sh prepares everything (environments, TRL's test files, stand-ins) and then calls

    python harness.py --trl-python P --grpokit-python Q [--timeout S] [-k EXPR] [--reuse] [-- pytest args]

Each side runs ``pytest`` on its copy of the test file (vendor/trl_tests: verbatim; vendor/grpokit_tests: the
GRPOConfig/GRPOTrainer import changed to grpokit) with the local Hugging Face cache in offline mode and a
JUnit XML report. The denominator is the tests that pass on TRL; grpokit's result on each of those is
counted, and each one that does not pass is grouped by cause: exception type + the first 80 characters of
its message's first line.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections import Counter, defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
WORK = HERE / ".work"
RESULTS = ROOT / "benchmarks" / "results"
NOT_BUILT = "stand-in not built"
TEST_FILE = "test_grpo_trainer.py"


def run_side(side: str, python: str, deps: Path, timeout: int, pytest_args: list[str]) -> tuple[Path, float]:
    """One pytest run; returns the JUnit XML path and the wall time."""
    WORK.mkdir(exist_ok=True)
    xml = WORK / f"{side}.xml"
    log = WORK / f"{side}.log"
    env = dict(os.environ)
    # grpokit's side imports this checkout's src/ (a worktree tests its own code, not the installed copy)
    paths = [str(deps), str(HERE), *([str(ROOT / "src")] if side == "grpokit" else [])]
    env.update(
        HF_HOME=str(HERE / ".hf_home"),
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HF_HUB_DISABLE_TELEMETRY="1",
        WANDB_DISABLED="true",
        TOKENIZERS_PARALLELISM="false",
        PYTHONPATH=os.pathsep.join(paths),
    )
    cmd = [
        python, "-m", "pytest", "-c", str(HERE / "pytest.ini"), "--rootdir", str(HERE / "vendor"),
        f"{side}_tests/{TEST_FILE}", "-p", "no:cacheprovider", "-rA", "--junitxml", str(xml),
        "--timeout", str(timeout), *pytest_args,
    ]  # fmt: skip
    print(f"[{side}] {' '.join(cmd[2:])}  (log: {log.relative_to(ROOT)})", flush=True)
    start = time.monotonic()
    with open(log, "w") as fh:
        subprocess.run(cmd, cwd=HERE / "vendor", env=env, stdout=fh, stderr=subprocess.STDOUT, check=False)
    wall = time.monotonic() - start
    print(f"[{side}] done in {wall / 60:.1f} min", flush=True)
    return xml, wall


def parse_junit(xml: Path) -> dict[str, dict]:
    """test id -> {"outcome": passed|failed|error|skipped|xfailed, "message": ..., "type": exception type}."""
    results: dict[str, dict] = {}
    for case in ET.parse(xml).getroot().iter("testcase"):
        test_id = f"{case.get('classname', '').split('.')[-1]}::{case.get('name')}"
        outcome, message, exc_type = "passed", "", ""
        for child in case:
            if child.tag in ("failure", "error"):
                outcome = "failed" if child.tag == "failure" else "error"
                message = child.get("message") or (child.text or "")
                exc_type = child.get("type") or ""
                break
            if child.tag == "skipped":
                outcome = "xfailed" if child.get("type") == "pytest.xfail" else "skipped"
                message = child.get("message") or ""
                break
        results[test_id] = {
            "outcome": outcome,
            "message": message,
            "type": exc_type,
            "time": case.get("time"),
        }
    return results


def cause(result: dict) -> str:
    """Exception type + first 80 characters of the message's first line (addresses normalised).

    Two refinements: a bare ``assert ...`` message is an AssertionError; a ``pytest.raises(match=...)``
    mismatch ("Regex pattern did not match.") is labelled with the exception's actual message instead, since
    the first line is the same for every mismatch.
    """
    message = result["message"].strip()
    if result["outcome"] == "skipped":
        return "skipped: " + message.splitlines()[0][:80] if message else "skipped"
    lines = message.splitlines() or [""]
    first = re.sub(r"0x[0-9a-f]+", "0x…", lines[0])
    if first.endswith("Regex pattern did not match."):
        actual = next((ln.split(":", 1)[1].strip() for ln in lines if "Actual message:" in ln), "")
        return f"raises(match=) mismatch, actual: {actual.strip(chr(34) + chr(39))[:80]}"
    if first.startswith("assert "):
        first = "AssertionError: " + first
    match = re.match(r"^([A-Za-z_][\w.]*):\s?(.*)$", first)
    if match and match.group(1).split(".")[-1][:1].isupper():
        exc, text = match.group(1).split(".")[-1], match.group(2)
    else:
        exc, text = (result["type"] or "").split(".")[-1] or result["outcome"], first
    if exc == "Failed" and text.startswith("Timeout"):
        return "Timeout (pytest-timeout)"
    return f"{exc}: {text[:80]}"


def read_lock() -> dict:
    """Repository, commit and VERSION of the TRL test files (trl_tests.lock)."""
    info = {}
    for line in (HERE / "trl_tests.lock").read_text().splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] in ("repo", "commit", "version"):
            info[parts[0]] = parts[1]
    return info


def package_version(python: str, package: str) -> str:
    out = subprocess.run(
        [python, "-c", f"import importlib.metadata as m; print(m.version({package!r}))"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    return out.stdout.strip() or "?"


def summarise(trl: dict[str, dict], grpokit: dict[str, dict], walls: dict[str, float], args) -> dict:
    trl_passed = sorted(t for t, r in trl.items() if r["outcome"] == "passed")
    grpokit_passed = sorted(t for t in trl_passed if grpokit.get(t, {}).get("outcome") == "passed")
    groups: dict[str, list[str]] = defaultdict(list)
    for test_id in trl_passed:
        if test_id in grpokit_passed:
            continue
        result = grpokit.get(test_id, {"outcome": "error", "message": "not run on grpokit", "type": ""})
        groups[cause(result)].append(test_id)
    ordered = sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0]))

    trl_counts = Counter(r["outcome"] for r in trl.values())
    not_built = sorted(t for t, r in trl.items() if r["outcome"] == "skipped" and NOT_BUILT in r["message"])
    trl_skip_reasons = Counter(
        r["message"].split(":")[0] if NOT_BUILT in r["message"] else r["message"]
        for r in trl.values()
        if r["outcome"] == "skipped"
    )
    trl_not_passing = {t: cause(r) for t, r in sorted(trl.items()) if r["outcome"] in ("failed", "error")}
    grpokit_extra = sorted(
        t
        for t, r in grpokit.items()
        if r["outcome"] == "passed" and trl.get(t, {}).get("outcome") != "passed"
    )
    return {
        "date": dt.date.today().isoformat(),
        "trl_tests": {**read_lock(), "trl_package": args.trl_package},
        "k": args.k,
        "only": getattr(args, "only", None),  # the side run this time; the other's report is its last run's
        "timeout_s": args.timeout,
        "collected": len(trl),
        "trl": {"counts": dict(trl_counts), "wall_min": round(walls.get("trl", 0) / 60, 1)},
        "grpokit": {
            "counts": dict(Counter(r["outcome"] for r in grpokit.values())),
            "wall_min": round(walls.get("grpokit", 0) / 60, 1),
        },
        "denominator": len(trl_passed),
        "grpokit_passed": len(grpokit_passed),
        "grpokit_passed_tests": grpokit_passed,
        "failure_groups": [{"cause": c, "count": len(ts), "tests": ts} for c, ts in ordered],
        "stand_in_not_built": not_built,
        "trl_skip_reasons": dict(trl_skip_reasons.most_common()),
        "trl_not_passing": trl_not_passing,
        "grpokit_passes_where_trl_does_not": grpokit_extra,
    }


def render_markdown(summary: dict) -> str:
    lock = summary["trl_tests"] or {}
    lines = [
        f"# TRL GRPO test suite on grpokit ({summary['date']})",
        "",
        f"TRL's `tests/test_grpo_trainer.py` at {lock.get('commit', '?')} "
        f"(VERSION {lock.get('version', '?')}), "
        f"run on TRL {lock.get('trl_package', '?')} and on grpokit with only `from trl import GRPOConfig, "
        "GRPOTrainer` changed; CPU, local stand-ins, offline. "
        "Produced by `bash benchmarks/trl_conformance/run.sh`"
        + (f" with `-k {summary['k']}`" if summary["k"] else "")
        + (f" with `--only {summary['only']}` (the other side: the report of its last run, same test file)"
           if summary.get("only") else "")
        + ".",
        "",
        f"**TRL: {summary['denominator']} passed; grpokit: {summary['grpokit_passed']} passed** "
        f"(of the {summary['denominator']} that pass on TRL).",
        "",
        f"- collected: {summary['collected']}; TRL outcomes: {summary['trl']['counts']} "
        f"({summary['trl']['wall_min']} min); grpokit outcomes: {summary['grpokit']['counts']} "
        f"({summary['grpokit']['wall_min']} min)",
        f"- skipped on TRL because a stand-in is not built: {len(summary['stand_in_not_built'])}",
        "- TRL's skip reasons: "
        + "; ".join(f"{reason or '(none)'} ×{n}" for reason, n in summary["trl_skip_reasons"].items()),
        f"- fail on TRL too (not counted): {len(summary['trl_not_passing'])}",
        "- pass on grpokit but not on TRL (not counted): "
        f"{len(summary['grpokit_passes_where_trl_does_not'])}",
        "",
        "## grpokit's failures on tests that pass on TRL, by cause",
        "",
        "| tests | cause (exception: first 80 characters) | tests |",
        "| ---: | --- | --- |",
    ]
    for group in summary["failure_groups"]:
        cause_md = group["cause"].replace("|", "\\|")
        names = ", ".join(f"`{t.split('::', 1)[1]}`" for t in group["tests"])
        lines.append(f"| {group['count']} | {cause_md} | {names} |")
    lines += ["", "## Passing on grpokit", ""]
    lines += [f"- `{t}`" for t in summary["grpokit_passed_tests"]] or ["(none)"]
    if summary["trl_not_passing"]:
        lines += ["", "## Failing on TRL with the stand-ins (not counted)", ""]
        lines += [f"- `{t}`: {c}" for t, c in summary["trl_not_passing"].items()]
    return "\n".join(lines) + "\n"


def print_report(summary: dict, top: int) -> None:
    print()
    print(f"TRL: {summary['denominator']} passed; grpokit: {summary['grpokit_passed']} passed")
    print(
        f"(collected {summary['collected']}; TRL {summary['trl']['counts']}; "
        f"stand-in not built: {len(summary['stand_in_not_built'])}; grpokit {summary['grpokit']['counts']})"
    )
    print("\ngrpokit's failures on tests that pass on TRL, by cause:")
    for group in summary["failure_groups"][:top]:
        examples = ", ".join(t.split("::", 1)[1] for t in group["tests"][:3])
        more = f" (+{group['count'] - 3} more)" if group["count"] > 3 else ""
        print(f"  {group['count']:4d}  {group['cause']}\n        e.g. {examples}{more}")
    if len(summary["failure_groups"]) > top:
        rest = sum(g["count"] for g in summary["failure_groups"][top:])
        print(
            f"  ... {len(summary['failure_groups']) - top} more causes ({rest} tests): "
            "see the markdown summary"
        )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trl-python", required=True)
    parser.add_argument("--grpokit-python", required=True)
    parser.add_argument(
        "--timeout", type=int, default=1800, help="per-test timeout in seconds (pytest-timeout)"
    )
    parser.add_argument("-k", dest="k", default=None, help="pytest -k expression (a subset), both sides")
    parser.add_argument(
        "--reuse", action="store_true", help="summarise the last run's XML reports, run nothing"
    )
    parser.add_argument(
        "--only",
        choices=("trl", "grpokit"),
        default=None,
        help="run one side and summarise it against the other side's last report (TRL's side does not "
        "change while grpokit is developed: --only grpokit reruns grpokit's side alone)",
    )
    parser.add_argument("--top", type=int, default=15, help="failure groups to print")
    parser.add_argument(
        "--tag",
        default="",
        help="suffix for the results files (default: 'subset' with -k or pytest arguments)",
    )
    parser.add_argument("pytest_args", nargs="*", help="extra pytest arguments, after --")
    args = parser.parse_args(argv)

    args.trl_package = package_version(args.trl_python, "trl")
    extra = list(args.pytest_args) + (["-k", args.k] if args.k else [])
    walls: dict[str, float] = {}
    xmls = {"trl": WORK / "trl.xml", "grpokit": WORK / "grpokit.xml"}
    walls_file = WORK / "walls.json"
    if args.reuse or args.only:
        walls = json.loads(walls_file.read_text()) if walls_file.exists() else {}
    if not args.reuse:
        pythons = {"trl": args.trl_python, "grpokit": args.grpokit_python}
        for side in [args.only] if args.only else ["trl", "grpokit"]:
            xmls[side], walls[side] = run_side(
                side, pythons[side], HERE / ".deps" / f"{side}-side", args.timeout, extra
            )
        walls_file.write_text(json.dumps(walls) + "\n")
    for side, xml in xmls.items():
        if not xml.exists():
            print(f"no report from the {side} run ({xml}); see {WORK / (side + '.log')}", file=sys.stderr)
            return 1
    summary = summarise(parse_junit(xmls["trl"]), parse_junit(xmls["grpokit"]), walls, args)
    RESULTS.mkdir(parents=True, exist_ok=True)
    tag = args.tag or ("subset" if args.k or args.pytest_args else "")  # a subset never overwrites a full run
    stem = f"trl_conformance-{summary['date']}" + (f"-{tag}" if tag else "")
    (RESULTS / f"{stem}.json").write_text(json.dumps(summary, indent=2) + "\n")
    (RESULTS / f"{stem}.md").write_text(render_markdown(summary))
    print_report(summary, args.top)
    print(f"\nwritten: benchmarks/results/{stem}.json, benchmarks/results/{stem}.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
