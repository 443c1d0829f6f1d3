package worker

import (
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// TestImportsNoRouter guards what a worker pulls in by importing this
// package: the records, their codec and the topic names, never the router,
// its policy, its breakers or its store (nor Pebble).
func TestImportsNoRouter(t *testing.T) {
	goTool := filepath.Join(runtime.GOROOT(), "bin", "go")
	out, err := exec.Command(goTool, "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	forbidden := []string{
		"github.com/faultrouter/faultrouter/internal/",
		"github.com/faultrouter/faultrouter/pkg/policy",
		"github.com/faultrouter/faultrouter/pkg/breaker",
		"github.com/cockroachdb/pebble",
	}
	deps := strings.Fields(string(out))
	if len(deps) < 10 {
		t.Fatalf("go list -deps listed only %v", deps)
	}
	for _, dep := range deps {
		for _, f := range forbidden {
			if strings.HasPrefix(dep, f) {
				t.Errorf("pkg/worker depends on %s", dep)
			}
		}
	}
}
