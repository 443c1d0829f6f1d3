// Package helm holds the test of the Helm chart in helm/faultrouter.
package helm

import (
	"bytes"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

// render runs `helm template` on the chart with args and returns the
// rendered objects by kind.
func render(t *testing.T, args ...string) map[string][]map[string]any {
	t.Helper()
	helm := os.Getenv("HELM")
	if helm == "" {
		t.Skip("HELM is not set: no helm binary to render the chart with; helm/check.sh builds one and sets it")
	}
	cmd := exec.Command(helm, append([]string{"template", "fr", "faultrouter"}, args...)...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		t.Fatalf("helm template: %v\n%s", err, errOut.String())
	}
	objs := map[string][]map[string]any{}
	dec := yaml.NewDecoder(&out)
	for {
		var m map[string]any
		err := dec.Decode(&m)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("rendered YAML: %v", err)
		}
		if m != nil {
			k, _ := m["kind"].(string)
			objs[k] = append(objs[k], m)
		}
	}
	return objs
}

func at(v any, path ...any) any {
	for _, p := range path {
		switch k := p.(type) {
		case string:
			m, _ := v.(map[string]any)
			v = m[k]
		case int:
			l, _ := v.([]any)
			if k >= len(l) {
				return nil
			}
			v = l[k]
		}
	}
	return v
}

// Guards the chart contract: a StatefulSet whose pod name is the
// --instance-id, a PVC for Pebble, the policy from a ConfigMap, Kafka
// credentials from a Secret, /healthz and /readyz probes on the metrics port,
// a non-root read-only security context, a metrics Service, an optional
// ServiceMonitor and a PodDisruptionBudget.
func TestChartRendersTheDeployment(t *testing.T) {
	objs := render(t, "--set", "metrics.serviceMonitor.enabled=true", "--set", "kafka.existingSecret=kafka-creds",
		"--set-string", "policy=version: 1")
	for _, kind := range []string{"StatefulSet", "Service", "ConfigMap", "ServiceMonitor", "PodDisruptionBudget"} {
		if len(objs[kind]) == 0 {
			t.Errorf("no %s rendered", kind)
		}
	}
	if len(objs["Secret"]) != 0 {
		t.Errorf("a Secret was rendered although kafka.existingSecret is set")
	}
	if len(objs["StatefulSet"]) != 1 {
		t.Fatalf("%d StatefulSets, want 1", len(objs["StatefulSet"]))
	}
	sts := objs["StatefulSet"][0]
	c := at(sts, "spec", "template", "spec", "containers", 0)
	var args []string
	for _, a := range at(c, "args").([]any) {
		args = append(args, a.(string))
	}
	for _, want := range []string{"run", "--instance-id=$(POD_NAME)", "--static-membership", "--session-timeout=10s", "--state-dir=/var/lib/faultrouter", "--policy=/etc/faultrouter/policy.yaml", "--metrics-addr=:9464"} {
		if !slices.Contains(args, want) {
			t.Errorf("args %v lack %s", args, want)
		}
	}
	env := map[string]any{}
	for _, e := range at(c, "env").([]any) {
		env[at(e, "name").(string)] = e
	}
	if at(env["POD_NAME"], "valueFrom", "fieldRef", "fieldPath") != "metadata.name" {
		t.Errorf("POD_NAME is not the pod name: %v", env["POD_NAME"])
	}
	for _, k := range []string{"FAULTROUTER_SASL_USER", "FAULTROUTER_SASL_PASSWORD"} {
		if at(env[k], "valueFrom", "secretKeyRef", "name") != "kafka-creds" {
			t.Errorf("%s does not come from the existing Secret: %v", k, env[k])
		}
	}
	for probe, path := range map[string]string{"livenessProbe": "/healthz", "readinessProbe": "/readyz"} {
		if at(c, probe, "httpGet", "path") != path || at(c, probe, "httpGet", "port") != "metrics" {
			t.Errorf("%s: %v, want %s on port metrics", probe, at(c, probe), path)
		}
	}
	if at(c, "ports", 0, "containerPort") != 9464 {
		t.Errorf("metrics port %v, want 9464", at(c, "ports", 0, "containerPort"))
	}
	sc := at(c, "securityContext")
	if at(sc, "runAsNonRoot") != true || at(sc, "readOnlyRootFilesystem") != true || at(sc, "allowPrivilegeEscalation") != false ||
		at(sc, "capabilities", "drop", 0) != "ALL" {
		t.Errorf("container securityContext %v", sc)
	}
	if at(sts, "spec", "template", "spec", "securityContext", "runAsNonRoot") != true {
		t.Errorf("pod securityContext lacks runAsNonRoot")
	}
	if at(sts, "spec", "volumeClaimTemplates", 0, "metadata", "name") != "state" {
		t.Errorf("no PVC template named state: %v", at(sts, "spec", "volumeClaimTemplates"))
	}
	mounted := false
	for _, m := range at(c, "volumeMounts").([]any) {
		if at(m, "name") == "state" && at(m, "mountPath") == "/var/lib/faultrouter" {
			mounted = true
		}
	}
	if !mounted {
		t.Errorf("the state PVC is not mounted on the --state-dir")
	}
	if at(c, "resources", "requests") == nil {
		t.Errorf("no resource requests")
	}
	if cm := objs["ConfigMap"][0]; !strings.Contains(at(cm, "data", "policy.yaml").(string), "version: 1") {
		t.Errorf("policy ConfigMap %v", cm)
	}
}

