// Package deploy_test renders the kustomize overlays with the pinned
// kustomize (tools.go.mod) and checks the rendered manifests: probes,
// security context, shutdown timing, autoscaling, disruption budget, network
// policy, and that each overlay carries only its own provider environment and
// takes the API key from a mounted Secret, never a literal.
package deploy_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
)

const (
	containerName = "paymentsd"
	grpcPort      = 9090
	httpPort      = 8080
	webhookPort   = 8081
	nonrootUID    = 65532 // distroless "nonroot"
	callerLabel   = "payments.example.com/caller"
	envLabel      = "payments.example.com/environment"
)

// environments are the provider environments; each has an overlay.
var environments = []string{"sandbox", "live"}

// literalKeyVar matches an env var that would carry the API key itself
// (PAYMENTS_LIVE_API_KEY), as opposed to a path to it (..._API_KEY_FILE).
var literalKeyVar = regexp.MustCompile(`^PAYMENTS_[A-Z0-9_]*API_KEY$`)

// envSpecific is what only the overlay of environment env may mention.
func envSpecific(env string) []string {
	return []string{
		"PAYMENTS_" + strings.ToUpper(env) + "_",
		env + ".payments-provider.example",
		secretName(env),
		databaseSecretName(env),
		webhookSecretName(env),
	}
}

func webhookSecretName(env string) string { return "paymentsd-" + env + "-webhook-token" }

func secretName(env string) string         { return "paymentsd-" + env + "-api-key" }
func databaseSecretName(env string) string { return "paymentsd-" + env + "-database" }
func namespace(env string) string          { return "payments-" + env }

// ---- rendering and decoding ----

type object struct {
	Kind       string
	APIVersion string
	Name       string
	Namespace  string
	node       yaml.Node
	raw        any // generic tree, for walks over every field
}

type rendered struct {
	text []byte
	objs []object
}

// render runs the pinned kustomize on dir (relative to deploy/).
func render(t *testing.T, dir string) *rendered {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), "go", "tool", "-modfile=../tools.go.mod", "kustomize", "build", dir)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("kustomize build %s: %v\n%s", dir, err, stderr.Bytes())
	}
	r := &rendered{text: out}
	dec := yaml.NewDecoder(bytes.NewReader(out))
	for {
		var n yaml.Node
		err := dec.Decode(&n)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("kustomize build %s: decoding output: %v", dir, err)
		}
		var h struct {
			Kind       string `yaml:"kind"`
			APIVersion string `yaml:"apiVersion"`
			Metadata   meta   `yaml:"metadata"`
		}
		if err := n.Decode(&h); err != nil {
			t.Fatalf("kustomize build %s: decoding object header: %v", dir, err)
		}
		o := object{Kind: h.Kind, APIVersion: h.APIVersion, Name: h.Metadata.Name, Namespace: h.Metadata.Namespace, node: n}
		if err := n.Decode(&o.raw); err != nil {
			t.Fatalf("kustomize build %s: decoding %s/%s: %v", dir, h.Kind, h.Metadata.Name, err)
		}
		r.objs = append(r.objs, o)
	}
	if len(r.objs) == 0 {
		t.Fatalf("kustomize build %s rendered no objects", dir)
	}
	return r
}

// one returns the single object of the given kind, decoded into a T.
func one[T any](t *testing.T, r *rendered, kind, apiVersion string) T {
	t.Helper()
	var found []object
	for _, o := range r.objs {
		if o.Kind == kind {
			found = append(found, o)
		}
	}
	if len(found) != 1 {
		t.Fatalf("rendered %d %s objects, want exactly 1", len(found), kind)
	}
	o := found[0]
	if o.APIVersion != apiVersion {
		t.Errorf("%s/%s apiVersion = %q, want %q", kind, o.Name, o.APIVersion, apiVersion)
	}
	var v T
	if err := o.node.Decode(&v); err != nil {
		t.Fatalf("decoding %s/%s: %v", kind, o.Name, err)
	}
	return v
}

// named returns the object of the given kind and name, decoded into a T.
func named[T any](t *testing.T, r *rendered, kind, apiVersion, name string) T {
	t.Helper()
	for _, o := range r.objs {
		if o.Kind != kind || o.Name != name {
			continue
		}
		if o.APIVersion != apiVersion {
			t.Errorf("%s/%s apiVersion = %q, want %q", kind, o.Name, o.APIVersion, apiVersion)
		}
		var v T
		if err := o.node.Decode(&v); err != nil {
			t.Fatalf("decoding %s/%s: %v", kind, o.Name, err)
		}
		return v
	}
	t.Fatalf("rendered no %s named %q", kind, name)
	var zero T
	return zero
}

// ---- the parts of the Kubernetes API the checks read ----

type meta struct {
	Name        string            `yaml:"name"`
	Namespace   string            `yaml:"namespace"`
	Labels      map[string]string `yaml:"labels"`
	Annotations map[string]string `yaml:"annotations"`
}

type labelSelector struct {
	MatchLabels      map[string]string `yaml:"matchLabels"`
	MatchExpressions []any             `yaml:"matchExpressions"`
}

