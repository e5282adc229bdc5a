module ballast.dev/go-expfmt-bench

go 1.27

// The versions vendored by Kubernetes v1.28.4: scripts/bench-parse-go.sh takes these
// packages from that snapshot's vendor/ at build time (nothing is downloaded).
require (
	github.com/prometheus/client_model v0.4.0
	github.com/prometheus/common v0.44.0
)

require (
	github.com/golang/protobuf v1.5.3 // indirect
	github.com/matttproud/golang_protobuf_extensions v1.0.4 // indirect
	google.golang.org/protobuf v1.31.0 // indirect
)
