#!/usr/bin/env python3
"""Markdown summary of a scripts/bench-anchor.sh run: one table per case, each round's figure
for both servers and their ratio, then the range over the rounds, the client's failures and
resends, and llama-bench's table.

    python3 scripts/anchor_summary.py target/bench-anchor/<run>
"""

import json
import re
import sys
from pathlib import Path

SERVERS = ("ballast", "llama")


def load(run, r, server, case):
    d = run / f"round{r}"
    p = d / f"{server}-{case}.json"
    if not p.is_file():
        return None
    rep = json.loads(p.read_text())
    lp = d / f"{server}-{case}.load"
    rep["_other_load"] = float(lp.read_text()) if lp.is_file() else None
    return rep


def decode(rep):
    t = rep.get("tpot_s")
    return 1.0 / t["mean"] if t and t["mean"] > 0 else None


def ttft_ms(rep):
    t = rep.get("ttft_s")
    return 1000.0 * t["p50"] if t else None


def out_rate(rep):
    return rep.get("output_tokens_per_s")


def tpot_ms(rep):
    t = rep.get("tpot_s")
    return 1000.0 * t["mean"] if t else None


def fmt(x, unit=""):
    if x is None:
        return "–"
    if x >= 1000:
        s = f"{x:,.0f}"
    elif x >= 100:
        s = f"{x:.0f}"
    else:
        s = f"{x:.1f}"
    return s + unit


def ratio(a, b):
    return None if a is None or b is None or b == 0 else a / b


def fmt_ratio(x):
    return "–" if x is None else f"{x:.2f}×"


def span(xs, f):
    xs = [x for x in xs if x is not None]
    if not xs:
        return "–"
    lo, hi = min(xs), max(xs)
    return f(lo) if f(lo) == f(hi) else f"{f(lo)}–{f(hi)}"


def table(run, rounds, case, cols):
    """cols: (header, metric, higher_is_better, unit). The ratio is Ballast's advantage:
    ballast / llama when higher is better, llama / ballast when lower is."""
    reps = {r: {s: load(run, r, s, case) for s in SERVERS} for r in rounds}
    if not any(reps[r][s] for r in rounds for s in SERVERS):
        return None
    head = ["round"]
    for h, _, _, _ in cols:
        head += [f"Ballast {h}", f"llama-server {h}", "ratio"]
    head += ["other load B / L"]
    lines = ["| " + " | ".join(head) + " |", "|" + " ---: |" * len(head)]
    acc = [([], [], []) for _ in cols]
    for r in rounds:
        b, l = reps[r]["ballast"], reps[r]["llama"]
        row = [str(r)]
        for i, (_, m, hib, unit) in enumerate(cols):
            vb = m(b) if b else None
            vl = m(l) if l else None
            q = ratio(vb, vl) if hib else ratio(vl, vb)
            acc[i][0].append(vb)
            acc[i][1].append(vl)
            acc[i][2].append(q)
            row += [fmt(vb, unit), fmt(vl, unit), fmt_ratio(q)]
        loads = [x["_other_load"] if x else None for x in (b, l)]
        row.append(" / ".join("–" if x is None else f"{x:.2f}" for x in loads))
        lines.append("| " + " | ".join(row) + " |")
    row = ["**all**"]
    for i, (_, _, _, unit) in enumerate(cols):
        row += [span(acc[i][0], lambda x: fmt(x, unit)), span(acc[i][1], lambda x: fmt(x, unit)),
                "**" + span(acc[i][2], fmt_ratio) + "**"]
    row.append("")
    lines.append("| " + " | ".join(row) + " |")
    prompt = [reps[r][s].get("mean_prompt_tokens") for r in rounds for s in SERVERS if reps[r][s]]
    compl = [reps[r][s].get("mean_completion_tokens") for r in rounds for s in SERVERS if reps[r][s]]
    lines.append("")
    lines.append(f"Mean prompt tokens per request as the servers counted them: "
                 f"{span(prompt, lambda x: f'{x:.0f}')}; completion tokens: {span(compl, lambda x: f'{x:.0f}')}.")
    return "\n".join(lines)