type deployment struct {
	Metadata meta `yaml:"metadata"`
	Spec     struct {
		Replicas *int          `yaml:"replicas"`
		Selector labelSelector `yaml:"selector"`
		Template struct {
			Metadata meta    `yaml:"metadata"`
			Spec     podSpec `yaml:"spec"`
		} `yaml:"template"`
	} `yaml:"spec"`
}

type podSpec struct {
	AutomountServiceAccountToken  *bool            `yaml:"automountServiceAccountToken"`
	TerminationGracePeriodSeconds *int64           `yaml:"terminationGracePeriodSeconds"`
	SecurityContext               *securityContext `yaml:"securityContext"`
	InitContainers                []container      `yaml:"initContainers"`
	Containers                    []container      `yaml:"containers"`
	Volumes                       []volume         `yaml:"volumes"`
}

type securityContext struct {
	RunAsNonRoot             *bool  `yaml:"runAsNonRoot"`
	RunAsUser                *int64 `yaml:"runAsUser"`
	ReadOnlyRootFilesystem   *bool  `yaml:"readOnlyRootFilesystem"`
	AllowPrivilegeEscalation *bool  `yaml:"allowPrivilegeEscalation"`
	Privileged               *bool  `yaml:"privileged"`
	Capabilities             *struct {
		Add  []string `yaml:"add"`
		Drop []string `yaml:"drop"`
	} `yaml:"capabilities"`
	SeccompProfile *struct {
		Type string `yaml:"type"`
	} `yaml:"seccompProfile"`
}

type container struct {
	Name  string `yaml:"name"`
	Image string `yaml:"image"`
	Ports []struct {
		Name          string `yaml:"name"`
		ContainerPort int    `yaml:"containerPort"`
	} `yaml:"ports"`
	Env []struct {
		Name      string `yaml:"name"`
		Value     string `yaml:"value"`
		ValueFrom any    `yaml:"valueFrom"`
	} `yaml:"env"`
	EnvFrom      []any `yaml:"envFrom"`
	VolumeMounts []struct {
		Name      string `yaml:"name"`
		MountPath string `yaml:"mountPath"`
		SubPath   string `yaml:"subPath"`
		ReadOnly  bool   `yaml:"readOnly"`
	} `yaml:"volumeMounts"`
	ReadinessProbe *probe `yaml:"readinessProbe"`
	LivenessProbe  *probe `yaml:"livenessProbe"`
	Resources      struct {
		Requests map[string]string `yaml:"requests"`
		Limits   map[string]string `yaml:"limits"`
	} `yaml:"resources"`
	SecurityContext *securityContext `yaml:"securityContext"`
}

type probe struct {
	GRPC *struct {
		Port    int     `yaml:"port"`
		Service *string `yaml:"service"`
	} `yaml:"grpc"`
	HTTPGet   any `yaml:"httpGet"`
	TCPSocket any `yaml:"tcpSocket"`
	Exec      any `yaml:"exec"`
}

type volume struct {
	Name   string `yaml:"name"`
	Secret *struct {
		SecretName string      `yaml:"secretName"`
		Items      []keyToPath `yaml:"items"`
	} `yaml:"secret"`
}

type keyToPath struct {
	Key  string `yaml:"key"`
	Path string `yaml:"path"`
}

type service struct {
	Spec struct {
		Selector map[string]string `yaml:"selector"`
		Ports    []servicePort     `yaml:"ports"`
	} `yaml:"spec"`
}

type servicePort struct {
	Name       string `yaml:"name"`
	Port       int    `yaml:"port"`
	TargetPort any    `yaml:"targetPort"`
}

type hpa struct {
	Spec struct {
		ScaleTargetRef struct {
			APIVersion string `yaml:"apiVersion"`
			Kind       string `yaml:"kind"`
			Name       string `yaml:"name"`
		} `yaml:"scaleTargetRef"`
		MinReplicas *int  `yaml:"minReplicas"`
		MaxReplicas int   `yaml:"maxReplicas"`
		Metrics     []any `yaml:"metrics"`
	} `yaml:"spec"`
}

type pdb struct {
	Spec struct {
		MinAvailable   any           `yaml:"minAvailable"`
		MaxUnavailable any           `yaml:"maxUnavailable"`
		Selector       labelSelector `yaml:"selector"`
	} `yaml:"spec"`
}

type networkPolicy struct {
	Spec struct {
		PodSelector labelSelector `yaml:"podSelector"`
		PolicyTypes []string      `yaml:"policyTypes"`
		Ingress     []struct {
			From  []peer `yaml:"from"`
			Ports []struct {
				Port any `yaml:"port"`
			} `yaml:"ports"`
		} `yaml:"ingress"`
	} `yaml:"spec"`
}

type peer struct {
	NamespaceSelector *labelSelector `yaml:"namespaceSelector"`
	PodSelector       *labelSelector `yaml:"podSelector"`
	IPBlock           any            `yaml:"ipBlock"`
}

// ---- helpers ----

func paymentsd(t *testing.T, d deployment) container {
	t.Helper()
	for _, c := range d.Spec.Template.Spec.Containers {
		if c.Name == containerName {
			return c
		}
	}
	t.Fatalf("Deployment has no container named %q", containerName)
	return container{}
}

// envValue returns the value of env var name in c, and whether it is set.
func envValue(c container, name string) (string, bool) {
	for _, e := range c.Env {
		if e.Name == name {
			return e.Value, true
		}
	}
	return "", false
}