// Guards the defaults: without credentials, a policy or a ServiceMonitor the
// chart renders no Secret, ConfigMap or ServiceMonitor and no --policy flag;
// with kafka.user it creates the Secret itself.
func TestChartDefaultsAndCreatedSecret(t *testing.T) {
	objs := render(t)
	for _, kind := range []string{"Secret", "ConfigMap", "ServiceMonitor"} {
		if len(objs[kind]) != 0 {
			t.Errorf("%s rendered by default", kind)
		}
	}
	for _, a := range at(objs["StatefulSet"][0], "spec", "template", "spec", "containers", 0, "args").([]any) {
		if strings.HasPrefix(a.(string), "--policy") {
			t.Errorf("--policy without a policy: %v", a)
		}
	}
	objs = render(t, "--set", "kafka.user=router", "--set", "kafka.password=secret")
	if len(objs["Secret"]) != 1 || at(objs["Secret"][0], "stringData", "sasl-user") != "router" {
		t.Fatalf("chart-created Secret: %v", objs["Secret"])
	}
}

// Guards the console in the chart: off by default; on, a Deployment running
// `faultrouter console` with the users file mounted from a Secret and the
// session secret from it, a Service, an optional Ingress to that Service;
// its pods are not selected by the router's StatefulSet or Services; and it
// refuses to render without a way to authenticate.
func TestChartRendersTheConsole(t *testing.T) {
	for _, kind := range []string{"Deployment", "Ingress"} {
		if n := len(render(t)[kind]); n != 0 {
			t.Errorf("%d %s rendered with the console disabled", n, kind)
		}
	}
	users := "users:\n  - {name: alice, password_bcrypt: x, roles: [reviewer], owners: [\"*\"]}\n"
	usersFile := filepath.Join(t.TempDir(), "users.yaml")
	if err := os.WriteFile(usersFile, []byte(users), 0o600); err != nil {
		t.Fatal(err)
	}
	objs := render(t, "--set", "console.enabled=true", "--set-file", "console.users="+usersFile,
		"--set", "console.ingress.enabled=true", "--set", "console.ingress.host=console.test", "--set-string", "policy=version: 1")
	if len(objs["Deployment"]) != 1 || len(objs["Ingress"]) != 1 {
		t.Fatalf("console: %d Deployments, %d Ingresses, want 1 and 1", len(objs["Deployment"]), len(objs["Ingress"]))
	}
	d := objs["Deployment"][0]
	c := at(d, "spec", "template", "spec", "containers", 0)
	var args []string
	for _, a := range at(c, "args").([]any) {
		args = append(args, a.(string))
	}
	for _, want := range []string{"console", "--listen=:8080", "--users=/etc/faultrouter-console/users.yaml", "--policy=/etc/faultrouter/policy.yaml"} {
		if !slices.Contains(args, want) {
			t.Errorf("console args %v lack %s", args, want)
		}
	}
	if slices.Contains(args, "--trust-proxy-header") {
		t.Errorf("the proxy header is trusted without console.trustProxyHeader")
	}
	var secret map[string]any
	for _, s := range objs["Secret"] {
		if at(s, "metadata", "name") == "fr-faultrouter-console" {
			secret = s
		}
	}
	if secret == nil || at(secret, "stringData", "users.yaml") != users || at(secret, "stringData", "session-secret") == "" {
		t.Fatalf("console Secret %v, want the users file and a session secret", secret)
	}
	mounted := false
	for _, v := range at(d, "spec", "template", "spec", "volumes").([]any) {
		if at(v, "name") == "users" && at(v, "secret", "secretName") == "fr-faultrouter-console" {
			mounted = true
		}
	}
	if !mounted {
		t.Errorf("the users file is not mounted from the console Secret")
	}
	env := map[string]any{}
	for _, e := range at(c, "env").([]any) {
		env[at(e, "name").(string)] = e
	}
	if at(env["FAULTROUTER_CONSOLE_SECRET"], "valueFrom", "secretKeyRef", "name") != "fr-faultrouter-console" {
		t.Errorf("FAULTROUTER_CONSOLE_SECRET does not come from the console Secret: %v", env["FAULTROUTER_CONSOLE_SECRET"])
	}
	if at(c, "securityContext", "readOnlyRootFilesystem") != true {
		t.Errorf("console container securityContext %v", at(c, "securityContext"))
	}
	podLabels := at(d, "spec", "template", "metadata", "labels").(map[string]any)
	selects := func(sel any) bool {
		m, _ := sel.(map[string]any)
		for k, v := range m {
			if podLabels[k] != v {
				return false
			}
		}
		return len(m) > 0
	}
	if selects(at(objs["StatefulSet"][0], "spec", "selector", "matchLabels")) {
		t.Errorf("the router's StatefulSet selects the console's pods")
	}
	var consoleSvc map[string]any
	for _, s := range objs["Service"] {
		name := at(s, "metadata", "name")
		if name == "fr-faultrouter-console" {
			consoleSvc = s
		} else if selects(at(s, "spec", "selector")) {
			t.Errorf("router Service %v selects the console's pods", name)
		}
	}
	if consoleSvc == nil || !selects(at(consoleSvc, "spec", "selector")) {
		t.Fatalf("no console Service selecting its pods: %v", consoleSvc)
	}
	ing := objs["Ingress"][0]
	if at(ing, "spec", "rules", 0, "host") != "console.test" ||
		at(ing, "spec", "rules", 0, "http", "paths", 0, "backend", "service", "name") != "fr-faultrouter-console" {
		t.Errorf("console Ingress %v", at(ing, "spec"))
	}

	// an existing Secret: the chart creates none; the proxy header only on request
	objs = render(t, "--set", "console.enabled=true", "--set", "console.existingSecret=console-users", "--set", "console.trustProxyHeader=true",
		"--set", "console.trustedProxies={10.42.0.0/16}", "--set", "console.networkPolicy.from[0].podSelector.matchLabels.app=oauth2-proxy")
	if len(objs["Secret"]) != 0 {
		t.Errorf("a Secret was rendered although console.existingSecret is set")
	}
	args = nil
	for _, a := range at(objs["Deployment"][0], "spec", "template", "spec", "containers", 0, "args").([]any) {
		args = append(args, a.(string))
	}
	if !slices.Contains(args, "--trust-proxy-header") || !slices.Contains(args, "--proxy-role=viewer") {
		t.Errorf("console.trustProxyHeader: args %v", args)
	}

	// no users file, no existing Secret, no proxy: refused
	cmd := exec.Command(os.Getenv("HELM"), "template", "fr", "faultrouter", "--set", "console.enabled=true")
	if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), "without authentication") {
		t.Errorf("console without authentication rendered (err %v): %s", err, out)
	}
}

