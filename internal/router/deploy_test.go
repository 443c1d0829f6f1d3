package router

import (
	"os"
	"regexp"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/internal/router/hold"
	"github.com/faultrouter/faultrouter/pkg/policy"
)

// recorder is a Registerer that remembers the collectors registered with it.
type recorder struct {
	prometheus.Registerer
	cs []prometheus.Collector
}

func (r *recorder) Register(c prometheus.Collector) error {
	r.cs = append(r.cs, c)
	return r.Registerer.Register(c)
}

func (r *recorder) MustRegister(cs ...prometheus.Collector) {
	r.cs = append(r.cs, cs...)
	r.Registerer.MustRegister(cs...)
}

// TestDeployFilesNameRealMetrics guards the Grafana dashboard and the
// Prometheus alert rules: every faultrouter_* series they query is a metric
// the router registers (its own, the breakers' or franz-go's kprom ones).
func TestDeployFilesNameRealMetrics(t *testing.T) {
	rec := &recorder{Registerer: prometheus.NewRegistry()}
	m := newMetrics(rec)
	if _, err := hold.New(policy.Default(), rec); err != nil {
		t.Fatal(err)
	}
	// kprom registers its metrics when a client is created
	cl, err := kgo.NewClient(kgo.SeedBrokers("127.0.0.1:1"), kgo.WithHooks(m.kprom))
	if err != nil {
		t.Fatal(err)
	}
	cl.Close()

	fq := regexp.MustCompile(`fqName: "([a-z_]+)"`)
	known := map[string]bool{}
	add := func(c prometheus.Collector) {
		ch := make(chan *prometheus.Desc, 64)
		go func() { c.Describe(ch); close(ch) }()
		for d := range ch {
			if mm := fq.FindStringSubmatch(d.String()); mm != nil {
				known[mm[1]] = true
			}
		}
	}
	for _, c := range rec.cs {
		add(c)
	}
	if !known["faultrouter_breakers"] || !known["faultrouter_routed_total"] || !known["faultrouter_fetch_bytes_total"] {
		t.Fatalf("the recorder missed collectors: %v", known)
	}

	series := regexp.MustCompile(`faultrouter_[a-z_]+`)
	for _, f := range []string{"../../deploy/grafana/faultrouter-dashboard.json", "../../deploy/prometheus/alerts.yml"} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range series.FindAllString(string(b), -1) {
			base := regexp.MustCompile(`_(bucket|sum|count)$`).ReplaceAllString(name, "")
			if !known[name] && !known[base] {
				t.Errorf("%s queries %s, which the router does not register", f, name)
			}
		}
	}
}
