// Package helm holds the test of pgrelay's Helm chart (pgrelay/): helm lint,
// and the chart rendered with several value sets, every object decoded
// strictly into its Kubernetes type and checked against the relay's and the
// consumer's own flags. A module of its own, so that Helm and k8s.io/api never
// enter the library's go.mod.
package helm

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"helm.sh/helm/v3/pkg/lint"
	"helm.sh/helm/v3/pkg/lint/support"
	"helm.sh/helm/v3/pkg/release"
	"helm.sh/helm/v3/pkg/releaseutil"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"

	"github.com/pgrelay/pgrelay/internal/proc"
)

const chartDir = "pgrelay"

var update = flag.Bool("update", false, "rewrite the lists of environment variables in pgrelay/values.schema.json from the binaries' --help")

// managed are the environment variables the chart sets itself (from broker,
// metricsPort and the Secret), which relay.env and consumer.env may not name.
var managed = []string{"PGRELAY_BROKER", "METRICS_ADDR"}

// valueSets are the value sets the chart is linted and rendered with.
var valueSets = []struct {
	name   string
	values string
	// env: variables the relay's or consumer's container must have with
	// these values ("" for absent).
	env map[string]map[string]string
}{
	{"defaults", ``, nil},
	{"consumer off", `consumer: {enabled: false}`, nil},
	{"existing secret", `secret: {existingSecret: pgrelay-connections}`, nil},
	{"own service account, network policy", `
serviceAccount: {create: false, name: ops}
networkPolicy: {enabled: true, from: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: monitoring}}, podSelector: {matchLabels: {app: prometheus}}}]}
`, nil},
	{"servicemonitor", `metrics: {annotations: false, serviceMonitor: {enabled: true, labels: {release: kps}}}`, nil},
	{"rabbitmq, one replica, no example schema", `
broker: rabbitmq
secret: {data: {AMQP_URL: "amqp://guest:guest@rabbitmq:5672/", NATS_URL: "", ADMIN_TOKEN: t, DB_LISTEN_URL: "postgres://direct/db", PG_TARGET_URL: "postgres://other/db"}}
migrations: {exampleSchema: false}
serviceAccount: {name: pgrelay-sa}
networkPolicy: {enabled: true, egress: [{ports: [{port: 5432}, {port: 53, protocol: UDP}]}]}
relay: {replicas: 1, metricsPort: 9300, env: {RELAY_PUBLISH_TIMEOUT: 20s, ADMIN_ADDR: ":9190", RELAY_BATCH_SIZE: 16777216, RELAY_ASYNC_MARKS: true, LOG_FORMAT: null}}
consumer: {replicas: 1, metricsPort: 9301, env: {CONSUMER_HANDLER: http, CONSUMER_HTTP_URL: "http://app/events", CONSUMER_DUP_RATE_WARN: 0.25}}
`, map[string]map[string]string{
		"relay":    {"RELAY_BATCH_SIZE": "16777216", "RELAY_ASYNC_MARKS": "true", "LOG_FORMAT": "", "LOG_LEVEL": "info", "PGRELAY_BROKER": "rabbitmq"},
		"consumer": {"CONSUMER_DUP_RATE_WARN": "0.25", "CONSUMER_HANDLER": "http", "METRICS_ADDR": ":9301"},
	}},
}

// TestChart: for every value set, helm lint passes without a warning, and
// every object the chart renders decodes strictly into its Kubernetes type
// and agrees with the binaries (checkObjects).
func TestChart(t *testing.T) {
	for _, vs := range valueSets {
		t.Run(vs.name, func(t *testing.T) {
			// Helm's coalescing changes the map it is given (a null
			// deletes its key): each use gets its own.
			parse := func() map[string]any {
				vals := map[string]any{}
				if err := yaml.Unmarshal([]byte(vs.values), &vals); err != nil {
					t.Fatalf("value set: %v", err)
				}
				return vals
			}
			lintChart(t, parse())
			vals := parse()
			objs := render(t, vals)
			checkObjects(t, vals, objs)
			for _, o := range objs {
				d, ok := o.obj.(*appsv1.Deployment)
				if !ok {
					continue
				}
				c := d.Spec.Template.Spec.Containers[0]
				for name, want := range vs.env[c.Name] {
					if got, _ := envValue(c, name); got != want {
						t.Errorf("Deployment %s: %s=%q, want %q", d.Name, name, got, want)
					}
				}
			}
		})
	}
}