// Guards the proxy header mode in the chart: the console believes the header
// only from console.trustedProxies (--trusted-proxies), and a NetworkPolicy
// lets only the proxy's pods reach the console's port, so no other pod (a
// worker) can send the header at all. Header mode without either is
// refused; without header mode there is no NetworkPolicy.
func TestChartConsoleProxyModeLetsOnlyTheProxyIn(t *testing.T) {
	base := []string{"--set", "console.enabled=true", "--set", "console.existingSecret=console-users", "--set", "console.trustProxyHeader=true"}
	objs := render(t, append(base, "--set", "console.trustedProxies={10.42.0.0/16,10.43.0.7/32}",
		"--set", "console.networkPolicy.from[0].podSelector.matchLabels.app=oauth2-proxy")...)
	var args []string
	for _, a := range at(objs["Deployment"][0], "spec", "template", "spec", "containers", 0, "args").([]any) {
		args = append(args, a.(string))
	}
	if !slices.Contains(args, "--trusted-proxies=10.42.0.0/16,10.43.0.7/32") {
		t.Errorf("console args %v lack --trusted-proxies=10.42.0.0/16,10.43.0.7/32", args)
	}
	if len(objs["NetworkPolicy"]) != 1 {
		t.Fatalf("%d NetworkPolicies in header mode, want 1", len(objs["NetworkPolicy"]))
	}
	np := objs["NetworkPolicy"][0]
	podLabels := at(objs["Deployment"][0], "spec", "template", "metadata", "labels").(map[string]any)
	sel, _ := at(np, "spec", "podSelector", "matchLabels").(map[string]any)
	for k, v := range sel {
		if podLabels[k] != v {
			t.Errorf("the NetworkPolicy selects %v, not the console's pods %v", sel, podLabels)
		}
	}
	if len(sel) == 0 || at(np, "spec", "policyTypes", 0) != "Ingress" {
		t.Errorf("NetworkPolicy spec %v: want Ingress for the console's pods", at(np, "spec"))
	}
	rules, _ := at(np, "spec", "ingress").([]any)
	for i, r := range rules {
		port := at(r, "ports", 0, "port")
		from, _ := at(r, "from").([]any)
		if port == "http" && (len(from) != 1 || at(from[0], "podSelector", "matchLabels", "app") != "oauth2-proxy") {
			t.Errorf("ingress rule %d lets %v reach the console's port, want only the proxy", i, from)
		}
		if port != "http" && port != "metrics" {
			t.Errorf("ingress rule %d opens port %v", i, port)
		}
	}
	if len(rules) == 0 || at(rules[0], "ports", 0, "port") != "http" {
		t.Errorf("no ingress rule for the console's port: %v", rules)
	}

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--set", "console.networkPolicy.from[0].podSelector.matchLabels.app=oauth2-proxy"}, "console.trustedProxies"},
		{[]string{"--set", "console.trustedProxies={10.42.0.0/16}"}, "console.networkPolicy.from"},
	} {
		cmd := exec.Command(os.Getenv("HELM"), append([]string{"template", "fr", "faultrouter"}, append(base, tc.args...)...)...)
		if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), tc.want) {
			t.Errorf("header mode without %s rendered (err %v): %s", tc.want, err, out)
		}
	}
	if n := len(render(t, "--set", "console.enabled=true", "--set", "console.existingSecret=console-users")["NetworkPolicy"]); n != 0 {
		t.Errorf("%d NetworkPolicies without header mode, want none", n)
	}
}

