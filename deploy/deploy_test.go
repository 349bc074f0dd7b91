// Package deploy_test renders the kustomize overlays with the pinned
// kustomize (tools.go.mod), decodes every rendered object strictly into the
// Kubernetes API's own types (an unknown or misspelt field fails), and
// checks the manifests: probes, security context, shutdown timing,
// autoscaling, disruption budget, spread over zones and nodes, the
// PodMonitor, network policies in and out, the pinned image, the
// namespace, the caller allowlist, and that each overlay carries
// only its own provider environment and takes every secret from a mounted
// Secret that deploy/README.md says how to create.
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
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"

	"k8s.io/apimachinery/pkg/util/intstr"
	k8syaml "sigs.k8s.io/yaml"
)

const (
	containerName = "paymentsd"
	grpcPort      = 9090
	httpPort      = 8080
	webhookPort   = 8081
	metricsPort   = 8082
	healthPort    = 8083
	nonrootUID    = 65532 // distroless "nonroot"
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

// apiTypes are the Kubernetes API types of every kind the manifests may
// hold, by apiVersion and kind.
var apiTypes = map[string]func() any{
	"v1/Namespace":                             func() any { return &corev1.Namespace{} },
	"v1/ServiceAccount":                        func() any { return &corev1.ServiceAccount{} },
	"v1/ConfigMap":                             func() any { return &corev1.ConfigMap{} },
	"v1/Service":                               func() any { return &corev1.Service{} },
	"apps/v1/Deployment":                       func() any { return &appsv1.Deployment{} },
	"autoscaling/v2/HorizontalPodAutoscaler":   func() any { return &autoscalingv2.HorizontalPodAutoscaler{} },
	"policy/v1/PodDisruptionBudget":            func() any { return &policyv1.PodDisruptionBudget{} },
	"networking.k8s.io/v1/NetworkPolicy":       func() any { return &networkingv1.NetworkPolicy{} },
	"networking.k8s.io/v1/Ingress":             func() any { return &networkingv1.Ingress{} },
	"rbac.authorization.k8s.io/v1/Role":        func() any { return &rbacv1.Role{} },
	"rbac.authorization.k8s.io/v1/RoleBinding": func() any { return &rbacv1.RoleBinding{} },
	// cert-manager's and approver-policy's custom resources: see certificate.
	"cert-manager.io/v1/Certificate":                           func() any { return &certificate{} },
	"cert-manager.io/v1/ClusterIssuer":                         func() any { return &clusterIssuer{} },
	"policy.cert-manager.io/v1alpha1/CertificateRequestPolicy": func() any { return &certificateRequestPolicy{} },
	"trust.cert-manager.io/v1alpha1/Bundle":                    func() any { return &bundle{} },
	// prometheus-operator's Go types would bring its whole module (and a
	// second copy of the Kubernetes client libraries) for one object: a
	// local type holds the fields the manifests use, and strict decoding
	// refuses any other.
	"monitoring.coreos.com/v1/PodMonitor": func() any { return &podMonitor{} },
}

// strict decodes o into its Kubernetes API type, failing on any field the
// type doesn't have (as kubectl apply's strict field validation would) and
// on duplicate fields.
func strict(t *testing.T, o object) any {
	t.Helper()
	newType, ok := apiTypes[o.APIVersion+"/"+o.Kind]
	if !ok {
		t.Fatalf("%s %s/%s: no Kubernetes API type known for it here; add it to apiTypes", o.APIVersion, o.Kind, o.Name)
	}
	b, err := yaml.Marshal(&o.node)
	if err != nil {
		t.Fatal(err)
	}
	v := newType()
	if err := k8syaml.UnmarshalStrict(b, v); err != nil {
		t.Fatalf("%s/%s does not decode strictly into %T: %v", o.Kind, o.Name, v, err)
	}
	return v
}

// typed returns every object of T's kind, decoded strictly.
func typed[T any](t *testing.T, r *rendered, kind string) []*T {
	t.Helper()
	var out []*T
	for _, o := range r.objs {
		if o.Kind == kind {
			v, ok := strict(t, o).(*T)
			if !ok {
				t.Fatalf("%s/%s decodes into %T, not %T", o.Kind, o.Name, strict(t, o), new(T))
			}
			out = append(out, v)
		}
	}
	return out
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
	AutomountServiceAccountToken  *bool                      `yaml:"automountServiceAccountToken"`
	TerminationGracePeriodSeconds *int64                     `yaml:"terminationGracePeriodSeconds"`
	SecurityContext               *securityContext           `yaml:"securityContext"`
	InitContainers                []container                `yaml:"initContainers"`
	Containers                    []container                `yaml:"containers"`
	Volumes                       []volume                   `yaml:"volumes"`
	TopologySpreadConstraints     []topologySpreadConstraint `yaml:"topologySpreadConstraints"`
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
	StartupProbe   *probe `yaml:"startupProbe"`
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
	PeriodSeconds    int `yaml:"periodSeconds"`
	FailureThreshold int `yaml:"failureThreshold"`
	HTTPGet          any `yaml:"httpGet"`
	TCPSocket        any `yaml:"tcpSocket"`
	Exec             any `yaml:"exec"`
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
		MinAvailable               any           `yaml:"minAvailable"`
		MaxUnavailable             any           `yaml:"maxUnavailable"`
		Selector                   labelSelector `yaml:"selector"`
		UnhealthyPodEvictionPolicy string        `yaml:"unhealthyPodEvictionPolicy"`
	} `yaml:"spec"`
}