// TestSchemaNamesEveryFlag: values.schema.json lets relay.env and
// consumer.env name exactly the environment variables of `relay run` and
// `consumer run` (less the ones the chart sets), and secret.data only names
// variables of either. `go test -run TestSchemaNamesEveryFlag -update`
// rewrites the two lists after a flag is added or removed.
func TestSchemaNamesEveryFlag(t *testing.T) {
	path := filepath.Join(chartDir, "values.schema.json")
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var schema map[string]any
	if err := json.Unmarshal(raw, &schema); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	props := func(keys ...string) map[string]any {
		m := schema
		for _, k := range keys {
			next, ok := m[k].(map[string]any)
			if !ok {
				t.Fatalf("%s: no %s", path, strings.Join(keys, "."))
			}
			m = next
		}
		return m
	}
	secretNames := enumOf(t, props("properties", "secret", "properties", "data", "propertyNames"))
	relayAll, consumerAll := help(t, "relay", "run").env, help(t, "consumer", "run").env
	for _, n := range secretNames {
		if !relayAll[n] && !consumerAll[n] {
			t.Errorf("secret.data may name %s, which no flag of relay run or consumer run reads", n)
		}
	}
	skip := append(slices.Clone(managed), secretNames...)
	changed := false
	for _, c := range []struct {
		component string
		env       map[string]bool
	}{{"relay", relayAll}, {"consumer", consumerAll}} {
		want := slices.Sorted(maps.Keys(c.env))
		want = slices.DeleteFunc(want, func(n string) bool { return slices.Contains(skip, n) })
		names := props("properties", c.component, "properties", "env", "propertyNames")
		got := enumOf(t, names)
		if slices.Equal(got, want) {
			continue
		}
		if *update {
			names["enum"] = want
			changed = true
			continue
		}
		t.Errorf("values.schema.json: %s.env may name %v; `%s run --help` reads %v (go test -run TestSchemaNamesEveryFlag -update)",
			c.component, missing(got, want), c.component, missing(want, got))
	}
	if changed {
		out, err := json.MarshalIndent(schema, "", "  ")
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, append(out, '\n'), 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("rewrote %s", path)
	}
}

// missing returns what a has and b lacks.
func missing(a, b []string) []string {
	var out []string
	for _, s := range a {
		if !slices.Contains(b, s) {
			out = append(out, s)
		}
	}
	return out
}

func enumOf(t *testing.T, m map[string]any) []string {
	t.Helper()
	list, _ := m["enum"].([]any)
	out := make([]string, 0, len(list))
	for _, v := range list {
		out = append(out, fmt.Sprint(v))
	}
	slices.Sort(out)
	return out
}

// lintChart runs helm lint's rules (Chart.yaml, values and their schema,
// rendering, dependencies); a warning fails as an error does.
func lintChart(t *testing.T, vals map[string]any) {
	t.Helper()
	l := lint.All(chartDir, vals, "pgrelay", false)
	for _, m := range l.Messages {
		if m.Severity >= support.WarningSev {
			t.Errorf("helm lint: %s", m)
		} else {
			t.Logf("helm lint: %s", m)
		}
	}
}

// object is one rendered document: its template, kind and name, the
// strictly decoded Kubernetes object, and what Helm makes of it as a hook.
type object struct {
	source, kind, name string
	obj                any
	hook               *release.Hook
}

// render renders the chart as helm template does for release "rel" in
// namespace "pgrelay": values validated against the schema, the documents
// sorted into hooks and manifests by Helm's own sorter; every document is
// decoded strictly (a field its type does not have fails).
func render(t *testing.T, vals map[string]any) []object {
	t.Helper()
	ch, err := loader.Load(chartDir)
	if err != nil {
		t.Fatalf("load chart: %v", err)
	}
	rv, err := chartutil.ToRenderValues(ch, vals, chartutil.ReleaseOptions{Name: "rel", Namespace: "pgrelay", Revision: 1, IsInstall: true}, nil)
	if err != nil {
		t.Fatalf("values: %v", err)
	}
	files, err := engine.Render(ch, rv)
	if err != nil {
		t.Fatalf("helm template: %v", err)
	}
	for name := range files {
		if strings.HasSuffix(name, "NOTES.txt") {
			delete(files, name)
		}
	}
	hooks, manifests, err := releaseutil.SortManifests(files, nil, releaseutil.InstallOrder)
	if err != nil {
		t.Fatalf("helm template: %v", err)
	}
	var objs []object
	for _, h := range hooks {
		objs = append(objs, decode(t, h.Path, h.Manifest, h))
	}
	for _, m := range manifests {
		objs = append(objs, decode(t, m.Name, m.Content, nil))
	}
	return objs
}