// Guards the console's cookies behind a TLS ingress: with the Ingress's TLS
// set, the console is told its public URL is https://<host> (Secure cookies
// and HSTS); console.publicURL overrides it; without TLS nothing is said.
func TestChartConsolePublicURL(t *testing.T) {
	args := func(objs map[string][]map[string]any) []string {
		var out []string
		for _, a := range at(objs["Deployment"][0], "spec", "template", "spec", "containers", 0, "args").([]any) {
			out = append(out, a.(string))
		}
		return out
	}
	base := []string{"--set", "console.enabled=true", "--set", "console.existingSecret=s", "--set", "console.ingress.enabled=true",
		"--set", "console.ingress.host=console.test"}
	tls := append(base, "--set", "console.ingress.tls[0].secretName=console-tls", "--set", "console.ingress.tls[0].hosts[0]=console.test")
	if a := args(render(t, tls...)); !slices.Contains(a, "--public-url=https://console.test") {
		t.Errorf("TLS at the ingress: args %v lack --public-url=https://console.test", a)
	}
	if a := args(render(t, append(tls, "--set", "console.publicURL=https://ops.example.com/console")...)); !slices.Contains(a, "--public-url=https://ops.example.com/console") {
		t.Errorf("console.publicURL: args %v", a)
	}
	for _, a := range args(render(t, base...)) {
		if strings.HasPrefix(a, "--public-url") {
			t.Errorf("no TLS at the ingress, yet %s", a)
		}
	}
}