// podMonitor is prometheus-operator's PodMonitor (monitoring.coreos.com/v1),
// as far as these manifests use it; decoded strictly (see apiTypes), any
// other field fails, a misspelt one included. The field names are the
// CRD's.
type podMonitor struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name      string            `json:"name"`
		Namespace string            `json:"namespace"`
		Labels    map[string]string `json:"labels"`
	} `json:"metadata"`
	Spec struct {
		Selector struct {
			MatchLabels map[string]string `json:"matchLabels"`
		} `json:"selector"`
		PodMetricsEndpoints []struct {
			Port     string `json:"port"`
			Path     string `json:"path"`
			Scheme   string `json:"scheme"`
			Interval string `json:"interval"`
		} `json:"podMetricsEndpoints"`
	} `json:"spec"`
}

type topologySpreadConstraint struct {
	MaxSkew           int           `yaml:"maxSkew"`
	TopologyKey       string        `yaml:"topologyKey"`
	WhenUnsatisfiable string        `yaml:"whenUnsatisfiable"`
	LabelSelector     labelSelector `yaml:"labelSelector"`
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
	{"StrictKubernetesTypes", checkStrictTypes},
	{"Namespace", checkNamespace},
	{"ImagePinned", checkImagePinned},
	{"ServiceLinksOff", checkServiceLinksOff},
	{"AllowlistFromConfigMap", checkAllowlistConfigMap},
	{"SecretsDocumented", checkSecretsDocumented},
	{"Egress", checkEgress},
	{"DeploymentReplicas", checkReplicas},
	{"Probes", checkProbes},
	{"Resources", checkResources},
	{"SecurityContext", checkSecurityContext},
	{"GracefulShutdown", checkGracefulShutdown},
	{"GoMemLimit", checkGoMemLimit},
	{"ServiceAccountToken", checkServiceAccountToken},
	{"Service", checkService},
	{"GRPCHeadlessService", checkGRPCHeadlessService},
	{"HorizontalPodAutoscaler", checkHPA},
	{"PodDisruptionBudget", checkPDB},
	{"TopologySpread", checkTopologySpread},
	{"PodMonitor", checkPodMonitor},
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
	{"ServingCertificate", checkServingCertificate},
	{"CallerIdentities", checkCallerIdentities},
	{"ClientCAFromTrustBundle", checkClientCAFromTrustBundle},
	{"OnCallRBAC", checkOnCallRBAC},
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
	checkStrictTypes(t, r, "")
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

// checkReplicas: the HorizontalPodAutoscaler owns the replica count (its
// floor, at least 2, is checked in checkHPA); a replicas field on the
// Deployment would reset it on every apply.
func checkReplicas(t *testing.T, r *rendered, _ string) {
	d := one[deployment](t, r, "Deployment", "apps/v1")
	if d.Spec.Replicas != nil {
		t.Errorf("Deployment replicas = %d; an HPA scales it, so every apply would reset the count: leave replicas out", *d.Spec.Replicas)
	}
}

func checkStrictTypes(t *testing.T, r *rendered, _ string) {
	for _, o := range r.objs {
		strict(t, o)
	}
}

// checkNamespace: the overlay renders its Namespace, enforcing the
// restricted Pod Security Standard, which the pods meet.
func checkNamespace(t *testing.T, r *rendered, env string) {
	nss := typed[corev1.Namespace](t, r, "Namespace")
	if len(nss) != 1 || nss[0].Name != namespace(env) {
		t.Fatalf("rendered Namespaces %v, want one, %s", nss, namespace(env))
	}
	if got := nss[0].Labels["pod-security.kubernetes.io/enforce"]; got != "restricted" {
		t.Errorf("Namespace %s pod-security.kubernetes.io/enforce = %q, want restricted", env, got)
	}
}

// digestRef is an image pinned by digest.
var digestRef = regexp.MustCompile(`^[a-z0-9]+([._/:-][a-z0-9]+)*@sha256:[0-9a-f]{64}$`)

// checkImagePinned: every container runs an image pinned by digest from a
// registry, never a bare name or :latest.
func checkImagePinned(t *testing.T, r *rendered, _ string) {
	for _, d := range typed[appsv1.Deployment](t, r, "Deployment") {
		for _, c := range slices.Concat(d.Spec.Template.Spec.InitContainers, d.Spec.Template.Spec.Containers) {
			if !digestRef.MatchString(c.Image) || !strings.Contains(strings.Split(c.Image, "@")[0], "/") {
				t.Errorf("container %s image = %q, want REGISTRY/NAME@sha256:DIGEST (set it with kustomize edit set image; see deploy/README.md)", c.Name, c.Image)
			}
		}
	}
}

func checkServiceLinksOff(t *testing.T, r *rendered, _ string) {
	for _, d := range typed[appsv1.Deployment](t, r, "Deployment") {
		if e := d.Spec.Template.Spec.EnableServiceLinks; e == nil || *e {
			t.Errorf("Deployment %s enableServiceLinks = %v, want false: a Service named payments… would put PAYMENTS_* variables in the pod", d.Name, deref(e))
		}
	}
}

// checkAllowlistConfigMap: PAYMENTS_ALLOWED_CALLERS comes from a key of a
// ConfigMap that the overlay renders, so the list lives in one place and
// a change rolls the pods.
func checkAllowlistConfigMap(t *testing.T, r *rendered, _ string) {
	d := typed[appsv1.Deployment](t, r, "Deployment")[0]
	c := d.Spec.Template.Spec.Containers[slices.IndexFunc(d.Spec.Template.Spec.Containers, func(c corev1.Container) bool { return c.Name == containerName })]
	i := slices.IndexFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == "PAYMENTS_ALLOWED_CALLERS" })
	if i < 0 || c.Env[i].ValueFrom == nil || c.Env[i].ValueFrom.ConfigMapKeyRef == nil {
		t.Fatal("PAYMENTS_ALLOWED_CALLERS is not read from a ConfigMap (valueFrom.configMapKeyRef)")
	}
	ref := c.Env[i].ValueFrom.ConfigMapKeyRef
	if ref.Optional != nil && *ref.Optional {
		t.Errorf("PAYMENTS_ALLOWED_CALLERS's configMapKeyRef is optional: a missing ConfigMap would turn the allowlist off silently")
	}
	for _, cm := range typed[corev1.ConfigMap](t, r, "ConfigMap") {
		if cm.Name == ref.Name {
			if _, ok := cm.Data[ref.Key]; !ok {
				t.Errorf("ConfigMap %s has no key %q", cm.Name, ref.Key)
			}
			if !strings.HasPrefix(cm.Name, "paymentsd-callers-") {
				t.Errorf("ConfigMap %s has no content hash in its name: a change would not roll the pods", cm.Name)
			}
			return
		}
	}
	t.Errorf("PAYMENTS_ALLOWED_CALLERS names ConfigMap %s, which is not rendered", ref.Name)
}