def main():
    run = Path(sys.argv[1])
    rounds = sorted(int(p.name[5:]) for p in run.glob("round*") if p.name[5:].isdigit())
    meta = (run / "meta.txt").read_text() if (run / "meta.txt").is_file() else ""
    print(f"# llama-server anchor: {run.name}\n")
    print("```\n" + meta.strip() + "\n```\n")
    quiet = [(run / f"round{r}" / "quiet.load") for r in rounds]
    print("Cores busy with other work just before each round: "
          + ", ".join(q.read_text().strip() if q.is_file() else "–" for q in quiet) + ".\n")

    dec = ("decode (1/TPOT)", decode, True, " tok/s")
    ttft = ("TTFT p50", ttft_ms, False, " ms")
    cases = [
        ("single", "Single stream, Q4_1: 128 prompt + 128 output tokens, EOS ignored, 8 requests",
         [dec, ttft]),
        ("single_q4_0", "Single stream, Q4_0 (requantized from the Q4_1 file): 128 + 128, 8 requests",
         [dec, ttft]),
        ("prefill512", "Prefill, 512 prompt tokens (16 output), Q4_1, 4 requests", [ttft]),
        ("prefill2048", "Prefill, 2,048 prompt tokens (16 output), Q4_1, 3 requests", [ttft]),
        ("conc", "16 concurrent, Q4_1: 128 + 128, EOS ignored, 48 requests",
         [("output", out_rate, True, " tok/s"), ttft, ("TPOT", tpot_ms, False, " ms")]),
        ("prefix", "16 concurrent with a shared system prompt, Q4_1: 640 prompt tokens of which "
         "the first 512 are the same for every request, 128 output, 48 requests",
         [("output", out_rate, True, " tok/s"), ttft, ("TPOT", tpot_ms, False, " ms")]),
    ]
    for case, title, cols in cases:
        t = table(run, rounds, case, cols)
        if t:
            print(f"## {title}\n\n{t}\n")

    inproc = []
    for r in rounds:
        p = run / f"round{r}" / "inprocess.txt"
        m = re.search(r"^decode\s+([\d.]+) tok/s", p.read_text(), re.M) if p.is_file() else None
        pf = re.search(r"^prefill\s+([\d.]+) tok/s", p.read_text(), re.M) if p.is_file() else None
        served = load(run, r, "ballast", "single")
        if m:
            d = decode(served) if served else None
            inproc.append(f"| {r} | {float(pf.group(1)) if pf else 0:,.0f} tok/s | {float(m.group(1)):.1f} tok/s | "
                          f"{fmt(d, ' tok/s')} | {'–' if d is None else f'{100 * d / float(m.group(1)):.0f} %'} |")
    if inproc:
        print("## The engine's forward pass in-process (engine/benches/real_model.rs, 2 threads, "
              "Q4_1, 128 + 128) against its decode through HTTP streaming\n")
        print("| round | in-process prefill | in-process decode | served decode (1/TPOT) | served / in-process |")
        print("| ---: | ---: | ---: | ---: | ---: |")
        print("\n".join(inproc) + "\n")

    print("## Client-side outcomes (`ballast bench`)\n")
    print("| server | requests | ok | failed | rejected (429) | resent (`requests.retried`) | errors |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | --- |")
    for s in SERVERS:
        tot = {"total": 0, "ok": 0, "failed": 0, "rejected": 0, "retried": 0}
        errs = {}
        for p in sorted(run.glob(f"round*/{s}-*.json")):
            rep = json.loads(p.read_text())
            for k in tot:
                tot[k] += rep["requests"].get(k, 0)
            for e in rep.get("errors", []):
                errs[e["message"]] = errs.get(e["message"], 0) + e["count"]
        name = "Ballast engine" if s == "ballast" else "llama-server"
        e = "; ".join(f"{m} ({n})" for m, n in errs.items()) or "none"
        print(f"| {name} | {tot['total']} | {tot['ok']} | {tot['failed']} | {tot['rejected']} | "
              f"{tot['retried']} | {e} |")
    print()
    lb = run / "llama-bench.md"
    if lb.is_file() and lb.read_text().strip():
        print("## llama-bench (2 threads, 3 repetitions; pp = prompt processing, tg = generation)\n")
        print(lb.read_text().strip() + "\n")


if __name__ == "__main__":
    main()