func decode(t *testing.T, source, doc string, hook *release.Hook) object {
	t.Helper()
	var tm metav1.TypeMeta
	if err := yaml.Unmarshal([]byte(doc), &tm); err != nil {
		t.Fatalf("%s: %v\n%s", source, err, doc)
	}
	var obj any
	switch tm.APIVersion + " " + tm.Kind {
	case "apps/v1 Deployment":
		obj = &appsv1.Deployment{}
	case "batch/v1 Job":
		obj = &batchv1.Job{}
	case "v1 Service":
		obj = &corev1.Service{}
	case "v1 Secret":
		obj = &corev1.Secret{}
	case "v1 ServiceAccount":
		obj = &corev1.ServiceAccount{}
	case "networking.k8s.io/v1 NetworkPolicy":
		obj = &networkingv1.NetworkPolicy{}
	case "policy/v1 PodDisruptionBudget":
		obj = &policyv1.PodDisruptionBudget{}
	case "monitoring.coreos.com/v1 ServiceMonitor":
		obj = &serviceMonitor{}
	default:
		t.Fatalf("%s: unexpected object %s %s", source, tm.APIVersion, tm.Kind)
	}
	if err := yaml.UnmarshalStrict([]byte(doc), obj); err != nil {
		t.Fatalf("%s: %s does not decode strictly: %v\n%s", source, tm.Kind, err, doc)
	}
	var meta struct {
		Metadata metav1.ObjectMeta `json:"metadata"`
	}
	_ = yaml.Unmarshal([]byte(doc), &meta)
	return object{source: source, kind: tm.Kind, name: meta.Metadata.Name, obj: obj, hook: hook}
}

// serviceMonitor is the part of the Prometheus Operator's ServiceMonitor
// (monitoring.coreos.com/v1) the chart writes; the strict decoding refuses
// any other field.
type serviceMonitor struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		NamespaceSelector struct {
			MatchNames []string `json:"matchNames"`
		} `json:"namespaceSelector"`
		Selector  metav1.LabelSelector `json:"selector"`
		Endpoints []struct {
			Port     string `json:"port"`
			Path     string `json:"path"`
			Interval string `json:"interval"`
		} `json:"endpoints"`
	} `json:"spec"`
}

