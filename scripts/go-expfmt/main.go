// Command go-expfmt-bench times Go's Prometheus text parser, expfmt.TextParser from
// github.com/prometheus/common (what most Go tooling parses expositions with), on a file:
// the exposition `cargo bench -p ballast-operator --bench parse` writes, so the figure
// can be set beside the ballast parser's measured on the same bytes.
//
//	go-expfmt-bench [-n PARSES] FILE
//
// Each parse runs TextToMetricFamilies with a fresh TextParser over the file's bytes in
// memory (bytes.Reader), building every MetricFamily. MB/s is file bytes / 1e6 over the
// median parse time (the same definition as the Rust bench). Built and run by
// scripts/bench-parse-go.sh.
package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"sort"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
)

func parse(data []byte) (map[string]*dto.MetricFamily, error) {
	var p expfmt.TextParser
	return p.TextToMetricFamilies(bytes.NewReader(data))
}

// count tallies what the parse built: families by type, metrics, and the sample lines
// they hold (one per counter, gauge or untyped metric; buckets with +Inf, _sum and _count
// per histogram; quantiles, _sum and _count per summary), which should equal the file's
// sample lines. expfmt files prometheus_client's `x_created` lines as untyped families
// of their own, so they count as untyped.
func count(families map[string]*dto.MetricFamily) (types map[string]int, metrics, lines int) {
	types = map[string]int{}
	for _, mf := range families {
		types[strings.ToLower(mf.GetType().String())]++
		for _, m := range mf.GetMetric() {
			metrics++
			switch {
			case m.Histogram != nil:
				lines += len(m.Histogram.GetBucket()) + 2
			case m.Summary != nil:
				lines += len(m.Summary.GetQuantile()) + 2
			default:
				lines++
			}
		}
	}
	return types, metrics, lines
}

func main() {
	n := flag.Int("n", 30, "timed parses (the median is reported)")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: %s [-n PARSES] FILE\n", os.Args[0])
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() != 1 || *n < 1 {
		flag.Usage()
		os.Exit(2)
	}
	data, err := os.ReadFile(flag.Arg(0))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}

	// Warm-up, and the sanity check: the file must parse without error.
	families, err := parse(data)
	if err != nil {
		fmt.Fprintf(os.Stderr, "expfmt could not parse %s: %v\n", flag.Arg(0), err)
		os.Exit(1)
	}
	types, metrics, lines := count(families)
	var kinds []string
	for t := range types {
		kinds = append(kinds, t)
	}
	sort.Strings(kinds)
	for i, t := range kinds {
		kinds[i] = fmt.Sprintf("%d %s", types[t], t)
	}

	times := make([]time.Duration, *n)
	for i := range times {
		start := time.Now()
		if _, err := parse(data); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		times[i] = time.Since(start)
	}
	sort.Slice(times, func(i, j int) bool { return times[i] < times[j] })
	median := times[*n/2].Seconds()
	megabytes := float64(len(data)) / 1e6

	fmt.Printf("input: %s, %.2f MB: %d families (%s), %d metrics, %d samples\n",
		flag.Arg(0), megabytes, len(families), strings.Join(kinds, ", "), metrics, lines)
	fmt.Printf("go expfmt TextParser: %.1f MB/s (median of %d parses, %.2f ms each)\n",
		megabytes/median, *n, median*1e3)
}