// selects reports whether sel (matchLabels only) selects labels.
func selects(sel labelSelector, labels map[string]string) bool {
	if len(sel.MatchLabels) == 0 || len(sel.MatchExpressions) > 0 {
		return false
	}
	for k, v := range sel.MatchLabels {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// portIs reports whether a port (number or name, as YAML decodes it) is n or name.
func portIs(p any, n int, name string) bool {
	switch p := p.(type) {
	case int:
		return p == n
	case string:
		return p == name || p == fmt.Sprint(n)
	}
	return false
}

// walk calls fn on every map in the generic tree v, with its path.
func walk(v any, at string, fn func(at string, m map[string]any)) {
	switch v := v.(type) {
	case map[string]any:
		fn(at, v)
		for k, c := range v {
			walk(c, at+"."+k, fn)
		}
	case []any:
		for i, c := range v {
			walk(c, fmt.Sprintf("%s[%d]", at, i), fn)
		}
	}
}

// ---- the checks ----

type check struct {
	name string
	fn   func(t *testing.T, r *rendered, env string)
}

var checks = []check{
	{"DeploymentReplicas", checkReplicas},
	{"Probes", checkProbes},
	{"Resources", checkResources},
	{"SecurityContext", checkSecurityContext},
	{"GracefulShutdown", checkGracefulShutdown},
	{"GoMemLimit", checkGoMemLimit},
	{"ServiceAccountToken", checkServiceAccountToken},
	{"Service", checkService},
	{"HorizontalPodAutoscaler", checkHPA},
	{"PodDisruptionBudget", checkPDB},
	{"NetworkPolicy", checkNetworkPolicy},
	{"WebhookIntake", checkWebhookIntake},
	{"WebhookTokenFromSecretFile", checkWebhookTokenFromSecretFile},
	{"APIKeyFromSecretFile", checkAPIKeyFromSecretFile},
	{"NoLiteralAPIKey", checkNoLiteralAPIKey},
	{"Environment", checkEnvironment},
	{"OnlyOwnEnvironment", checkOnlyOwnEnvironment},
	{"DatabaseFromSecretFile", checkDatabaseFromSecretFile},
	{"NamespaceAndLabels", checkNamespaceAndLabels},
	{"PrometheusAnnotations", checkPrometheusAnnotations},
}

func TestOverlays(t *testing.T) {
	t.Parallel()
	for _, env := range environments {
		t.Run(env, func(t *testing.T) {
			t.Parallel()
			r := render(t, "overlays/"+env)
			for _, c := range checks {
				t.Run(c.name, func(t *testing.T) {
					t.Parallel()
					c.fn(t, r, env)
				})
			}
		})
	}
}

// TestBaseIsEnvironmentNeutral keeps every environment's settings out of the
// base, so an overlay can only ever carry its own.
func TestBaseIsEnvironmentNeutral(t *testing.T) {
	t.Parallel()
	r := render(t, "base")
	forbidden := []string{"PAYMENTS_ENVIRONMENT", "payments-provider", "api-key", envLabel}
	for _, env := range environments {
		forbidden = append(forbidden, envSpecific(env)...)
	}
	for _, s := range forbidden {
		if bytes.Contains(r.text, []byte(s)) {
			t.Errorf("base renders %q; environment-specific settings belong in overlays/", s)
		}
	}
}

func checkReplicas(t *testing.T, r *rendered, _ string) {
	d := one[deployment](t, r, "Deployment", "apps/v1")
	replicas := 1 // the API default
	if d.Spec.Replicas != nil {
		replicas = *d.Spec.Replicas
	}
	if replicas < 2 {
		t.Errorf("Deployment replicas = %d, want >= 2", replicas)
	}
}

func checkProbes(t *testing.T, r *rendered, _ string) {
	c := paymentsd(t, one[deployment](t, r, "Deployment", "apps/v1"))
	if p := c.ReadinessProbe; p == nil || p.GRPC == nil {
		t.Errorf("readinessProbe = %+v, want a grpc probe on port %d", p, grpcPort)
	} else {
		if p.GRPC.Port != grpcPort {
			t.Errorf("readinessProbe grpc port = %d, want %d", p.GRPC.Port, grpcPort)
		}
		if p.GRPC.Service != nil && *p.GRPC.Service != "" {
			t.Errorf("readinessProbe grpc service = %q, want \"\" (overall health, NOT_SERVING while draining)", *p.GRPC.Service)
		}
	}
	if p := c.LivenessProbe; p == nil || p.GRPC == nil {
		t.Errorf("livenessProbe = %+v, want a grpc probe on port %d, service liveness", p, grpcPort)
	} else {
		if p.GRPC.Port != grpcPort {
			t.Errorf("livenessProbe grpc port = %d, want %d", p.GRPC.Port, grpcPort)
		}
		if p.GRPC.Service == nil || *p.GRPC.Service != "liveness" {
			t.Errorf("livenessProbe grpc service = %q, want \"liveness\" (stays SERVING while draining)", deref(p.GRPC.Service))
		}
	}
}

func checkResources(t *testing.T, r *rendered, _ string) {
	c := paymentsd(t, one[deployment](t, r, "Deployment", "apps/v1"))
	for _, res := range []string{"cpu", "memory"} {
		if c.Resources.Requests[res] == "" {
			t.Errorf("container %s has no %s request", c.Name, res)
		}
		if c.Resources.Limits[res] == "" {
			t.Errorf("container %s has no %s limit", c.Name, res)
		}
	}
}

func checkSecurityContext(t *testing.T, r *rendered, _ string) {
	d := one[deployment](t, r, "Deployment", "apps/v1")
	pod := d.Spec.Template.Spec.SecurityContext
	if pod == nil {
		pod = &securityContext{}
	}
	all := slices.Concat(d.Spec.Template.Spec.InitContainers, d.Spec.Template.Spec.Containers)
	for _, c := range all {
		sc := c.SecurityContext
		if sc == nil {
			sc = &securityContext{}
		}
		// Fields the pod may set and the container override.
		runAsNonRoot := cmpOr(sc.RunAsNonRoot, pod.RunAsNonRoot)
		if runAsNonRoot == nil || !*runAsNonRoot {
			t.Errorf("container %s: runAsNonRoot = %v, want true", c.Name, deref(runAsNonRoot))
		}
		runAsUser := cmpOr(sc.RunAsUser, pod.RunAsUser)
		if runAsUser == nil || *runAsUser != nonrootUID {
			t.Errorf("container %s: runAsUser = %v, want %d (distroless nonroot)", c.Name, deref(runAsUser), nonrootUID)
		}
		seccomp := cmpOr(sc.SeccompProfile, pod.SeccompProfile)
		if seccomp == nil || seccomp.Type != "RuntimeDefault" {
			t.Errorf("container %s: seccompProfile = %+v, want type RuntimeDefault", c.Name, seccomp)
		}
		// Container-only fields.
		if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
			t.Errorf("container %s: readOnlyRootFilesystem = %v, want true", c.Name, deref(sc.ReadOnlyRootFilesystem))
		}
		if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
			t.Errorf("container %s: allowPrivilegeEscalation = %v, want false", c.Name, deref(sc.AllowPrivilegeEscalation))
		}
		if sc.Privileged != nil && *sc.Privileged {
			t.Errorf("container %s: privileged = true, want false", c.Name)
		}
		if sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") {
			t.Errorf("container %s: capabilities.drop does not contain ALL", c.Name)
		} else if len(sc.Capabilities.Add) > 0 {
			t.Errorf("container %s: capabilities.add = %v, want none", c.Name, sc.Capabilities.Add)
		}
	}
}

