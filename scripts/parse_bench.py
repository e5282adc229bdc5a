"""Time Python's prometheus_client text parser on the exposition the Rust bench wrote.

Usage: parse_bench.py FILE RUST_MB_PER_S

Parses FILE with prometheus_client.parser.text_string_to_metric_families, materialising
every sample (the generator is consumed and each family's samples listed), and reports
MB/s as the median of a few runs, then the ratio to the Rust parser's MB/s measured on the
same file in the same run.
"""

import statistics
import sys
import time

from prometheus_client.parser import text_string_to_metric_families


def parse_all(text: str) -> int:
    samples = 0
    for family in text_string_to_metric_families(text):
        samples += len(list(family.samples))
    return samples


def main() -> None:
    path, rust_mb_s = sys.argv[1], float(sys.argv[2])
    text = open(path, encoding="utf-8").read()
    megabytes = len(text.encode()) / 1e6
    samples = parse_all(text)  # warm-up, and the sample count
    times = []
    for _ in range(5):
        start = time.perf_counter()
        parse_all(text)
        times.append(time.perf_counter() - start)
    py_mb_s = megabytes / statistics.median(times)
    print(f"python prometheus_client parser: {py_mb_s:.2f} MB/s (median of 5 parses, {samples} samples)")
    print(f"ballast parser is {rust_mb_s / py_mb_s:.1f}x faster (goal: at least 20x)")


if __name__ == "__main__":
    main()