// checkObjects checks what the chart rendered with vals against the
// binaries: each container's command, flags and environment variables, the
// metrics port, probes and scrape annotations, the Services, the
// PodDisruptionBudgets, the ServiceMonitor, the Secret and the hooks.
func checkObjects(t *testing.T, vals map[string]any, objs []object) {
	get := func(path string) any {
		v, err := chartutil.Values(vals).PathValue(path)
		if err != nil {
			return nil
		}
		return v
	}
	existing, _ := get("secret.existingSecret").(string)
	consumerOn := get("consumer.enabled") != false
	annotations := get("metrics.annotations") != false
	monitor := get("metrics.serviceMonitor.enabled") == true

	byKind := map[string][]object{}
	for _, o := range objs {
		byKind[o.kind] = append(byKind[o.kind], o)
	}
	var secretName string
	var secretHook *release.Hook
	switch secrets := byKind["Secret"]; {
	case existing != "" && len(secrets) > 0:
		t.Errorf("secret.existingSecret is set, yet the chart renders Secret %s", secrets[0].name)
	case existing != "":
		secretName = existing
	case len(secrets) != 1:
		t.Fatalf("want one Secret, got %d", len(secrets))
	default:
		s := secrets[0].obj.(*corev1.Secret)
		secretName = s.Name
		relayEnv, consumerEnv := help(t, "relay", "run").env, help(t, "consumer", "run").env
		for k := range s.StringData {
			if !relayEnv[k] && !consumerEnv[k] {
				t.Errorf("Secret key %s: no flag of relay run or consumer run reads it", k)
			}
		}
		if s.StringData["DATABASE_URL"] == "" {
			t.Errorf("Secret without DATABASE_URL")
		}
		secretHook = secrets[0].hook
		if secretHook == nil {
			t.Errorf("Secret %s is no hook: the migration Job, a pre-install hook, would run before it exists", s.Name)
		} else {
			checkHook(t, secretHook)
		}
	}

	deployments := map[string]*appsv1.Deployment{}
	for _, o := range byKind["Deployment"] {
		d := o.obj.(*appsv1.Deployment)
		component := d.Spec.Template.Labels["app.kubernetes.io/component"]
		deployments[component] = d
		if !labelsMatch(d.Spec.Selector.MatchLabels, d.Spec.Template.Labels) {
			t.Errorf("Deployment %s: its selector does not select its pods", d.Name)
		}
		spec := d.Spec.Template.Spec
		if len(spec.Containers) != 1 {
			t.Fatalf("Deployment %s: %d containers", d.Name, len(spec.Containers))
		}
		c := spec.Containers[0]
		h := checkContainer(t, "Deployment "+d.Name, c, secretName)
		if h.bin != component || !slices.Equal(h.args, []string{"run"}) {
			t.Errorf("Deployment %s (component %s) runs %s %v, want %s run", d.Name, component, h.bin, h.args, component)
		}
		port := metricsPort(t, h, c)
		if got := containerPort(c, intstr.FromString("metrics")); got != port {
			t.Errorf("Deployment %s: container port metrics is %d, the binary serves /metrics on %d (METRICS_ADDR)", d.Name, got, port)
		}
		for _, p := range []struct {
			what, path string
			probe      *corev1.Probe
		}{{"liveness", "/livez", c.LivenessProbe}, {"readiness", "/readyz", c.ReadinessProbe}} {
			if p.probe == nil || p.probe.HTTPGet == nil {
				t.Errorf("Deployment %s: no HTTP %s probe", d.Name, p.what)
				continue
			}
			if p.probe.HTTPGet.Path != p.path || !strings.Contains(h.flagText["metrics-addr"], p.path) {
				t.Errorf("Deployment %s: %s probe on %s; want %s, which --metrics-addr serves (%q)", d.Name, p.what, p.probe.HTTPGet.Path, p.path, h.flagText["metrics-addr"])
			}
			if got := containerPort(c, p.probe.HTTPGet.Port); got != port {
				t.Errorf("Deployment %s: %s probe on port %s (%d), not the metrics port %d", d.Name, p.what, p.probe.HTTPGet.Port.String(), got, port)
			}
		}
		ann := d.Spec.Template.Annotations
		if annotations {
			if ann["prometheus.io/scrape"] != "true" || ann["prometheus.io/port"] != strconv.Itoa(port) || ann["prometheus.io/path"] != "/metrics" {
				t.Errorf("Deployment %s: scrape annotations %v, want port %d and path /metrics", d.Name, ann, port)
			}
		} else if ann["prometheus.io/scrape"] != "" {
			t.Errorf("Deployment %s: scrape annotations with metrics.annotations false", d.Name)
		}
		if d.Spec.Replicas == nil || *d.Spec.Replicas < 1 {
			t.Errorf("Deployment %s: no replicas", d.Name)
		}
		if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() || c.Resources.Limits.Memory().IsZero() {
			t.Errorf("Deployment %s: resources %v lack a CPU or memory request or a memory limit", d.Name, c.Resources)
		}
		if component == "relay" {
			// On SIGTERM the relay finishes the batches in flight, each
			// bounded by --publish-timeout, then marks them and releases
			// its leases (a 10s statement timeout each, relay.Config's
			// QueryTimeout).
			publish := h.durationSetting(t, "publish-timeout", c)
			need := publish + 20*time.Second
			grace := time.Duration(0)
			if g := spec.TerminationGracePeriodSeconds; g != nil {
				grace = time.Duration(*g) * time.Second
			}
			if grace < need {
				t.Errorf("Deployment %s: terminationGracePeriodSeconds %s is shorter than the relay's shutdown (publish timeout %s + 20s)", d.Name, grace, publish)
			}
		}
	}
	if deployments["relay"] == nil {
		t.Errorf("no relay Deployment")
	} else if get("relay.replicas") == nil && *deployments["relay"].Spec.Replicas < 2 {
		t.Errorf("the relay's default replicas are %d, want at least 2", *deployments["relay"].Spec.Replicas)
	}
	if (deployments["consumer"] != nil) != consumerOn {
		t.Errorf("consumer.enabled %v, consumer Deployment rendered: %v", consumerOn, deployments["consumer"] != nil)
	}

	pdbs := map[string]bool{}
	for _, o := range byKind["PodDisruptionBudget"] {
		p := o.obj.(*policyv1.PodDisruptionBudget)
		d := selected(deployments, p.Spec.Selector.MatchLabels)
		if d == nil {
			t.Errorf("PodDisruptionBudget %s selects no Deployment", p.Name)
			continue
		}
		pdbs[d.Name] = true
		if p.Spec.MinAvailable == nil || p.Spec.MinAvailable.IntValue() >= int(*d.Spec.Replicas) {
			t.Errorf("PodDisruptionBudget %s: minAvailable %v of %d replicas blocks every eviction", p.Name, p.Spec.MinAvailable, *d.Spec.Replicas)
		}
	}
	for _, d := range deployments {
		if *d.Spec.Replicas >= 2 && !pdbs[d.Name] {
			t.Errorf("Deployment %s (%d replicas) has no PodDisruptionBudget", d.Name, *d.Spec.Replicas)
		}
	}

	services := map[string]*corev1.Service{}
	for _, o := range byKind["Service"] {
		s := o.obj.(*corev1.Service)
		services[s.Name] = s
		d := selected(deployments, s.Spec.Selector)
		if d == nil {
			t.Errorf("Service %s selects no Deployment", s.Name)
			continue
		}
		for _, p := range s.Spec.Ports {
			if got := containerPort(d.Spec.Template.Spec.Containers[0], p.TargetPort); got == 0 {
				t.Errorf("Service %s: target port %s is no port of Deployment %s", s.Name, p.TargetPort.String(), d.Name)
			}
		}
	}

	monitors := byKind["ServiceMonitor"]
	if (len(monitors) > 0) != monitor {
		t.Errorf("metrics.serviceMonitor.enabled %v, ServiceMonitors rendered: %d", monitor, len(monitors))
	}
	for _, o := range monitors {
		m := o.obj.(*serviceMonitor)
		n := 0
		for _, s := range services {
			if !labelsMatch(m.Spec.Selector.MatchLabels, s.Labels) {
				continue
			}
			n++
			for _, e := range m.Spec.Endpoints {
				if !slices.ContainsFunc(s.Spec.Ports, func(p corev1.ServicePort) bool { return p.Name == e.Port }) {
					t.Errorf("ServiceMonitor %s: Service %s has no port %q", m.Name, s.Name, e.Port)
				}
				if e.Path != "/metrics" {
					t.Errorf("ServiceMonitor %s: path %s", m.Name, e.Path)
				}
			}
		}
		if n != len(deployments) {
			t.Errorf("ServiceMonitor %s selects %d Services, want %d (one per Deployment)", m.Name, n, len(deployments))
		}
	}

	jobs := byKind["Job"]
	if len(jobs) != 1 {
		t.Fatalf("want one migration Job, got %d", len(jobs))
	}
	j := jobs[0].obj.(*batchv1.Job)
	if jobs[0].hook == nil {
		t.Fatalf("Job %s is no hook", j.Name)
	}
	checkHook(t, jobs[0].hook)
	if secretHook != nil && secretHook.Weight >= jobs[0].hook.Weight {
		t.Errorf("the Secret's hook weight %d is not below the migration Job's %d: the Job could start first", secretHook.Weight, jobs[0].hook.Weight)
	}
	for _, o := range objs {
		if o.hook != nil && o.kind != "Job" && o.kind != "Secret" && o.kind != "ServiceAccount" {
			t.Errorf("%s %s is a hook", o.kind, o.name)
		}
	}
	h := checkContainer(t, "Job "+j.Name, j.Spec.Template.Spec.Containers[0], secretName)
	if !slices.Equal(h.args, []string{"migrate", "up"}) {
		t.Errorf("Job %s runs %s %v, want migrate up", j.Name, h.bin, h.args)
	}
	checkServiceAccount(t, get, byKind["ServiceAccount"], jobs[0], deployments, j.Spec.Template.Spec)
	checkNetworkPolicies(t, get, byKind["NetworkPolicy"], deployments)
}