func cmpOr[T any](a, b *T) *T {
	if a != nil {
		return a
	}
	return b
}

func deref[T any](p *T) any {
	if p == nil {
		return "unset"
	}
	return *p
}

func checkGracefulShutdown(t *testing.T, r *rendered, _ string) {
	d := one[deployment](t, r, "Deployment", "apps/v1")
	c := paymentsd(t, d)
	v, ok := envValue(c, "PAYMENTS_SHUTDOWN_TIMEOUT")
	if !ok {
		t.Fatal("PAYMENTS_SHUTDOWN_TIMEOUT is not set; the grace period can't be checked against it")
	}
	shutdown, err := time.ParseDuration(v)
	if err != nil {
		t.Fatalf("PAYMENTS_SHUTDOWN_TIMEOUT = %q: %v", v, err)
	}
	// The shutdown delay, if set, comes before the drain.
	var delay time.Duration
	if v, ok := envValue(c, "PAYMENTS_SHUTDOWN_DELAY"); ok {
		if delay, err = time.ParseDuration(v); err != nil {
			t.Fatalf("PAYMENTS_SHUTDOWN_DELAY = %q: %v", v, err)
		}
	}
	grace := int64(30) // the API default
	if g := d.Spec.Template.Spec.TerminationGracePeriodSeconds; g != nil {
		grace = *g
	}
	// paymentsd gives calls cut off at the drain deadline 2s to answer.
	const hardStopGrace = 2 * time.Second
	if time.Duration(grace)*time.Second <= delay+shutdown+hardStopGrace {
		t.Errorf("terminationGracePeriodSeconds = %d, want > PAYMENTS_SHUTDOWN_DELAY + PAYMENTS_SHUTDOWN_TIMEOUT + 2s (%v + %v + %v), or draining gets SIGKILLed", grace, delay, shutdown, hardStopGrace)
	}
}