// Guards the schema registry values: the URL and wire format reach the
// router as FAULTROUTER_REGISTRY_URL and FAULTROUTER_WIRE_FORMAT, basic auth
// from a Secret the chart creates (or an existing one), the CA from a
// Secret as --registry-tls-ca; the confluent wire format without a URL
// refuses to render.
func TestChartSchemaRegistry(t *testing.T) {
	objs := render(t, "--set", "schemaRegistry.url=https://registry:8081", "--set", "schemaRegistry.wireFormat=confluent",
		"--set", "schemaRegistry.user=fr", "--set", "schemaRegistry.password=pw", "--set", "schemaRegistry.caSecret=registry-ca",
		"--set", "schemaRegistry.lookupOnly=true")
	c := at(objs["StatefulSet"][0], "spec", "template", "spec", "containers", 0)
	env := map[string]any{}
	for _, e := range at(c, "env").([]any) {
		env[at(e, "name").(string)] = e
	}
	if at(env["FAULTROUTER_REGISTRY_URL"], "value") != "https://registry:8081" || at(env["FAULTROUTER_WIRE_FORMAT"], "value") != "confluent" {
		t.Errorf("registry env: %v %v", env["FAULTROUTER_REGISTRY_URL"], env["FAULTROUTER_WIRE_FORMAT"])
	}
	for _, k := range []string{"FAULTROUTER_REGISTRY_USER", "FAULTROUTER_REGISTRY_PASSWORD"} {
		if at(env[k], "valueFrom", "secretKeyRef", "name") != "fr-faultrouter-registry" {
			t.Errorf("%s does not come from the chart's registry Secret: %v", k, env[k])
		}
	}
	var args []string
	for _, a := range at(c, "args").([]any) {
		args = append(args, a.(string))
	}
	for _, want := range []string{"--registry-tls-ca=/etc/faultrouter-registry-tls/ca.crt", "--registry-lookup-only"} {
		if !slices.Contains(args, want) {
			t.Errorf("args %v lack %s", args, want)
		}
	}
	found := false
	for _, s := range objs["Secret"] {
		if at(s, "metadata", "name") == "fr-faultrouter-registry" && at(s, "stringData", "registry-user") == "fr" {
			found = true
		}
	}
	if !found {
		t.Errorf("no registry Secret with the user: %v", objs["Secret"])
	}
	cmd := exec.Command(os.Getenv("HELM"), "template", "fr", "faultrouter", "--set", "schemaRegistry.wireFormat=confluent")
	if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), "schemaRegistry.url") {
		t.Errorf("confluent without a URL rendered: %v %s", err, out)
	}
}