// checkServiceAccount: the relay's, the consumer's and the migration Job's
// pods run as the chart's ServiceAccount (serviceAccount.create, the
// default), created as a hook before the Job, or as serviceAccount.name;
// none mounts a token.
func checkServiceAccount(t *testing.T, get func(string) any, sas []object, job object, deployments map[string]*appsv1.Deployment, jobSpec corev1.PodSpec) {
	t.Helper()
	create := get("serviceAccount.create") != false
	want, _ := get("serviceAccount.name").(string)
	switch {
	case !create && len(sas) > 0:
		t.Errorf("serviceAccount.create false, yet the chart renders ServiceAccount %s", sas[0].name)
	case !create && want == "":
		want = "default"
	case create && len(sas) != 1:
		t.Fatalf("want one ServiceAccount, got %d", len(sas))
	case create:
		sa := sas[0].obj.(*corev1.ServiceAccount)
		if want != "" && sa.Name != want {
			t.Errorf("ServiceAccount %s, want serviceAccount.name %s", sa.Name, want)
		}
		want = sa.Name
		if sa.AutomountServiceAccountToken == nil || *sa.AutomountServiceAccountToken {
			t.Errorf("ServiceAccount %s: automountServiceAccountToken %v, want false", sa.Name, sa.AutomountServiceAccountToken)
		}
		if sas[0].hook == nil {
			t.Errorf("ServiceAccount %s is no hook: the migration Job, a pre-install hook, would run before it exists", sa.Name)
		} else {
			checkHook(t, sas[0].hook)
			if sas[0].hook.Weight >= job.hook.Weight {
				t.Errorf("the ServiceAccount's hook weight %d is not below the migration Job's %d", sas[0].hook.Weight, job.hook.Weight)
			}
		}
	}
	pods := map[string]corev1.PodSpec{"Job " + job.name: jobSpec}
	for _, d := range deployments {
		pods["Deployment "+d.Name] = d.Spec.Template.Spec
	}
	for what, spec := range pods {
		if spec.ServiceAccountName != want {
			t.Errorf("%s: serviceAccountName %q, want %q", what, spec.ServiceAccountName, want)
		}
		if spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken {
			t.Errorf("%s mounts a service account token", what)
		}
	}
}