// checkSecretsDocumented: every Secret the pods mount is listed in
// deploy/README.md with the command that creates it, in the overlay's
// namespace, with the key the volume reads.
func checkSecretsDocumented(t *testing.T, r *rendered, env string) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	d := typed[appsv1.Deployment](t, r, "Deployment")[0]
	issued := map[string]bool{} // Secrets cert-manager writes for a rendered Certificate
	for _, c := range typed[certificate](t, r, "Certificate") {
		issued[c.Spec.SecretName] = true
	}
	n := 0
	for _, v := range d.Spec.Template.Spec.Volumes {
		if v.Secret == nil || issued[v.Secret.SecretName] {
			continue
		}
		n++
		for _, item := range v.Secret.Items {
			cmd := fmt.Sprintf("kubectl -n %s create secret generic %s --from-file=%s=", namespace(env), v.Secret.SecretName, item.Key)
			if !bytes.Contains(readme, []byte(cmd)) {
				t.Errorf("deploy/README.md has no %q… for the Secret the pods mount", cmd)
			}
		}
	}
	if n != 3 {
		t.Errorf("the pods mount %d Secrets made out of band, want 3 (API key, database URL, webhook token)", n)
	}
}

// checkEgress: some policy restricts the pods' egress, and it allows only
// DNS to the cluster's resolver, HTTPS (the provider) and PostgreSQL (the
// database), each to named destinations, never to anywhere.
func checkEgress(t *testing.T, r *rendered, _ string) {
	d := one[deployment](t, r, "Deployment", "apps/v1")
	restricted := false
	ports := map[int32]bool{}
	for _, np := range typed[networkingv1.NetworkPolicy](t, r, "NetworkPolicy") {
		if !selects(labelSelector{MatchLabels: np.Spec.PodSelector.MatchLabels}, d.Spec.Template.Metadata.Labels) {
			continue
		}
		restricted = restricted || slices.Contains(np.Spec.PolicyTypes, networkingv1.PolicyTypeEgress)
		for i, rule := range np.Spec.Egress {
			if len(rule.To) == 0 || len(rule.Ports) == 0 {
				t.Errorf("NetworkPolicy %s egress[%d] allows every destination or every port", np.Name, i)
				continue
			}
			for _, p := range rule.Ports {
				if p.Port == nil || p.Port.Type != intstr.Int {
					t.Errorf("NetworkPolicy %s egress[%d] port %v, want a number", np.Name, i, p.Port)
					continue
				}
				port := p.Port.IntVal
				ports[port] = true
				if port != 53 && port != 443 && port != 5432 {
					t.Errorf("NetworkPolicy %s egress[%d] allows port %d, want only 53 (DNS), 443 (the provider) and 5432 (the database)", np.Name, i, port)
				}
			}
			for j, peer := range rule.To {
				switch {
				case peer.IPBlock != nil:
					if strings.HasSuffix(peer.IPBlock.CIDR, "/0") {
						t.Errorf("NetworkPolicy %s egress[%d].to[%d] is %s: anywhere", np.Name, i, j, peer.IPBlock.CIDR)
					}
				case peer.NamespaceSelector == nil || len(peer.NamespaceSelector.MatchLabels) == 0 || peer.PodSelector == nil || len(peer.PodSelector.MatchLabels) == 0:
					t.Errorf("NetworkPolicy %s egress[%d].to[%d] = %+v, want an ipBlock or a named namespace and pods", np.Name, i, j, peer)
				}
			}
		}
	}
	if !restricted {
		t.Fatal("no NetworkPolicy restricts paymentsd's egress")
	}
	for _, p := range []int32{53, 443, 5432} {
		if !ports[p] {
			t.Errorf("no egress rule allows port %d; paymentsd needs DNS, the provider (443) and the database (5432)", p)
		}
	}
}