// Guards the console's reviewer settings in the chart: --claim-ttl from
// console.claimTTL; console.webhooks goes into the console Secret (its URLs
// are secrets), is mounted beside the users file and passed as --webhooks;
// with an existing Secret only when it says it holds one; no webhooks, no
// flag.
func TestChartConsoleClaimsAndWebhooks(t *testing.T) {
	args := func(objs map[string][]map[string]any) []string {
		var out []string
		for _, a := range at(objs["Deployment"][0], "spec", "template", "spec", "containers", 0, "args").([]any) {
			out = append(out, a.(string))
		}
		return out
	}
	users := []string{"--set", "console.enabled=true", "--set-string", "console.users=users: []"}
	objs := render(t, users...)
	if a := args(objs); !slices.Contains(a, "--claim-ttl=30m") || slices.ContainsFunc(a, func(s string) bool { return strings.HasPrefix(s, "--webhooks") }) {
		t.Errorf("defaults: args %v, want --claim-ttl=30m and no --webhooks", a)
	}
	hooks := "owners: {security: 'https://hooks.example.com/T1/B2/x'}\n"
	objs = render(t, append(users, "--set", "console.claimTTL=1h", "--set-string", "console.webhooks="+hooks)...)
	if a := args(objs); !slices.Contains(a, "--claim-ttl=1h") || !slices.Contains(a, "--webhooks=/etc/faultrouter-console/webhooks.yaml") {
		t.Errorf("with webhooks: args %v", a)
	}
	var secret map[string]any
	for _, s := range objs["Secret"] {
		if at(s, "metadata", "name") == "fr-faultrouter-console" {
			secret = s
		}
	}
	if at(secret, "stringData", "webhooks.yaml") != hooks {
		t.Errorf("the console Secret %v lacks the webhooks file", at(secret, "stringData"))
	}
	mounted := false
	for _, v := range at(objs["Deployment"][0], "spec", "template", "spec", "volumes").([]any) {
		if at(v, "name") == "users" {
			for _, it := range at(v, "secret", "items").([]any) {
				mounted = mounted || at(it, "key") == "webhooks.yaml"
			}
		}
	}
	if !mounted {
		t.Error("the webhooks file is not mounted from the console Secret")
	}
	existing := []string{"--set", "console.enabled=true", "--set", "console.existingSecret=console-users"}
	if a := args(render(t, existing...)); slices.ContainsFunc(a, func(s string) bool { return strings.HasPrefix(s, "--webhooks") }) {
		t.Errorf("an existing Secret without webhooksInExistingSecret: args %v pass --webhooks", a)
	}
	if a := args(render(t, append(existing, "--set", "console.webhooksInExistingSecret=true")...)); !slices.Contains(a, "--webhooks=/etc/faultrouter-console/webhooks.yaml") {
		t.Errorf("webhooksInExistingSecret: args %v", a)
	}
}

// Guards the client address behind the chart's Ingress: console.trustedProxies
// reaches the console as --trusted-proxies without header mode, so the
// sign-in limits count each person's X-Forwarded-For address instead of the
// ingress controller's, and the identity header stays off.
func TestChartConsoleTrustedProxiesWithoutHeaderMode(t *testing.T) {
	objs := render(t, "--set", "console.enabled=true", "--set", "console.existingSecret=console-users",
		"--set", "console.trustedProxies={10.42.0.0/16}")
	var args []string
	for _, a := range at(objs["Deployment"][0], "spec", "template", "spec", "containers", 0, "args").([]any) {
		args = append(args, a.(string))
	}
	if !slices.Contains(args, "--trusted-proxies=10.42.0.0/16") || slices.Contains(args, "--trust-proxy-header") {
		t.Errorf("console args %v: want --trusted-proxies=10.42.0.0/16 without --trust-proxy-header", args)
	}
	if len(objs["NetworkPolicy"]) != 0 {
		t.Errorf("%d NetworkPolicies without header mode, want none", len(objs["NetworkPolicy"]))
	}
}