// checkNetworkPolicies: with networkPolicy.enabled, one NetworkPolicy per
// Deployment selects its pods and lets in only its metrics port (and its
// ADMIN_ADDR's port), from networkPolicy.from; egress is restricted only when
// networkPolicy.egress lists rules.
func checkNetworkPolicies(t *testing.T, get func(string) any, nps []object, deployments map[string]*appsv1.Deployment) {
	t.Helper()
	if get("networkPolicy.enabled") != true {
		if len(nps) > 0 {
			t.Errorf("networkPolicy.enabled false, yet the chart renders NetworkPolicy %s", nps[0].name)
		}
		return
	}
	from, _ := get("networkPolicy.from").([]any)
	egress, _ := get("networkPolicy.egress").([]any)
	covered := map[string]bool{}
	for _, o := range nps {
		np := o.obj.(*networkingv1.NetworkPolicy)
		d := selected(deployments, np.Spec.PodSelector.MatchLabels)
		if d == nil {
			t.Errorf("NetworkPolicy %s selects no Deployment", np.Name)
			continue
		}
		covered[d.Name] = true
		c := d.Spec.Template.Spec.Containers[0]
		allowed := map[int]bool{containerPort(c, intstr.FromString("metrics")): true}
		if addr, ok := envValue(c, "ADMIN_ADDR"); ok && addr != "" {
			p, _ := strconv.Atoi(addr[strings.LastIndex(addr, ":")+1:])
			allowed[p] = true
		}
		types := np.Spec.PolicyTypes
		if !slices.Contains(types, networkingv1.PolicyTypeIngress) {
			t.Errorf("NetworkPolicy %s: policyTypes %v lack Ingress", np.Name, types)
		}
		if slices.Contains(types, networkingv1.PolicyTypeEgress) != (len(egress) > 0) || len(np.Spec.Egress) != len(egress) {
			t.Errorf("NetworkPolicy %s: policyTypes %v with %d egress rules, networkPolicy.egress has %d", np.Name, types, len(np.Spec.Egress), len(egress))
		}
		if len(np.Spec.Ingress) != 1 {
			t.Fatalf("NetworkPolicy %s: %d ingress rules, want 1", np.Name, len(np.Spec.Ingress))
		}
		rule := np.Spec.Ingress[0]
		got := map[int]bool{}
		for _, p := range rule.Ports {
			if p.Port == nil {
				t.Errorf("NetworkPolicy %s: a rule open to every port", np.Name)
				continue
			}
			n := containerPort(c, *p.Port)
			if p.Port.Type == intstr.Int {
				n = p.Port.IntValue()
			}
			if !allowed[n] {
				t.Errorf("NetworkPolicy %s lets in port %s, neither the metrics port nor ADMIN_ADDR's", np.Name, p.Port.String())
			}
			got[n] = true
		}
		if !maps.Equal(got, allowed) {
			t.Errorf("NetworkPolicy %s lets in ports %v, want %v", np.Name, slices.Sorted(maps.Keys(got)), slices.Sorted(maps.Keys(allowed)))
		}
		if len(rule.From) != len(from) {
			t.Errorf("NetworkPolicy %s: %d peers, networkPolicy.from has %d", np.Name, len(rule.From), len(from))
		}
		for _, peer := range rule.From {
			if peer.NamespaceSelector == nil && peer.PodSelector == nil {
				t.Errorf("NetworkPolicy %s: a peer without a selector", np.Name)
			}
		}
	}
	for _, d := range deployments {
		if !covered[d.Name] {
			t.Errorf("networkPolicy.enabled, but no NetworkPolicy selects Deployment %s", d.Name)
		}
	}
}