// TestImageCanBeSetAsDocumented runs deploy/README.md's command for pinning
// the image, with the pinned kustomize, from an overlay's directory (a
// copy), and renders the result.
func TestImageCanBeSetAsDocumented(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	const documented = "go tool -modfile=../../../tools.go.mod kustomize edit set image paymentsd="
	if !bytes.Contains(readme, []byte(documented)) {
		t.Fatalf("deploy/README.md no longer documents %q", documented)
	}
	// A copy inside the module, so that go finds its go.mod; a name
	// starting with '.' keeps it out of ./... patterns.
	dir, err := os.MkdirTemp(".", ".edit-image-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.CopyFS(filepath.Join(dir, "base"), os.DirFS("base")); err != nil {
		t.Fatal(err)
	}
	if err := os.CopyFS(filepath.Join(dir, "overlays", "live"), os.DirFS("overlays/live")); err != nil {
		t.Fatal(err)
	}
	if err := os.CopyFS(filepath.Join(dir, "components"), os.DirFS("components")); err != nil {
		t.Fatal(err)
	}
	const image = "registry.example.com/payments/paymentsd@sha256:1111111111111111111111111111111111111111111111111111111111111111"
	modfile, err := filepath.Abs("../tools.go.mod")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(t.Context(), "go", "tool", "-modfile="+modfile, "kustomize", "edit", "set", "image", "paymentsd="+image)
	cmd.Dir = filepath.Join(dir, "overlays", "live")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("kustomize edit set image: %v\n%s", err, out)
	}
	r := render(t, filepath.Join(dir, "overlays", "live"))
	if c := paymentsd(t, one[deployment](t, r, "Deployment", "apps/v1")); c.Image != image {
		t.Errorf("after kustomize edit set image, the image is %q, want %q", c.Image, image)
	}
}

