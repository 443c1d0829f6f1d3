package integration

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/faultrouter/faultrouter/pkg/policy"
)

// timeFactor is FAULTROUTER_TIME_FACTOR, the factor compressedPolicy divides
// the default policy's durations by: 1,000 unless set.
func timeFactor(t *testing.T) int64 {
	s := os.Getenv("FAULTROUTER_TIME_FACTOR")
	if s == "" {
		return 1000
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 1 {
		t.Fatalf("FAULTROUTER_TIME_FACTOR=%q: want an integer >= 1", s)
	}
	return n
}

// notLifetimes are the _ms keys of the policy that are not times the router
// waits or measures but amounts of work: a task's budget of its workers'
// reported elapsed time stays what it is.
var notLifetimes = map[string]bool{"budget_exhausted.max_elapsed_ms": true}

// compressedPolicyYAML is the default policy with every duration (every key
// ending in _ms but the elapsed-time budget) divided by factor, at least
// 1 ms where it was not 0: with 1,000 a day of a task's life passes in
// 86.4 s and ai_product's 72 h review SLA in 4 min 19 s, so that a test of
// minutes lives days of tasks, review items, retries, breaker windows and
// expiries. Breakers and surge alerts stay on: it is the product's policy,
// only faster.
func compressedPolicyYAML(factor int64, set map[string]int64) string {
	var lines []string
	var walk func(v reflect.Value, path string, depth int)
	walk = func(v reflect.Value, path string, depth int) {
		indent := strings.Repeat("  ", depth)
		switch v.Kind() {
		case reflect.Map: // owners: by ID, in order
			keys := v.MapKeys()
			sort.Slice(keys, func(i, j int) bool { return keys[i].String() < keys[j].String() })
			for _, k := range keys {
				lines = append(lines, indent+k.String()+":")
				walk(v.MapIndex(k), path+"."+k.String(), depth+1)
			}
		case reflect.Struct:
			for i := range v.NumField() {
				f := v.Type().Field(i)
				tag, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
				if !f.IsExported() {
					continue
				}
				if tag == "" { // inline
					walk(v.Field(i), path, depth)
					continue
				}
				key := strings.TrimPrefix(path+"."+tag, ".")
				switch fv := v.Field(i); {
				case strings.HasSuffix(tag, "_ms") && fv.Kind() == reflect.Int64:
					ms := fv.Int()
					if v, ok := set[key]; ok {
						ms = v
					} else if !notLifetimes[key] && ms > 0 {
						ms = max(ms/factor, 1)
					}
					lines = append(lines, fmt.Sprintf("%s%s: %d", indent, tag, ms))
				case fv.Kind() == reflect.Struct || fv.Kind() == reflect.Map:
					n := len(lines)
					lines = append(lines, indent+tag+":")
					walk(fv, key, depth+1)
					if len(lines) == n+1 { // no durations inside
						lines = lines[:n]
					}
				}
			}
		}
	}
	walk(reflect.ValueOf(*policy.Default()), "", 0)
	head := fmt.Sprintf("# the default policy, every duration divided by %d", factor)
	for _, k := range slices.Sorted(maps.Keys(set)) {
		head += fmt.Sprintf("\n# except %s: %d", k, set[k])
	}
	return head + "\n" + strings.Join(lines, "\n") + "\n"
}

// compressedPolicy writes compressedPolicyYAML(FAULTROUTER_TIME_FACTOR, set)
// to a file for --policy and returns its path and the policy as the router
// loads it. set gives durations their value instead, by key
// ("breakers.provider_model.cooldown_ms").
func compressedPolicy(t *testing.T, set map[string]int64) (string, *policy.Policy) {
	t.Helper()
	y := compressedPolicyYAML(timeFactor(t), set)
	pol, err := policy.Parse([]byte(y))
	if err != nil {
		t.Fatalf("the compressed policy does not load: %v\n%s", err, y)
	}
	path := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(path, []byte(y), 0o644); err != nil {
		t.Fatal(err)
	}
	return path, pol
}

// Guards the compressed policy the checker and the soaks run on: every
// duration of the default policy is divided (the 72 h ai_product SLA is
// 4 min 19 s), nothing else changes, and the router's own loader accepts it.
func TestCompressedPolicy(t *testing.T) {
	pol, err := policy.Parse([]byte(compressedPolicyYAML(1000, nil)))
	if err != nil {
		t.Fatal(err)
	}
	def := policy.Default()
	if got := pol.Owners["ai_product"].SLAMs; got != 259_200 {
		t.Errorf("ai_product SLA %d ms, want 259200 (72 h / 1000)", got)
	}
	if pol.DefaultSLAMs != def.DefaultSLAMs/1000 || pol.Breakers.ProviderModel.CooldownMs != def.Breakers.ProviderModel.CooldownMs/1000 ||
		pol.NetworkTimeout.BaseDelayMs != def.NetworkTimeout.BaseDelayMs/1000 || pol.Surge.WindowMs != def.Surge.WindowMs/1000 ||
		pol.RateLimited.WindowMs != def.RateLimited.WindowMs/1000 {
		t.Errorf("a duration was not divided: %+v", pol)
	}
	if pol.Budget.MaxElapsedMs != def.Budget.MaxElapsedMs || pol.Breakers.ProviderModel.MinRequests != def.Breakers.ProviderModel.MinRequests ||
		len(pol.Surge.Classes) != len(def.Surge.Classes) || pol.RetryBudget != def.RetryBudget {
		t.Errorf("compressing changed what is not a lifetime: %+v", pol)
	}
}