// checkHook: Helm runs it before every install and upgrade, and deletes
// the previous one first.
func checkHook(t *testing.T, h *release.Hook) {
	t.Helper()
	if !slices.Contains(h.Events, release.HookPreInstall) || !slices.Contains(h.Events, release.HookPreUpgrade) {
		t.Errorf("%s %s: hook events %v, want pre-install and pre-upgrade", h.Kind, h.Name, h.Events)
	}
	if !slices.Contains(h.DeletePolicies, release.HookBeforeHookCreation) {
		t.Errorf("%s %s: hook delete policies %v lack before-hook-creation: the next upgrade would fail on the existing object", h.Kind, h.Name, h.DeletePolicies)
	}
}

func labelsMatch(selector, labels map[string]string) bool {
	if len(selector) == 0 {
		return false
	}
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}

func selected(deployments map[string]*appsv1.Deployment, selector map[string]string) *appsv1.Deployment {
	for _, d := range deployments {
		if labelsMatch(selector, d.Spec.Template.Labels) {
			return d
		}
	}
	return nil
}

// containerPort resolves a port by name or number among the container's
// ports; 0 when it is none of them.
func containerPort(c corev1.Container, p intstr.IntOrString) int {
	for _, cp := range c.Ports {
		if (p.Type == intstr.String && cp.Name == p.StrVal) || (p.Type == intstr.Int && cp.ContainerPort == p.IntVal) {
			return int(cp.ContainerPort)
		}
	}
	return 0
}

// checkContainer checks a container against the binary it runs: the command
// is /usr/local/bin/<relay|consumer> (the Dockerfile's), every --flag of its
// arguments is one of the subcommand's, and every environment variable is
// named by one of its flags' help texts; a secretKeyRef reads the chart's
// Secret under the variable's own name.
func checkContainer(t *testing.T, what string, c corev1.Container, secretName string) helpText {
	t.Helper()
	if len(c.Command) != 1 || !slices.Contains([]string{"/usr/local/bin/relay", "/usr/local/bin/consumer"}, c.Command[0]) {
		t.Fatalf("%s: command %v, want the image's /usr/local/bin/relay or consumer", what, c.Command)
	}
	var sub, flags []string
	for _, a := range c.Args {
		if strings.HasPrefix(a, "-") {
			flags = append(flags, strings.TrimLeft(strings.SplitN(a, "=", 2)[0], "-"))
		} else {
			sub = append(sub, a)
		}
	}
	h := help(t, filepath.Base(c.Command[0]), sub...)
	for _, f := range flags {
		if _, ok := h.flagText[f]; !ok {
			t.Errorf("%s: %s %s has no flag --%s", what, h.bin, strings.Join(sub, " "), f)
		}
	}
	for _, e := range c.Env {
		if !h.env[e.Name] {
			t.Errorf("%s: environment variable %s: no flag of %s %s reads it", what, e.Name, h.bin, strings.Join(sub, " "))
		}
		if e.ValueFrom != nil {
			ref := e.ValueFrom.SecretKeyRef
			if ref == nil || ref.Name != secretName || ref.Key != e.Name {
				t.Errorf("%s: %s from %+v, want key %s of Secret %s", what, e.Name, e.ValueFrom, e.Name, secretName)
			}
		}
	}
	return h
}

