"""Child side of :class:`grpokit.rewards.isolation.verifier.MathVerifier`: a math-verify server on
stdin/stdout.

Run as ``python -c <this file's source>`` (it imports nothing from grpokit). Protocol, one JSON object per
line: it first prints ``{"ready": true}``; then for each request
``{"op": "gold", "gold": str, "timeout": int}`` it answers ``{"result": true|false}`` (does the gold
answer parse?), and for ``{"op": "check", "gold": str, "answer": str, "timeout": int}`` it answers
``{"result": 1.0|0.0|null}`` (null: the gold answer does not parse).

math-verify's own ``signal.alarm`` timeouts work here because this is the process's main thread; they stop
slow pure-Python work. Work stuck inside C code (a 370-million-digit integer power) ignores signals: the
parent then kills this process after its hard timeout and starts a new one.
"""


def _parse(text, timeout):
    """math-verify parse of an answer or gold string.

    Text with LaTeX delimiters (``$``, ``\\(``, ``\\[``, ``\\boxed``) is parsed as is: math-verify finds
    the math in it. A bare expression (no English words once LaTeX commands are removed) is parsed as LaTeX
    wrapped in ``\\boxed{}`` first: parsed bare, ``2^{10}`` would give 2 and ``3\\sqrt{2}`` 3. Prose
    ("The answer is 5") is parsed as is first. Either way the other reading is the fallback.
    """
    import re

    from math_verify import parse

    boxed = "\\boxed{" + text + "}"
    if re.search(r"\$|\\\(|\\\[|\\boxed", text) or len(text) > 1000:
        attempts = [text]
    elif re.search(r"[A-Za-z]{2,}", re.sub(r"\\[A-Za-z]+", "", text)):
        attempts = [text, boxed]
    else:
        attempts = [boxed, text]
    for attempt in attempts:
        parsed = parse(attempt, parsing_timeout=timeout)
        if parsed:
            return parsed
    return []


def _handle(request, gold_cache):
    """Answer one request (see the module docstring)."""
    from math_verify import verify

    timeout = max(1, int(request.get("timeout", 1)))
    gold = request["gold"]
    if gold not in gold_cache:
        if len(gold_cache) > 4096:
            gold_cache.clear()
        gold_cache[gold] = _parse(gold, timeout)
    gold_parsed = gold_cache[gold]
    if request["op"] == "gold":
        return bool(gold_parsed)
    if not gold_parsed:
        return None
    answer_parsed = _parse(request["answer"], timeout)
    if not answer_parsed:
        return 0.0
    return 1.0 if verify(gold_parsed, answer_parsed, timeout_seconds=timeout) else 0.0


def _limit_resources(memory_mb):
    """Address-space cap, so a huge intermediate value raises MemoryError instead of exhausting the machine.

    (No PR_SET_PDEATHSIG: it fires when the *thread* that started us exits, and the parent starts workers
    from short-lived pool threads. A parent that dies closes our stdin, and the loop in ``main`` ends.)
    """
    import resource

    if memory_mb and int(memory_mb) > 0:
        limit = int(memory_mb) * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def main():
    """Serve requests until stdin closes."""
    import json
    import logging
    import sys

    logging.disable(logging.CRITICAL)  # math-verify logs whole (possibly megabyte) inputs on timeouts
    _limit_resources(sys.argv[1] if len(sys.argv) > 1 else None)
    import math_verify  # noqa: F401 - pay the import before announcing readiness

    gold_cache = {}
    sys.stdout.write(json.dumps({"ready": True}) + "\n")
    sys.stdout.flush()
    for line in sys.stdin:
        try:
            result = {"result": _handle(json.loads(line), gold_cache)}
        except Exception as error:  # a failed check is reported, never fatal to the server
            result = {"error": f"{type(error).__name__}: {error}"[:500]}
        sys.stdout.write(json.dumps(result) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