// checkProbes: the probes ask the health port, which alone serves
// without TLS and client certificates (the kubelet presents none, and its
// gRPC probe speaks only cleartext).
func checkProbes(t *testing.T, r *rendered, _ string) {
	c := paymentsd(t, one[deployment](t, r, "Deployment", "apps/v1"))
	if v, _ := envValue(c, "PAYMENTS_HEALTH_ADDR"); v != fmt.Sprintf(":%d", healthPort) {
		t.Errorf("PAYMENTS_HEALTH_ADDR = %q, want \":%d\"", v, healthPort)
	}
	if !slices.ContainsFunc(c.Ports, func(p struct {
		Name          string `yaml:"name"`
		ContainerPort int    `yaml:"containerPort"`
	}) bool {
		return p.Name == "health" && p.ContainerPort == healthPort
	}) {
		t.Errorf("container %s has no port health %d", c.Name, healthPort)
	}
	if p := c.ReadinessProbe; p == nil || p.GRPC == nil {
		t.Errorf("readinessProbe = %+v, want a grpc probe on port %d", p, healthPort)
	} else {
		if p.GRPC.Port != healthPort {
			t.Errorf("readinessProbe grpc port = %d, want %d", p.GRPC.Port, healthPort)
		}
		if p.GRPC.Service != nil && *p.GRPC.Service != "" {
			t.Errorf("readinessProbe grpc service = %q, want \"\" (overall health, NOT_SERVING while draining)", *p.GRPC.Service)
		}
	}
	if p := c.LivenessProbe; p == nil || p.GRPC == nil {
		t.Errorf("livenessProbe = %+v, want a grpc probe on port %d, service liveness", p, healthPort)
	} else {
		if p.GRPC.Port != healthPort {
			t.Errorf("livenessProbe grpc port = %d, want %d", p.GRPC.Port, healthPort)
		}
		if p.GRPC.Service == nil || *p.GRPC.Service != "liveness" {
			t.Errorf("livenessProbe grpc service = %q, want \"liveness\" (stays SERVING while draining)", deref(p.GRPC.Service))
		}
	}
	// The ports open once the store is connected and migrated, within
	// PAYMENTS_DATABASE_CONNECT_TIMEOUT and _MIGRATE_TIMEOUT (defaults 15s
	// and 1m): the startup probe must wait longer, so that a database
	// that never answers ends in paymentsd's own refusal, not a kill.
	p := c.StartupProbe
	if p == nil || p.GRPC == nil || p.GRPC.Port != healthPort {
		t.Fatalf("startupProbe = %+v, want a grpc probe on port %d", p, healthPort)
	}
	wait := 10 * time.Second // margin for the process's own start
	for name, def := range map[string]time.Duration{"PAYMENTS_DATABASE_CONNECT_TIMEOUT": 15 * time.Second, "PAYMENTS_DATABASE_MIGRATE_TIMEOUT": time.Minute} {
		d := def
		if v, ok := envValue(c, name); ok {
			var err error
			if d, err = time.ParseDuration(v); err != nil {
				t.Fatalf("%s = %q: %v", name, v, err)
			}
		}
		wait += d
	}
	period, failures := max(p.PeriodSeconds, 1), max(p.FailureThreshold, 1) // 0: the API defaults, 10 and 3
	if p.PeriodSeconds == 0 {
		period = 10
	}
	if p.FailureThreshold == 0 {
		failures = 3
	}
	if window := time.Duration(period*failures) * time.Second; window <= wait {
		t.Errorf("startupProbe allows %v (%d × %ds), want more than the database timeouts plus 10s, %v", window, failures, period, wait)
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

// checkGRPCHeadlessService: gRPC callers balance over the pods themselves
// (paymentsclient's round_robin) through a headless Service, whose name
// resolves to every ready pod: no cluster IP, no pod that isn't ready, and
// only the gRPC port, which must be the container's own, since callers
// connect to the pods directly.
func checkGRPCHeadlessService(t *testing.T, r *rendered, _ string) {
	i := slices.IndexFunc(typed[corev1.Service](t, r, "Service"), func(s *corev1.Service) bool { return s.Name == "paymentsd-grpc" })
	if i < 0 {
		t.Fatal("rendered no Service paymentsd-grpc: gRPC callers have no name that resolves to every pod")
	}
	s := typed[corev1.Service](t, r, "Service")[i]
	if s.Spec.ClusterIP != corev1.ClusterIPNone || (s.Spec.Type != "" && s.Spec.Type != corev1.ServiceTypeClusterIP) {
		t.Errorf("Service paymentsd-grpc type %q clusterIP %q, want headless (clusterIP: None)", s.Spec.Type, s.Spec.ClusterIP)
	}
	if s.Spec.PublishNotReadyAddresses {
		t.Error("Service paymentsd-grpc publishes pods that aren't ready: callers would send payments to pods starting or draining")
	}
	d := typed[appsv1.Deployment](t, r, "Deployment")[0]
	if !selects(labelSelector{MatchLabels: s.Spec.Selector}, d.Spec.Template.Labels) {
		t.Errorf("Service paymentsd-grpc selector %v does not select the pod labels %v", s.Spec.Selector, d.Spec.Template.Labels)
	}
	if len(s.Spec.Ports) != 1 || s.Spec.Ports[0].Name != "grpc" || s.Spec.Ports[0].Port != grpcPort {
		t.Fatalf("Service paymentsd-grpc ports = %+v, want only grpc %d", s.Spec.Ports, grpcPort)
	}
	switch tp := s.Spec.Ports[0].TargetPort; {
	case tp == intstr.IntOrString{}, tp.Type == intstr.Int && tp.IntVal == grpcPort, tp.Type == intstr.String && tp.StrVal == "grpc":
	default:
		t.Errorf("Service paymentsd-grpc targetPort = %v, want %d or \"grpc\"", tp.String(), grpcPort)
	}
	c := d.Spec.Template.Spec.Containers[slices.IndexFunc(d.Spec.Template.Spec.Containers, func(c corev1.Container) bool { return c.Name == containerName })]
	if !slices.ContainsFunc(c.Ports, func(p corev1.ContainerPort) bool { return p.Name == "grpc" && p.ContainerPort == grpcPort }) {
		t.Errorf("container %s has no port grpc %d, which callers of the headless Service dial", c.Name, grpcPort)
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

// minAvailableThroughDrains is how many ready pods each environment keeps
// through voluntary disruptions (node drains), at every replica count the
// HPA may choose: live, which takes real payments, at least two.
var minAvailableThroughDrains = map[string]int{"sandbox": 1, "live": 2}

// evictionAllowed is what the eviction API (Kubernetes'
// pkg/registry/core/pod/storage/eviction.go) answers a drain asking to
// evict one running pod, ready or not, selected by budget p alone, when n
// pods are expected and healthy of them are ready.
func evictionAllowed(p pdb, n, healthy int, ready bool) bool {
	desired := n // the PDB controller's desiredHealthy
	if v, ok := p.Spec.MaxUnavailable.(int); ok {
		desired = n - v
	} else if v, ok := p.Spec.MinAvailable.(int); ok {
		desired = v
	}
	if !ready {
		if p.Spec.UnhealthyPodEvictionPolicy == "AlwaysAllow" {
			return true
		}
		// IfHealthyBudget, the default: only while the budget holds
		// without it.
		if healthy >= desired && desired > 0 {
			return true
		}
	}
	return healthy-desired > 0 // disruptionsAllowed
}

// checkPDB: the budget selects the pods and, at every replica count from
// the HPA's minimum to its maximum, keeps the environment's floor of pods
// while still letting a drain evict one. A pod that is not ready is
// evicted only while the budget holds without it: when every replica's
// store writes fail at once (the database, shared by all), each holds
// outcomes it could not record (PaymentsdOutcomesPending: never evict
// it), and a drain must wait rather than evict them one after the other.
// (One not-ready pod among ready ones stays evictable: a budget can't keep
// one pod while it allows a disruption; docs/runbooks.md says so.)
func checkPDB(t *testing.T, r *rendered, env string) {
	d := one[deployment](t, r, "Deployment", "apps/v1")
	p := one[pdb](t, r, "PodDisruptionBudget", "policy/v1")
	h := one[hpa](t, r, "HorizontalPodAutoscaler", "autoscaling/v2")
	if !selects(p.Spec.Selector, d.Spec.Template.Metadata.Labels) {
		t.Errorf("PodDisruptionBudget selector %v does not select the pod labels %v", p.Spec.Selector, d.Spec.Template.Metadata.Labels)
	}
	if p.Spec.UnhealthyPodEvictionPolicy != "IfHealthyBudget" {
		t.Errorf("PodDisruptionBudget unhealthyPodEvictionPolicy = %q, want IfHealthyBudget, written out (the default since Kubernetes 1.27; AlwaysAllow evicts pods holding unrecorded outcomes)", p.Spec.UnhealthyPodEvictionPolicy)
	}
	minAvailable, minSet := p.Spec.MinAvailable.(int)
	maxUnavailable, maxSet := p.Spec.MaxUnavailable.(int)
	if minSet == maxSet {
		t.Fatalf("PodDisruptionBudget minAvailable %v, maxUnavailable %v: want exactly one, as a number of pods", p.Spec.MinAvailable, p.Spec.MaxUnavailable)
	}
	lowest := 1 // the API default
	if h.Spec.MinReplicas != nil {
		lowest = *h.Spec.MinReplicas
	}
	for n := lowest; n <= h.Spec.MaxReplicas; n++ {
		// What the disruption controller allows with n healthy pods.
		keeps := minAvailable
		if maxSet {
			keeps = n - maxUnavailable
		}
		if keeps < minAvailableThroughDrains[env] {
			t.Errorf("with %d pods, the PodDisruptionBudget lets a drain leave %d, want at least %d in %s", n, keeps, minAvailableThroughDrains[env], env)
		}
		if n-keeps < 1 {
			t.Errorf("with %d pods, the PodDisruptionBudget lets a drain evict none: nodes could never be drained", n)
		}
		// Every replica's writes failing: none ready, each holding
		// outcomes.
		if evictionAllowed(p, n, 0, false) {
			t.Errorf("with %d pods all not ready (the shared store's writes failing), a drain may evict one: it would lose the outcomes it holds", n)
		}
		// One replica not ready: its eviction is the budget's one
		// disruption, as a ready pod's would be (the runbook's case).
		if !evictionAllowed(p, n, n-1, false) || !evictionAllowed(p, n, n, true) {
			t.Errorf("with %d pods, a drain may not evict a ready pod, or a lone not-ready one: nodes could not be drained", n)
		}
	}
}

// checkTopologySpread: pods spread across zones and across nodes, so that
// losing one takes a share of them; neither constraint refuses to schedule
// a pod when it can't be met (one zone, or a zone down).
func checkTopologySpread(t *testing.T, r *rendered, _ string) {
	d := one[deployment](t, r, "Deployment", "apps/v1")
	spread := map[string]bool{}
	for _, c := range d.Spec.Template.Spec.TopologySpreadConstraints {
		if !selects(c.LabelSelector, d.Spec.Template.Metadata.Labels) {
			t.Errorf("topology spread over %s: labelSelector %v does not select the pod labels", c.TopologyKey, c.LabelSelector)
			continue
		}
		if c.MaxSkew != 1 || c.WhenUnsatisfiable != "ScheduleAnyway" {
			t.Errorf("topology spread over %s: maxSkew %d, %s; want 1, ScheduleAnyway", c.TopologyKey, c.MaxSkew, c.WhenUnsatisfiable)
		}
		spread[c.TopologyKey] = true
	}
	for _, key := range []string{"topology.kubernetes.io/zone", "kubernetes.io/hostname"} {
		if !spread[key] {
			t.Errorf("the pods are not spread over %s", key)
		}
	}
}

// checkPodMonitor: one PodMonitor scrapes the pods' metrics port (the
// container port named metrics, which serves GET /metrics and nothing
// else, the one the NetworkPolicy admits Prometheus to), in plaintext as
// the manifests serve it.
func checkPodMonitor(t *testing.T, r *rendered, _ string) {
	d := one[deployment](t, r, "Deployment", "apps/v1")
	pms := typed[podMonitor](t, r, "PodMonitor")
	if len(pms) != 1 {
		t.Fatalf("rendered %d PodMonitors, want 1", len(pms))
	}
	pm := pms[0]
	if pm.APIVersion != "monitoring.coreos.com/v1" {
		t.Errorf("PodMonitor apiVersion = %q, want monitoring.coreos.com/v1", pm.APIVersion)
	}
	if !selects(labelSelector{MatchLabels: pm.Spec.Selector.MatchLabels}, d.Spec.Template.Metadata.Labels) {
		t.Errorf("PodMonitor selector %v does not select the pod labels %v", pm.Spec.Selector.MatchLabels, d.Spec.Template.Metadata.Labels)
	}
	if len(pm.Spec.PodMetricsEndpoints) != 1 {
		t.Fatalf("PodMonitor has %d endpoints, want 1 (the metrics port)", len(pm.Spec.PodMetricsEndpoints))
	}
	ep := pm.Spec.PodMetricsEndpoints[0]
	port := 0
	for _, p := range paymentsd(t, d).Ports {
		if p.Name == ep.Port {
			port = p.ContainerPort
		}
	}
	if port != metricsPort || ep.Path != "/metrics" || ep.Scheme != "http" {
		t.Errorf("PodMonitor scrapes port %q (container port %d), path %q, scheme %q; want the port named metrics (%d), /metrics, http", ep.Port, port, ep.Path, ep.Scheme, metricsPort)
	}
	if ep.Interval != "" {
		if _, err := time.ParseDuration(ep.Interval); err != nil {
			t.Errorf("PodMonitor interval %q: %v", ep.Interval, err)
		}
	}
}

// checkNetworkPolicy: the policies selecting paymentsd's pods admit, each
// peer by a named namespace AND its pods (both selectors in one peer),
// callers to the API ports only, Prometheus to the http port only, and the
// ingress controller to the webhook port only; nothing by address, and no
// namespace left open.
func checkNetworkPolicy(t *testing.T, r *rendered, _ string) {
	d := one[deployment](t, r, "Deployment", "apps/v1")
	callers, webhooks := 0, 0
	for _, np := range typed[networkingv1.NetworkPolicy](t, r, "NetworkPolicy") {
		if !selects(labelSelector{MatchLabels: np.Spec.PodSelector.MatchLabels}, d.Spec.Template.Metadata.Labels) {
			t.Errorf("NetworkPolicy %s podSelector %v does not select the pod labels %v", np.Name, np.Spec.PodSelector.MatchLabels, d.Spec.Template.Metadata.Labels)
			continue
		}
		if len(np.Spec.Ingress) > 0 && !slices.Contains(np.Spec.PolicyTypes, networkingv1.PolicyTypeIngress) {
			t.Errorf("NetworkPolicy %s has ingress rules but no Ingress policyType", np.Name)
		}
		for i, rule := range np.Spec.Ingress {
			at := fmt.Sprintf("NetworkPolicy %s ingress[%d]", np.Name, i)
			if len(rule.From) == 0 {
				t.Errorf("%s has no from: it admits every source", at)
				continue
			}
			for j, p := range rule.From {
				switch {
				case p.IPBlock != nil:
					t.Errorf("%s.from[%d] has an ipBlock; only named pods may be admitted", at, j)
				case p.NamespaceSelector == nil || p.NamespaceSelector.MatchLabels["kubernetes.io/metadata.name"] == "":
					t.Errorf("%s.from[%d] names no namespace (namespaceSelector.matchLabels kubernetes.io/metadata.name): it admits pods of any namespace that so label themselves", at, j)
				case p.PodSelector == nil || len(p.PodSelector.MatchLabels) == 0:
					t.Errorf("%s.from[%d] has no podSelector.matchLabels: it admits every pod of namespace %s", at, j, p.NamespaceSelector.MatchLabels["kubernetes.io/metadata.name"])
				}
			}
			if len(rule.Ports) == 0 {
				t.Errorf("%s admits every port", at)
				continue
			}
			var admitted []int
			for _, p := range rule.Ports {
				if p.Port == nil {
					t.Errorf("%s admits every port", at)
					continue
				}
				admitted = append(admitted, p.Port.IntValue())
			}
			slices.Sort(admitted)
			switch {
			case slices.Equal(admitted, []int{httpPort, grpcPort}), slices.Equal(admitted, []int{grpcPort}):
				callers++ // the API: callers
			case slices.Equal(admitted, []int{metricsPort}): // Prometheus
			case slices.Equal(admitted, []int{webhookPort}):
				webhooks++ // the ingress controller
			default:
				// Only the http port, for Prometheus, would admit the
				// scraper to the REST API as well: policies admit by port.
				t.Errorf("%s admits ports %v, want the API (%d, %d), only metrics %d, or only webhooks %d", at, admitted, grpcPort, httpPort, metricsPort, webhookPort)
			}
		}
	}
	if callers == 0 {
		t.Error("no NetworkPolicy admits callers to the gRPC port")
	}
	if webhooks != 1 {
		t.Errorf("NetworkPolicies have %d rules for the webhook port %d, want 1 (the ingress controller)", webhooks, webhookPort)
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
		if o.Kind != "Namespace" && o.Namespace != namespace(env) {
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
	if a["prometheus.io/port"] != fmt.Sprint(metricsPort) {
		t.Errorf("pod annotation prometheus.io/port = %q, want %q (the metrics port, which serves nothing else)", a["prometheus.io/port"], fmt.Sprint(metricsPort))
	}
	c := paymentsd(t, d)
	if v, _ := envValue(c, "PAYMENTS_METRICS_ADDR"); v != fmt.Sprintf(":%d", metricsPort) {
		t.Errorf("PAYMENTS_METRICS_ADDR = %q, want \":%d\"", v, metricsPort)
	}
	hasPort := false
	for _, p := range c.Ports {
		hasPort = hasPort || (p.Name == "metrics" && p.ContainerPort == metricsPort)
	}
	if !hasPort {
		t.Errorf("container %s has no port metrics %d", c.Name, metricsPort)
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