// metricsPort is the port the container's binary serves /metrics on: its
// METRICS_ADDR, or the flag's default.
func metricsPort(t *testing.T, h helpText, c corev1.Container) int {
	t.Helper()
	addr, ok := envValue(c, "METRICS_ADDR")
	if !ok {
		addr = h.defaults["metrics-addr"]
	}
	i := strings.LastIndex(addr, ":")
	port, err := strconv.Atoi(addr[i+1:])
	if i < 0 || err != nil {
		t.Fatalf("%s: metrics address %q has no port", c.Name, addr)
	}
	return port
}

func envValue(c corev1.Container, name string) (string, bool) {
	for _, e := range c.Env {
		if e.Name == name && e.ValueFrom == nil {
			return e.Value, true
		}
	}
	return "", false
}

// durationSetting is a duration flag's value in the container: its
// environment variable's, or the default.
func (h helpText) durationSetting(t *testing.T, flagName string, c corev1.Container) time.Duration {
	t.Helper()
	s := h.defaults[flagName]
	for name := range h.flagEnv[flagName] {
		if v, ok := envValue(c, name); ok {
			s = v
		}
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		t.Fatalf("--%s: %q: %v", flagName, s, err)
	}
	return d
}

// helpText is what `<bin> <sub...> --help` says: each flag's text, default
// and environment variables.
type helpText struct {
	bin      string
	args     []string
	flagText map[string]string
	defaults map[string]string
	flagEnv  map[string]map[string]bool
	env      map[string]bool
}

var (
	flagLine = regexp.MustCompile(`^\s+(?:-\w, )?--([a-z0-9-]+)(?: \S+)?\s{2,}(.*)$`)
	// "(env NAME)", "(NAME)", "(NAME, ';'-separated)", "(env NAME); required"
	envName     = regexp.MustCompile(`\((?:env )?([A-Z][A-Z0-9_]*[A-Z0-9])[,;)]`)
	defaultText = regexp.MustCompile(`\(default "?([^")]*)"?\)$`)

	helpMu    sync.Mutex
	helpCache = map[string]helpText{}
)

// help runs the binary built from this checkout with --help.
func help(t *testing.T, bin string, sub ...string) helpText {
	t.Helper()
	key := bin + " " + strings.Join(sub, " ")
	helpMu.Lock()
	defer helpMu.Unlock()
	if h, ok := helpCache[key]; ok {
		return h
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, filepath.Join(binaries(t), bin), append(slices.Clone(sub), "--help")...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s --help: %v\n%s", key, err, out)
	}
	h := helpText{bin: bin, args: sub, flagText: map[string]string{}, defaults: map[string]string{}, flagEnv: map[string]map[string]bool{}, env: map[string]bool{}}
	for line := range strings.SplitSeq(string(out), "\n") {
		m := flagLine.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		name, text := m[1], m[2]
		h.flagText[name] = text
		if d := defaultText.FindStringSubmatch(text); d != nil {
			h.defaults[name] = d[1]
		}
		h.flagEnv[name] = map[string]bool{}
		for _, e := range envName.FindAllStringSubmatch(text, -1) {
			h.flagEnv[name][e[1]] = true
			h.env[e[1]] = true
		}
	}
	if len(h.flagText) == 0 || len(h.env) == 0 {
		t.Fatalf("%s --help: no flags or environment variables found:\n%s", key, out)
	}
	helpCache[key] = h
	return h
}

// bins are cmd/relay and cmd/consumer of this checkout, built once per run.
var bins = proc.NewBinaries("./cmd/relay", "./cmd/consumer")

func binaries(t *testing.T) string {
	t.Helper()
	return bins.Dir(t)
}

func TestMain(m *testing.M) {
	flag.Parse()
	code := m.Run()
	bins.Remove()
	os.Exit(code)
}