// checkGoMemLimit checks that GOMEMLIMIT is set to 80–95% of the
// container's memory limit: high enough to use the memory, low enough to
// leave room for what the Go runtime doesn't count.
func checkGoMemLimit(t *testing.T, r *rendered, _ string) {
	c := paymentsd(t, one[deployment](t, r, "Deployment", "apps/v1"))
	v, ok := envValue(c, "GOMEMLIMIT")
	if !ok {
		t.Fatal("GOMEMLIMIT is not set: the Go heap may grow into the container's OOM kill")
	}
	soft, ok := parseBytes(v, map[string]int64{"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30})
	if !ok {
		t.Fatalf("GOMEMLIMIT = %q, want a whole number of B, KiB, MiB or GiB", v)
	}
	limit, ok := parseBytes(c.Resources.Limits["memory"], map[string]int64{"": 1, "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30})
	if !ok {
		t.Fatalf("limits.memory = %q, want a whole number of Ki, Mi or Gi", c.Resources.Limits["memory"])
	}
	if ratio := float64(soft) / float64(limit); ratio < 0.80 || ratio > 0.95 {
		t.Errorf("GOMEMLIMIT %s is %.0f%% of limits.memory %s, want 80-95%%", v, 100*ratio, c.Resources.Limits["memory"])
	}
}

// parseBytes parses a whole number followed by one of units' suffixes.
func parseBytes(s string, units map[string]int64) (int64, bool) {
	i := strings.IndexFunc(s, func(r rune) bool { return r < '0' || r > '9' })
	if i < 0 {
		i = len(s)
	}
	n, err := strconv.ParseInt(s[:i], 10, 64)
	unit, ok := units[s[i:]]
	if err != nil || !ok {
		return 0, false
	}
	return n * unit, true
}

func checkServiceAccountToken(t *testing.T, r *rendered, _ string) {
	d := one[deployment](t, r, "Deployment", "apps/v1")
	if a := d.Spec.Template.Spec.AutomountServiceAccountToken; a == nil || *a {
		t.Errorf("pod automountServiceAccountToken = %v, want false", deref(a))
	}
}

func checkService(t *testing.T, r *rendered, _ string) {
	d := one[deployment](t, r, "Deployment", "apps/v1")
	s := named[service](t, r, "Service", "v1", "paymentsd")
	if slices.ContainsFunc(s.Spec.Ports, func(p servicePort) bool {
		return p.Port == webhookPort || portIs(p.TargetPort, webhookPort, "webhooks")
	}) {
		t.Errorf("Service paymentsd has the webhook port; it belongs to paymentsd-webhooks alone")
	}
	if !selects(labelSelector{MatchLabels: s.Spec.Selector}, d.Spec.Template.Metadata.Labels) {
		t.Errorf("Service selector %v does not select the pod labels %v", s.Spec.Selector, d.Spec.Template.Metadata.Labels)
	}
	want := map[string]int{"grpc": grpcPort, "http": httpPort}
	for name, port := range want {
		i := slices.IndexFunc(s.Spec.Ports, func(p servicePort) bool { return p.Name == name })
		if i < 0 {
			t.Errorf("Service has no port named %q", name)
			continue
		}
		p := s.Spec.Ports[i]
		if p.Port != port {
			t.Errorf("Service port %q = %d, want %d", name, p.Port, port)
		}
		if p.TargetPort != nil && !portIs(p.TargetPort, port, name) {
			t.Errorf("Service port %q targetPort = %v, want %d or %q", name, p.TargetPort, port, name)
		}
	}
}

func checkHPA(t *testing.T, r *rendered, _ string) {
	d := one[deployment](t, r, "Deployment", "apps/v1")
	h := one[hpa](t, r, "HorizontalPodAutoscaler", "autoscaling/v2")
	ref := h.Spec.ScaleTargetRef
	if ref.APIVersion != "apps/v1" || ref.Kind != "Deployment" || ref.Name != d.Metadata.Name {
		t.Errorf("HPA scaleTargetRef = %s %s/%s, want apps/v1 Deployment/%s", ref.APIVersion, ref.Kind, ref.Name, d.Metadata.Name)
	}
	minReplicas := 1 // the API default
	if h.Spec.MinReplicas != nil {
		minReplicas = *h.Spec.MinReplicas
	}
	if minReplicas < 2 {
		t.Errorf("HPA minReplicas = %d, want >= 2", minReplicas)
	}
	if h.Spec.MaxReplicas < minReplicas {
		t.Errorf("HPA maxReplicas = %d, want >= minReplicas (%d)", h.Spec.MaxReplicas, minReplicas)
	}
	if len(h.Spec.Metrics) == 0 {
		t.Error("HPA has no metrics")
	}
}

func checkPDB(t *testing.T, r *rendered, _ string) {
	d := one[deployment](t, r, "Deployment", "apps/v1")
	p := one[pdb](t, r, "PodDisruptionBudget", "policy/v1")
	if !selects(p.Spec.Selector, d.Spec.Template.Metadata.Labels) {
		t.Errorf("PodDisruptionBudget selector %v does not select the pod labels %v", p.Spec.Selector, d.Spec.Template.Metadata.Labels)
	}
	switch {
	case p.Spec.MinAvailable == nil && p.Spec.MaxUnavailable == nil:
		t.Error("PodDisruptionBudget sets neither minAvailable nor maxUnavailable")
	case p.Spec.MinAvailable != nil:
		if n, ok := p.Spec.MinAvailable.(int); ok && n < 1 {
			t.Errorf("PodDisruptionBudget minAvailable = %d, want >= 1", n)
		}
		if n, ok := p.Spec.MinAvailable.(int); ok && d.Spec.Replicas != nil && n >= *d.Spec.Replicas {
			t.Errorf("PodDisruptionBudget minAvailable = %d, want < replicas (%d) so nodes can drain", n, *d.Spec.Replicas)
		}
	}
}

func checkNetworkPolicy(t *testing.T, r *rendered, _ string) {
	d := one[deployment](t, r, "Deployment", "apps/v1")
	np := one[networkPolicy](t, r, "NetworkPolicy", "networking.k8s.io/v1")
	if !selects(np.Spec.PodSelector, d.Spec.Template.Metadata.Labels) {
		t.Errorf("NetworkPolicy podSelector %v does not select the pod labels %v", np.Spec.PodSelector, d.Spec.Template.Metadata.Labels)
	}
	if !slices.Equal(np.Spec.PolicyTypes, []string{"Ingress"}) {
		t.Errorf("NetworkPolicy policyTypes = %v, want [Ingress]", np.Spec.PolicyTypes)
	}
	if len(np.Spec.Ingress) == 0 {
		t.Fatal("NetworkPolicy has no ingress rules; internal callers could not reach paymentsd")
	}
	callers, webhooks := false, 0
	for i, rule := range np.Spec.Ingress {
		if len(rule.From) == 0 {
			t.Errorf("NetworkPolicy ingress[%d] has no from: it admits every source", i)
			continue
		}
		isCallerRule := false
		for j, p := range rule.From {
			if p.IPBlock != nil {
				t.Errorf("NetworkPolicy ingress[%d].from[%d] has an ipBlock; only labelled pods may be admitted", i, j)
			}
			if p.PodSelector == nil || len(p.PodSelector.MatchLabels) == 0 {
				t.Errorf("NetworkPolicy ingress[%d].from[%d] has no podSelector.matchLabels: it admits every pod of its namespaces", i, j)
				continue
			}
			// Any namespace ({}), AND pods labelled as callers: one peer.
			if p.NamespaceSelector != nil && len(p.NamespaceSelector.MatchLabels) == 0 && len(p.NamespaceSelector.MatchExpressions) == 0 &&
				len(p.PodSelector.MatchLabels) == 1 && p.PodSelector.MatchLabels[callerLabel] == "true" {
				isCallerRule = true
			}
		}
		if isCallerRule {
			callers = true
			// Internal callers need the internal ports only.
			if len(rule.Ports) == 0 {
				t.Errorf("NetworkPolicy ingress[%d] (the callers' rule) admits all ports, the webhook port too", i)
			}
			for _, p := range rule.Ports {
				if portIs(p.Port, webhookPort, "webhooks") {
					t.Errorf("NetworkPolicy ingress[%d] (the callers' rule) admits the webhook port %d", i, webhookPort)
				}
			}
			continue
		}
		// Any other rule reaches one port: the http port (the Prometheus
		// scraper) or the webhook port (the ingress controller), never the
		// gRPC port and never both.
		if len(rule.Ports) != 1 {
			t.Errorf("NetworkPolicy ingress[%d] (not the callers' rule) admits %d ports (0 is all), want only %d or only %d", i, len(rule.Ports), httpPort, webhookPort)
			continue
		}
		switch p := rule.Ports[0].Port; {
		case portIs(p, httpPort, "http"):
		case portIs(p, webhookPort, "webhooks"):
			webhooks++
		default:
			t.Errorf("NetworkPolicy ingress[%d] (not the callers' rule) admits port %v, want only %d or only %d", i, p, httpPort, webhookPort)
		}
	}
	if webhooks != 1 {
		t.Errorf("NetworkPolicy has %d rules for the webhook port %d, want 1 (the ingress controller)", webhooks, webhookPort)
	}
	if !callers {
		t.Errorf("NetworkPolicy has no ingress peer {namespaceSelector: {}, podSelector: {matchLabels: {%s: \"true\"}}}", callerLabel)
	}
}

func checkAPIKeyFromSecretFile(t *testing.T, r *rendered, env string) {
	for _, o := range r.objs {
		if o.Kind == "Secret" {
			t.Errorf("rendered a Secret %q; API key Secrets are created out of band, not in the manifests", o.Name)
		}
	}
	d := one[deployment](t, r, "Deployment", "apps/v1")
	checkFileFromSecret(t, d, "PAYMENTS_"+strings.ToUpper(env)+"_API_KEY_FILE", secretName(env))
}

// checkDatabaseFromSecretFile: replicas share one PostgreSQL database,
// whose URL (with its password) comes from a mounted Secret, never a
// literal.
func checkDatabaseFromSecretFile(t *testing.T, r *rendered, env string) {
	d := one[deployment](t, r, "Deployment", "apps/v1")
	c := paymentsd(t, d)
	if v, ok := envValue(c, "PAYMENTS_DATABASE_URL"); ok {
		t.Errorf("PAYMENTS_DATABASE_URL = %q is set; the URL holds a password and must come from PAYMENTS_DATABASE_URL_FILE", v)
	}
	checkFileFromSecret(t, d, "PAYMENTS_DATABASE_URL_FILE", databaseSecretName(env))
}

// checkFileFromSecret wants fileVar to name a file inside a read-only
// mount of the Secret secret.
func checkFileFromSecret(t *testing.T, d deployment, fileVar, secret string) {
	t.Helper()
	c := paymentsd(t, d)
	file, ok := envValue(c, fileVar)
	if !ok || !path.IsAbs(file) {
		t.Fatalf("%s = %q (set: %v), want an absolute path to a mounted Secret's file", fileVar, file, ok)
	}
	for _, m := range c.VolumeMounts {
		rel, inside := strings.CutPrefix(file, strings.TrimSuffix(m.MountPath, "/")+"/")
		if !inside || m.SubPath != "" {
			continue
		}
		if !m.ReadOnly {
			t.Errorf("volumeMount %s at %s is not readOnly", m.Name, m.MountPath)
		}
		i := slices.IndexFunc(d.Spec.Template.Spec.Volumes, func(v volume) bool { return v.Name == m.Name })
		if i < 0 {
			t.Fatalf("volumeMount %s has no volume", m.Name)
		}
		v := d.Spec.Template.Spec.Volumes[i]
		if v.Secret == nil {
			t.Fatalf("volume %s holding %s is not a Secret volume", v.Name, file)
		}
		if v.Secret.SecretName != secret {
			t.Errorf("volume %s secretName = %q, want %q", v.Name, v.Secret.SecretName, secret)
		}
		if len(v.Secret.Items) > 0 && !slices.ContainsFunc(v.Secret.Items, func(it keyToPath) bool { return it.Path == rel }) {
			t.Errorf("secret volume %s projects items %+v, none at %q, so %s would not exist", v.Name, v.Secret.Items, rel, file)
		}
		return
	}
	t.Errorf("%s = %s is under no volumeMount of container %s", fileVar, file, c.Name)
}

func checkNoLiteralAPIKey(t *testing.T, r *rendered, _ string) {
	for _, o := range r.objs {
		walk(o.raw, o.Kind+"/"+o.Name, func(at string, m map[string]any) {
			if name, ok := m["name"].(string); ok && literalKeyVar.MatchString(name) {
				t.Errorf("%s sets %s: the key must come from a file (%s_FILE), never an env var", at, name, name)
			}
		})
	}
	if m := regexp.MustCompile(`PAYMENTS_[A-Z0-9_]*API_KEY\b`).Find(r.text); m != nil {
		t.Errorf("rendered output mentions %s; only *_API_KEY_FILE may appear", m)
	}
	d := one[deployment](t, r, "Deployment", "apps/v1")
	for _, c := range d.Spec.Template.Spec.Containers {
		if len(c.EnvFrom) > 0 {
			t.Errorf("container %s uses envFrom, which could inject a literal key variable", c.Name)
		}
	}
}

func checkEnvironment(t *testing.T, r *rendered, env string) {
	c := paymentsd(t, one[deployment](t, r, "Deployment", "apps/v1"))
	if v, _ := envValue(c, "PAYMENTS_ENVIRONMENT"); v != env {
		t.Errorf("PAYMENTS_ENVIRONMENT = %q, want %q", v, env)
	}
	urlVar := "PAYMENTS_" + strings.ToUpper(env) + "_BASE_URL"
	v, ok := envValue(c, urlVar)
	if !ok {
		t.Fatalf("%s is not set", urlVar)
	}
	u, err := url.Parse(v)
	if err != nil {
		t.Fatalf("%s = %q: %v", urlVar, v, err)
	}
	if u.Host == "" || (u.Scheme != "https" && (env == "live" || u.Scheme != "http")) {
		t.Errorf("%s = %q, want an absolute https URL", urlVar, v)
	}
	if !strings.HasSuffix(u.Path, "/v1") {
		t.Errorf("%s = %q, want a path ending in /v1", urlVar, v)
	}
}

func checkOnlyOwnEnvironment(t *testing.T, r *rendered, env string) {
	for _, other := range environments {
		if other == env {
			continue
		}
		for _, s := range envSpecific(other) {
			if bytes.Contains(r.text, []byte(s)) {
				t.Errorf("%s overlay renders %q, which belongs to %s", env, s, other)
			}
		}
		for _, s := range []string{namespace(other), envLabel + ": " + other} {
			if bytes.Contains(r.text, []byte(s)) {
				t.Errorf("%s overlay renders %q, which belongs to %s", env, s, other)
			}
		}
	}
}

func checkNamespaceAndLabels(t *testing.T, r *rendered, env string) {
	for _, o := range r.objs {
		if o.Namespace != namespace(env) {
			t.Errorf("%s/%s namespace = %q, want %q", o.Kind, o.Name, o.Namespace, namespace(env))
		}
		var h struct {
			Metadata meta `yaml:"metadata"`
		}
		if err := o.node.Decode(&h); err != nil {
			t.Fatal(err)
		}
		if got := h.Metadata.Labels[envLabel]; got != env {
			t.Errorf("%s/%s label %s = %q, want %q", o.Kind, o.Name, envLabel, got, env)
		}
	}
	d := one[deployment](t, r, "Deployment", "apps/v1")
	if got := d.Spec.Template.Metadata.Labels[envLabel]; got != env {
		t.Errorf("pod template label %s = %q, want %q", envLabel, got, env)
	}
	if !selects(d.Spec.Selector, d.Spec.Template.Metadata.Labels) {
		t.Errorf("Deployment selector %v does not select its own pod labels %v", d.Spec.Selector, d.Spec.Template.Metadata.Labels)
	}
}

func checkPrometheusAnnotations(t *testing.T, r *rendered, _ string) {
	d := one[deployment](t, r, "Deployment", "apps/v1")
	a := d.Spec.Template.Metadata.Annotations
	if a["prometheus.io/scrape"] != "true" {
		return // not scraped through annotations; nothing to be consistent with
	}
	if a["prometheus.io/port"] != fmt.Sprint(httpPort) {
		t.Errorf("pod annotation prometheus.io/port = %q, want %q", a["prometheus.io/port"], fmt.Sprint(httpPort))
	}
	if p := a["prometheus.io/path"]; p != "" && p != "/metrics" {
		t.Errorf("pod annotation prometheus.io/path = %q, want /metrics", p)
	}
}

// checkWebhookIntake: the intake listens on its own port, exposed by a
// Service of its own whose only port it is.
func checkWebhookIntake(t *testing.T, r *rendered, _ string) {
	d := one[deployment](t, r, "Deployment", "apps/v1")
	c := paymentsd(t, d)
	if v, _ := envValue(c, "PAYMENTS_WEBHOOK_ADDR"); v != fmt.Sprintf(":%d", webhookPort) {
		t.Errorf("PAYMENTS_WEBHOOK_ADDR = %q, want \":%d\"", v, webhookPort)
	}
	hasPort := false
	for _, p := range c.Ports {
		hasPort = hasPort || (p.Name == "webhooks" && p.ContainerPort == webhookPort)
	}
	if !hasPort {
		t.Errorf("container %s has no port webhooks %d", c.Name, webhookPort)
	}
	s := named[service](t, r, "Service", "v1", "paymentsd-webhooks")
	if !selects(labelSelector{MatchLabels: s.Spec.Selector}, d.Spec.Template.Metadata.Labels) {
		t.Errorf("Service paymentsd-webhooks selector %v does not select the pod labels %v", s.Spec.Selector, d.Spec.Template.Metadata.Labels)
	}
	if len(s.Spec.Ports) != 1 || s.Spec.Ports[0].Port != webhookPort || !portIs(s.Spec.Ports[0].TargetPort, webhookPort, "webhooks") {
		t.Errorf("Service paymentsd-webhooks ports = %+v, want only webhooks %d", s.Spec.Ports, webhookPort)
	}
	for _, o := range r.objs {
		if o.Kind == "Ingress" {
			t.Errorf("rendered Ingress %s; the webhook Ingress is an example (examples/), set up per cluster", o.Name)
		}
	}
}

// checkWebhookTokenFromSecretFile: the webhook token, a secret, comes from
// a mounted Secret's file, never a literal.
func checkWebhookTokenFromSecretFile(t *testing.T, r *rendered, env string) {
	d := one[deployment](t, r, "Deployment", "apps/v1")
	c := paymentsd(t, d)
	literal := "PAYMENTS_" + strings.ToUpper(env) + "_WEBHOOK_TOKEN"
	if _, ok := envValue(c, literal); ok {
		t.Errorf("%s is set; the token must come from %s_FILE", literal, literal)
	}
	if m := regexp.MustCompile(`PAYMENTS_[A-Z0-9_]*WEBHOOK_TOKEN\b`).Find(r.text); m != nil {
		t.Errorf("rendered output mentions %s; only *_WEBHOOK_TOKEN_FILE may appear", m)
	}
	checkFileFromSecret(t, d, literal+"_FILE", webhookSecretName(env))
}

// TestWebhookIngressExample checks the example Ingress: it routes only
// /webhooks/ and only to the webhook Service's one port, and keeps the
// path (which holds the token) out of the controller's access log.
func TestWebhookIngressExample(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("examples/webhook-ingress.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var ing struct {
		Kind     string `yaml:"kind"`
		Metadata meta   `yaml:"metadata"`
		Spec     struct {
			TLS   []any `yaml:"tls"`
			Rules []struct {
				Host string `yaml:"host"`
				HTTP struct {
					Paths []struct {
						Path     string `yaml:"path"`
						PathType string `yaml:"pathType"`
						Backend  struct {
							Service struct {
								Name string `yaml:"name"`
								Port struct {
									Name   string `yaml:"name"`
									Number int    `yaml:"number"`
								} `yaml:"port"`
							} `yaml:"service"`
						} `yaml:"backend"`
					} `yaml:"paths"`
				} `yaml:"http"`
			} `yaml:"rules"`
			DefaultBackend any `yaml:"defaultBackend"`
		} `yaml:"spec"`
	}
	if err := yaml.Unmarshal(b, &ing); err != nil {
		t.Fatal(err)
	}
	if ing.Kind != "Ingress" || len(ing.Spec.TLS) == 0 || ing.Spec.DefaultBackend != nil || len(ing.Spec.Rules) == 0 {
		t.Fatalf("example = %+v, want an Ingress with TLS, rules and no default backend", ing)
	}
	for _, rule := range ing.Spec.Rules {
		if rule.Host == "" {
			t.Error("a rule has no host: it would take every host's traffic")
		}
		for _, p := range rule.HTTP.Paths {
			svc := p.Backend.Service
			if p.Path != "/webhooks/" || p.PathType != "Prefix" || svc.Name != "paymentsd-webhooks" ||
				!(svc.Port.Name == "webhooks" || svc.Port.Number == webhookPort) {
				t.Errorf("path %s (%s) -> %s:%s%d, want /webhooks/ (Prefix) -> paymentsd-webhooks:webhooks", p.Path, p.PathType, svc.Name, svc.Port.Name, svc.Port.Number)
			}
		}
	}
	if ing.Metadata.Annotations["nginx.ingress.kubernetes.io/enable-access-log"] != "false" {
		t.Error("the example leaves the ingress controller's access log on; it would log the token in the path")
	}
	if r := render(t, "overlays/sandbox"); bytes.Contains(r.text, []byte("kind: Ingress")) {
		t.Error("an overlay renders the example Ingress")
	}
}
