package deploy_test

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"cel.dev/cel-go/cel"
	"cel.dev/cel-go/ext"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8syaml "sigs.k8s.io/yaml"

	paymentssvc "example.com/paymentsd/internal/service"
)

// certificate, clusterIssuer and certificateRequestPolicy are cert-manager's
// (cert-manager.io/v1) and approver-policy's (policy.cert-manager.io/
// v1alpha1) resources, as their CRDs define them, with only the fields
// these manifests may use: strict decoding fails on any other field, such
// as a misspelt one. (Their own Go modules would bring controller-runtime
// and cert-manager's dependency tree into this module for three types.)
type certificate struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		SecretName  string   `json:"secretName"`
		Duration    string   `json:"duration,omitempty"`
		RenewBefore string   `json:"renewBefore,omitempty"`
		DNSNames    []string `json:"dnsNames,omitempty"`
		URIs        []string `json:"uris,omitempty"`
		Usages      []string `json:"usages,omitempty"`
		PrivateKey  *struct {
			Algorithm      string `json:"algorithm,omitempty"`
			Size           int    `json:"size,omitempty"`
			Encoding       string `json:"encoding,omitempty"`
			RotationPolicy string `json:"rotationPolicy,omitempty"`
		} `json:"privateKey,omitempty"`
		IssuerRef issuerRef `json:"issuerRef"`
	} `json:"spec"`
}

// bundle is trust-manager's Bundle (trust.cert-manager.io/v1alpha1), with
// the fields these manifests may use, decoded strictly as certificate is.
type bundle struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		Sources []struct {
			Secret *struct {
				Name string `json:"name"`
				Key  string `json:"key"`
			} `json:"secret,omitempty"`
			ConfigMap *struct {
				Name string `json:"name"`
				Key  string `json:"key"`
			} `json:"configMap,omitempty"`
			InLine        *string `json:"inLine,omitempty"`
			UseDefaultCAs *bool   `json:"useDefaultCAs,omitempty"`
		} `json:"sources"`
		Target struct {
			ConfigMap *struct {
				Key string `json:"key"`
			} `json:"configMap,omitempty"`
			NamespaceSelector *struct {
				MatchLabels map[string]string `json:"matchLabels,omitempty"`
			} `json:"namespaceSelector,omitempty"`
		} `json:"target"`
	} `json:"spec"`
}

type issuerRef struct {
	Name  string `json:"name"`
	Kind  string `json:"kind,omitempty"`
	Group string `json:"group,omitempty"`
}

type clusterIssuer struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		CA *struct {
			SecretName string `json:"secretName"`
		} `json:"ca,omitempty"`
	} `json:"spec"`
}

type certificateRequestPolicy struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		Selector struct {
			IssuerRef *issuerRef `json:"issuerRef,omitempty"`
			Namespace *struct {
				MatchNames []string `json:"matchNames,omitempty"`
			} `json:"namespace,omitempty"`
		} `json:"selector"`
		Allowed struct {
			DNSNames *allowedStrings `json:"dnsNames,omitempty"`
			URIs     *allowedStrings `json:"uris,omitempty"`
			Usages   []string        `json:"usages,omitempty"`
		} `json:"allowed"`
		Constraints struct {
			MaxDuration string `json:"maxDuration,omitempty"`
			PrivateKey  *struct {
				Algorithm string `json:"algorithm,omitempty"`
			} `json:"privateKey,omitempty"`
		} `json:"constraints"`
	} `json:"spec"`
}

type allowedStrings struct {
	Required    *bool    `json:"required,omitempty"`
	Values      []string `json:"values,omitempty"`
	Validations []struct {
		Rule    string `json:"rule"`
		Message string `json:"message,omitempty"`
	} `json:"validations,omitempty"`
}

// Names the overlays and deploy/cluster/ share.
const (
	servingIssuer = "paymentsd-serving"
	peopleIssuer  = "payments-people"
	tlsMount      = "/var/run/secrets/paymentsd-tls/"
)

// checkServingCertificate: paymentsd serves mTLS with a certificate that
// cert-manager issues (the Certificate rendered here) into the Secret the
// TLS variables read, for the names of every Service of the overlay, from
// the serving issuer, for server auth only and naming no URI (so it can
// never be a caller's identity).
func checkServingCertificate(t *testing.T, r *rendered, env string) {
	d := one[deployment](t, r, "Deployment", "apps/v1")
	certs := typed[certificate](t, r, "Certificate")
	if len(certs) != 1 {
		t.Fatalf("rendered %d Certificates, want 1 (paymentsd's serving certificate)", len(certs))
	}
	c := certs[0]
	for _, v := range []string{"PAYMENTS_TLS_CERT_FILE", "PAYMENTS_TLS_KEY_FILE"} {
		checkFileFromSecret(t, d, v, c.Spec.SecretName)
	}
	for v, file := range map[string]string{"PAYMENTS_TLS_CERT_FILE": "tls.crt", "PAYMENTS_TLS_KEY_FILE": "tls.key"} {
		if got, _ := envValue(paymentsd(t, d), v); got != tlsMount+file {
			t.Errorf("%s = %q, want %s%s (the key cert-manager writes)", v, got, tlsMount, file)
		}
	}
	for _, svc := range typed[corev1.Service](t, r, "Service") {
		name := svc.Name + "." + namespace(env) + ".svc"
		if !slices.Contains(c.Spec.DNSNames, name) {
			t.Errorf("Certificate %s dnsNames %v lack %s: callers dialling the Service would refuse paymentsd's certificate", c.Name, c.Spec.DNSNames, name)
		}
	}
	for _, n := range c.Spec.DNSNames {
		if !strings.HasPrefix(n, "paymentsd") || !(strings.HasSuffix(n, "."+namespace(env)+".svc") || strings.HasSuffix(n, "."+namespace(env)+".svc.cluster.local")) {
			t.Errorf("Certificate dnsName %s: the policy paymentsd-serving approves only paymentsd's Services of %s", n, namespace(env))
		}
	}
	if len(c.Spec.URIs) > 0 || slices.Contains(c.Spec.Usages, "client auth") || !slices.Contains(c.Spec.Usages, "server auth") {
		t.Errorf("Certificate uris %v, usages %v; want no URI and server auth only", c.Spec.URIs, c.Spec.Usages)
	}
	if c.Spec.IssuerRef != (issuerRef{Name: servingIssuer, Kind: "ClusterIssuer", Group: "cert-manager.io"}) {
		t.Errorf("Certificate issuerRef = %+v, want ClusterIssuer %s", c.Spec.IssuerRef, servingIssuer)
	}
	if c.Spec.PrivateKey == nil || c.Spec.PrivateKey.RotationPolicy != "Always" {
		t.Errorf("Certificate privateKey = %+v, want rotationPolicy Always (a new key at each renewal)", c.Spec.PrivateKey)
	}
}

// checkCallerIdentities: the allowlist, the admins and the event readers
// are all set, from the ConfigMap, as identities paymentsd accepts: the
// callers and readers are workloads' SPIFFE IDs (ns/NAMESPACE/sa/NAME, as
// csi-driver-spiffe issues them), each of whose namespace a NetworkPolicy
// admits; the admins are people's (people/NAME, as payments-people
// issues them); all in one trust domain.
func checkCallerIdentities(t *testing.T, r *rendered, env string) {
	d := typed[appsv1.Deployment](t, r, "Deployment")[0]
	c := d.Spec.Template.Spec.Containers[slices.IndexFunc(d.Spec.Template.Spec.Containers, func(c corev1.Container) bool { return c.Name == containerName })]
	admitted := map[string]bool{}
	for _, np := range typed[networkingv1.NetworkPolicy](t, r, "NetworkPolicy") {
		for _, rule := range np.Spec.Ingress {
			for _, p := range rule.From {
				if p.NamespaceSelector != nil {
					admitted[p.NamespaceSelector.MatchLabels["kubernetes.io/metadata.name"]] = true
				}
			}
		}
	}
	trustDomains := map[string]bool{}
	for variable, key := range map[string]string{"PAYMENTS_ALLOWED_CALLERS": "allowed-callers", "PAYMENTS_ADMIN_CALLERS": "admin-callers", "PAYMENTS_EVENT_READERS": "event-readers"} {
		i := slices.IndexFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == variable })
		if i < 0 || c.Env[i].ValueFrom == nil || c.Env[i].ValueFrom.ConfigMapKeyRef == nil || c.Env[i].ValueFrom.ConfigMapKeyRef.Key != key {
			t.Errorf("%s is not read from the ConfigMap's key %s", variable, key)
			continue
		}
		ref := c.Env[i].ValueFrom.ConfigMapKeyRef
		var value string
		for _, cm := range typed[corev1.ConfigMap](t, r, "ConfigMap") {
			if cm.Name == ref.Name {
				value = cm.Data[ref.Key]
			}
		}
		if value == "" {
			t.Errorf("%s (%s) is empty: deploy/ turns caller identity on", variable, key)
		}
		for _, entry := range strings.Split(value, ",") {
			id, err := paymentssvc.ParseIdentity(entry)
			if err != nil {
				t.Errorf("%s: %q is no identity paymentsd accepts: %v", variable, entry, err)
				continue
			}
			rest, ok := strings.CutPrefix(id.String(), "spiffe://")
			td, path, _ := strings.Cut(rest, "/")
			if !ok {
				t.Errorf("%s: %s is not a SPIFFE ID", variable, id)
				continue
			}
			trustDomains[td] = true
			parts := strings.Split(path, "/")
			switch {
			case variable == "PAYMENTS_ADMIN_CALLERS":
				// A person on call in this environment: the policy
				// payments-people issues it only for a request in this
				// namespace, so no certificate of the other
				// environment's is an admin here.
				if len(parts) != 4 || parts[0] != "ns" || parts[1] != namespace(env) || parts[2] != "people" {
					t.Errorf("%s: %s is not a person's SPIFFE ID in %s (spiffe://%s/ns/%s/people/NAME)", variable, id, namespace(env), td, namespace(env))
				}
			case len(parts) != 4 || parts[0] != "ns" || parts[2] != "sa":
				t.Errorf("%s: %s is not a workload's SPIFFE ID (spiffe://%s/ns/NAMESPACE/sa/NAME)", variable, id, td)
			case !admitted[parts[1]]:
				t.Errorf("%s: %s is in namespace %s, which no NetworkPolicy admits", variable, id, parts[1])
			case strings.HasSuffix(parts[1], "-"+otherEnv(env)):
				t.Errorf("%s: %s is the other environment's", variable, id)
			}
		}
	}
	if len(trustDomains) != 1 {
		t.Errorf("identities in trust domains %v, want one", trustDomains)
	}
}

func otherEnv(env string) string {
	if env == "live" {
		return "sandbox"
	}
	return "live"
}

// checkOnCallRBAC: the on-call people may request certificates from
// payments-people and port-forward, in this namespace only, and nothing
// that would give them paymentsd's key or its database (Secrets, exec);
// cert-manager's controller may use the serving policy here.
func checkOnCallRBAC(t *testing.T, r *rendered, _ string) {
	roles := map[string]*rbacv1.Role{}
	for _, role := range typed[rbacv1.Role](t, r, "Role") {
		roles[role.Name] = role
		for _, rule := range role.Rules {
			for _, res := range rule.Resources {
				if res == "secrets" || res == "pods/exec" || res == "pods/attach" || res == "*" || slices.Contains(rule.Verbs, "*") {
					t.Errorf("Role %s grants %v on %s", role.Name, rule.Verbs, res)
				}
			}
		}
	}
	uses := func(role *rbacv1.Role, policy string) bool {
		return role != nil && slices.ContainsFunc(role.Rules, func(rule rbacv1.PolicyRule) bool {
			return slices.Contains(rule.Resources, "certificaterequestpolicies") && slices.Contains(rule.Verbs, "use") && slices.Equal(rule.ResourceNames, []string{policy})
		})
	}
	bound := map[string][]rbacv1.Subject{}
	for _, b := range typed[rbacv1.RoleBinding](t, r, "RoleBinding") {
		if b.RoleRef.Kind != "Role" {
			t.Errorf("RoleBinding %s binds %s %s; want a Role of this namespace", b.Name, b.RoleRef.Kind, b.RoleRef.Name)
		}
		bound[b.RoleRef.Name] = append(bound[b.RoleRef.Name], b.Subjects...)
	}
	oncall, serving := roles["paymentsd-oncall"], roles["paymentsd-serving-certificate"]
	if !uses(oncall, "payments-people") || !uses(serving, "paymentsd-serving") {
		t.Errorf("Roles %v: want paymentsd-oncall to use payments-people and paymentsd-serving-certificate to use paymentsd-serving", roles)
	}
	if s := bound["paymentsd-oncall"]; len(s) != 1 || s[0].Kind != "Group" {
		t.Errorf("paymentsd-oncall is bound to %+v, want the on-call group alone", s)
	}
	if s := bound["paymentsd-serving-certificate"]; len(s) != 1 || s[0].Kind != "ServiceAccount" || s[0].Name != "cert-manager" {
		t.Errorf("paymentsd-serving-certificate is bound to %+v, want cert-manager's controller alone", s)
	}
}

// TestClusterObjects: deploy/cluster/ renders the issuers the overlays'
// Certificates and the on-call template name, and a policy for each that
// approves only what paymentsd accepts: the serving certificate without a
// URI, and a person's certificate naming the requester and nobody else,
// for a few hours, for client auth.
func TestClusterObjects(t *testing.T) {
	t.Parallel()
	r := render(t, "cluster")
	checkStrictTypes(t, r, "")
	issuers := map[string]bool{}
	for _, ci := range typed[clusterIssuer](t, r, "ClusterIssuer") {
		if ci.Spec.CA == nil || ci.Spec.CA.SecretName == "" {
			t.Errorf("ClusterIssuer %s is not a CA issuer", ci.Name)
		}
		issuers[ci.Name] = true
	}
	policies := map[string]*certificateRequestPolicy{}
	for _, p := range typed[certificateRequestPolicy](t, r, "CertificateRequestPolicy") {
		if p.Spec.Selector.IssuerRef == nil || !issuers[p.Spec.Selector.IssuerRef.Name] {
			t.Errorf("CertificateRequestPolicy %s selects %+v, not an issuer of deploy/cluster", p.Name, p.Spec.Selector.IssuerRef)
			continue
		}
		policies[p.Spec.Selector.IssuerRef.Name] = p
		if ns := p.Spec.Selector.Namespace; ns == nil || !slices.Equal(ns.MatchNames, []string{namespace("sandbox"), namespace("live")}) {
			t.Errorf("CertificateRequestPolicy %s applies in %+v, want paymentsd's namespaces only", p.Name, ns)
		}
	}
	serving, people := policies[servingIssuer], policies[peopleIssuer]
	if serving == nil || people == nil {
		t.Fatalf("policies by issuer = %v, want one for %s and one for %s", policies, servingIssuer, peopleIssuer)
	}
	if serving.Spec.Allowed.URIs != nil || slices.Contains(serving.Spec.Allowed.Usages, "client auth") {
		t.Errorf("%s allows URIs %+v, usages %v: a serving certificate must never be a caller's identity", serving.Name, serving.Spec.Allowed.URIs, serving.Spec.Allowed.Usages)
	}
	if dn := serving.Spec.Allowed.DNSNames; dn == nil || len(dn.Values) > 0 || len(dn.Validations) != 1 || !strings.Contains(dn.Validations[0].Rule, "cr.namespace") {
		t.Errorf("%s dnsNames = %+v, want one rule tying the names to the request's namespace", serving.Name, dn)
	}
	u := people.Spec.Allowed.URIs
	if u == nil || u.Required == nil || !*u.Required || len(u.Values) > 0 || len(u.Validations) != 1 {
		t.Errorf("%s uris = %+v, want required, and one rule: the SPIFFE ID of the requester's user name", people.Name, u)
	} else {
		checkPeopleRule(t, u.Validations[0].Rule, people.Spec.Selector.Namespace.MatchNames)
	}
	if people.Spec.Allowed.DNSNames != nil || !slices.Equal(people.Spec.Allowed.Usages, []string{"digital signature", "client auth"}) {
		t.Errorf("%s allows dnsNames %+v, usages %v; want no DNS name, client auth", people.Name, people.Spec.Allowed.DNSNames, people.Spec.Allowed.Usages)
	}
	if d, err := time.ParseDuration(people.Spec.Constraints.MaxDuration); err != nil || d > 12*time.Hour {
		t.Errorf("%s maxDuration = %q, want a few hours at most", people.Name, people.Spec.Constraints.MaxDuration)
	}

	// The overlays' Certificates and the on-call template name these
	// issuers; the template asks for what the policy allows.
	for _, env := range environments {
		for _, c := range typed[certificate](t, render(t, "overlays/"+env), "Certificate") {
			if !issuers[c.Spec.IssuerRef.Name] {
				t.Errorf("%s Certificate %s names issuer %s, which deploy/cluster does not render", env, c.Name, c.Spec.IssuerRef.Name)
			}
		}
	}
	tmpl := exampleObject[certificate](t, "examples/oncall-certificate.yaml", "Certificate")
	if tmpl.Spec.IssuerRef != (issuerRef{Name: peopleIssuer, Kind: "ClusterIssuer", Group: "cert-manager.io"}) {
		t.Errorf("examples/oncall-certificate.yaml issuerRef = %+v, want %s", tmpl.Spec.IssuerRef, peopleIssuer)
	}
	want, _ := time.ParseDuration(people.Spec.Constraints.MaxDuration)
	if d, err := time.ParseDuration(tmpl.Spec.Duration); err != nil || d > want {
		t.Errorf("examples/oncall-certificate.yaml duration = %q, want at most the policy's %v", tmpl.Spec.Duration, want)
	}
	if len(tmpl.Spec.URIs) != 1 || len(tmpl.Spec.DNSNames) > 0 || !slices.Equal(tmpl.Spec.Usages, people.Spec.Allowed.Usages) {
		t.Errorf("examples/oncall-certificate.yaml uris %v, dnsNames %v, usages %v; want one URI, no DNS name, %v", tmpl.Spec.URIs, tmpl.Spec.DNSNames, tmpl.Spec.Usages, people.Spec.Allowed.Usages)
	} else if want, _ := paymentssvc.PersonID(trustDomain, tmpl.Namespace, "alice"); tmpl.Spec.URIs[0] != want.String() {
		t.Errorf("examples/oncall-certificate.yaml URI %s, want alice's identity in its namespace, %s", tmpl.Spec.URIs[0], want)
	}
}

// TestCallerExample: the example caller gets its identity from nothing but
// its ServiceAccount and a csi-driver-spiffe volume, whose files its
// settings read, and live admits that identity.
func TestCallerExample(t *testing.T) {
	t.Parallel()
	d := exampleObject[appsv1.Deployment](t, "examples/caller.yaml", "Deployment")
	spec := d.Spec.Template.Spec
	if len(spec.Volumes) != 1 || spec.Volumes[0].CSI == nil || spec.Volumes[0].CSI.Driver != "spiffe.csi.cert-manager.io" ||
		spec.Volumes[0].CSI.ReadOnly == nil || !*spec.Volumes[0].CSI.ReadOnly {
		t.Fatalf("volumes = %+v, want one read-only csi-driver-spiffe volume", spec.Volumes)
	}
	if g := spec.Volumes[0].CSI.VolumeAttributes["spiffe.csi.cert-manager.io/fs-group"]; spec.SecurityContext == nil || spec.SecurityContext.RunAsGroup == nil || g != fmt.Sprint(*spec.SecurityContext.RunAsGroup) {
		t.Errorf("fs-group %q, want the pod's group, so it can read the 0440 files", g)
	}
	c := spec.Containers[0]
	mount := c.VolumeMounts[0].MountPath
	for _, e := range c.Env {
		if strings.HasSuffix(e.Name, "_FILE") && !strings.HasPrefix(e.Value, mount+"/") {
			t.Errorf("%s = %s, not in the SVID volume %s", e.Name, e.Value, mount)
		}
	}
	id := fmt.Sprintf("spiffe://corp.example/ns/%s/sa/%s", d.Namespace, spec.ServiceAccountName)
	r := render(t, "overlays/live")
	for _, cm := range typed[corev1.ConfigMap](t, r, "ConfigMap") {
		if strings.HasPrefix(cm.Name, "paymentsd-callers-") && !slices.Contains(strings.Split(cm.Data["allowed-callers"], ","), id) {
			t.Errorf("live's allowed-callers %q lack the example caller %s", cm.Data["allowed-callers"], id)
		}
	}
	role := exampleObject[rbacv1.Role](t, "examples/caller.yaml", "Role")
	if len(role.Rules) != 1 || !slices.Equal(role.Rules[0].Resources, []string{"certificaterequests"}) || !slices.Equal(role.Rules[0].Verbs, []string{"create"}) {
		t.Errorf("the caller's Role = %+v; csi-driver-spiffe needs create on certificaterequests, and nothing more", role.Rules)
	}
}

// exampleObject decodes the one object of kind in the example file,
// strictly into T.
func exampleObject[T any](t *testing.T, file, kind string) *T {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	for _, doc := range strings.Split(string(b), "\n---\n") {
		var h struct {
			Kind string `json:"kind"`
		}
		if err := k8syaml.Unmarshal([]byte(doc), &h); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		if h.Kind != kind {
			continue
		}
		v := new(T)
		if err := k8syaml.UnmarshalStrict([]byte(doc), v); err != nil {
			t.Fatalf("%s: %s does not decode strictly into %T: %v", file, kind, v, err)
		}
		return v
	}
	t.Fatalf("%s has no %s", file, kind)
	return nil
}

// trustDomain is the SPIFFE trust domain the manifests name (FILL IN in
// each overlay).
const trustDomain = "corp.example"

// checkPeopleRule evaluates the payments-people policy's rule as
// approver-policy does (CEL with its strings extension; self the request's
// URI, cr its namespace and the requester's user name, which the API
// server sets) for user names with @, :, upper case and every other
// printable character, in each namespace the policy applies in: it
// approves exactly the identity service.PersonID builds for the user name
// and namespace, the one PAYMENTS_ADMIN_CALLERS is written with, and
// nothing else: not the user name unescaped, not another case of it, not
// the other environment's namespace. A user name with no identity gets
// nothing.
func checkPeopleRule(t *testing.T, rule string, namespaces []string) {
	t.Helper()
	env, err := cel.NewEnv(cel.Variable("self", cel.StringType), cel.Variable("cr", cel.MapType(cel.StringType, cel.StringType)), ext.Strings())
	if err != nil {
		t.Fatal(err)
	}
	ast, iss := env.Compile(rule)
	if iss.Err() != nil {
		t.Fatalf("payments-people rule does not compile: %v", iss.Err())
	}
	prg, err := env.Program(ast)
	if err != nil {
		t.Fatal(err)
	}
	approves := func(self, ns, user string) bool {
		out, _, err := prg.Eval(map[string]any{"self": self, "cr": map[string]string{"name": "oncall-x", "namespace": ns, "username": user}})
		return err == nil && out.Value() == true
	}
	var printable strings.Builder
	for c := byte(0x20); c <= 0x7e; c++ {
		printable.WriteByte(c)
	}
	users := []string{"alice", "Alice", "ALICE", "alice@corp.example", "Alice.Smith@Corp.Example", "oidc:alice", "oidc:Alice@corp.example",
		"system:serviceaccount:ops:tool", "a_b", "a_5fb", "https://idp.example#42", "Jo Bloggs+oncall", printable.String(),
		"", ".", "..", "José", "tab\there"}
	for _, ns := range namespaces {
		for _, user := range users {
			id, err := paymentssvc.PersonID(trustDomain, ns, user)
			naive := "spiffe://" + trustDomain + "/people/" + user
			nsNaive := "spiffe://" + trustDomain + "/ns/" + ns + "/people/" + user
			if err != nil {
				for _, self := range []string{naive, nsNaive} {
					if approves(self, ns, user) {
						t.Errorf("payments-people approves %q for user %q in %s, which has no identity paymentsd accepts", self, user, ns)
					}
				}
				continue
			}
			if !approves(id.String(), ns, user) {
				t.Errorf("payments-people refuses %s for user %q in %s: the person can't get a certificate", id, user, ns)
			}
			if _, err := paymentssvc.ParseIdentity(id.String()); err != nil {
				t.Errorf("%s (user %q) can't be written in PAYMENTS_ADMIN_CALLERS: %v", id, user, err)
			}
			wrong := []string{naive, strings.ToUpper(id.String()[len("spiffe://"):])}
			if nsNaive != id.String() {
				wrong = append(wrong, nsNaive)
			}
			for _, other := range namespaces {
				if other != ns {
					otherID, _ := paymentssvc.PersonID(trustDomain, other, user)
					wrong = append(wrong, otherID.String())
				}
			}
			for _, self := range wrong {
				if approves(self, ns, user) {
					t.Errorf("payments-people approves %q for user %q in %s; only %s", self, user, ns, id)
				}
			}
		}
	}
}

// checkClientCAFromTrustBundle: paymentsd verifies callers by the trust
// bundle (deploy/cluster's Bundle), not by its serving Secret's ca.crt,
// which holds only the CA that issued paymentsd's own certificate and so
// can't hold an old and a new CA at once: PAYMENTS_TLS_CLIENT_CA_FILE is
// the key trust-manager writes, in a whole ConfigMap volume of the
// Bundle's ConfigMap, which trust-manager writes into this overlay's
// namespace (its labels match the Bundle's selector). The Bundle trusts
// every issuer's CA, and never the public CAs (useDefaultCAs), which would
// let anyone with a public certificate in.
func checkClientCAFromTrustBundle(t *testing.T, r *rendered, env string) {
	bundles := typed[bundle](t, render(t, "cluster"), "Bundle")
	if len(bundles) != 1 {
		t.Fatalf("deploy/cluster renders %d Bundles, want 1 (the trust bundle)", len(bundles))
	}
	b := bundles[0]
	if b.Spec.Target.ConfigMap == nil || b.Spec.Target.ConfigMap.Key == "" || b.Spec.Target.NamespaceSelector == nil || len(b.Spec.Target.NamespaceSelector.MatchLabels) == 0 {
		t.Fatalf("Bundle %s target = %+v, want a ConfigMap key in the namespaces a label selects", b.Name, b.Spec.Target)
	}
	d := typed[appsv1.Deployment](t, r, "Deployment")[0]
	c := d.Spec.Template.Spec.Containers[slices.IndexFunc(d.Spec.Template.Spec.Containers, func(c corev1.Container) bool { return c.Name == containerName })]
	file := ""
	for _, e := range c.Env {
		if e.Name == "PAYMENTS_TLS_CLIENT_CA_FILE" {
			file = e.Value
		}
	}
	found := false
	for _, m := range c.VolumeMounts {
		rel, inside := strings.CutPrefix(file, strings.TrimSuffix(m.MountPath, "/")+"/")
		if !inside {
			continue
		}
		found = true
		i := slices.IndexFunc(d.Spec.Template.Spec.Volumes, func(v corev1.Volume) bool { return v.Name == m.Name })
		if i < 0 || m.SubPath != "" || !m.ReadOnly {
			t.Fatalf("PAYMENTS_TLS_CLIENT_CA_FILE %s: mount %+v, want a whole, read-only volume", file, m)
		}
		cm := d.Spec.Template.Spec.Volumes[i].ConfigMap
		if cm == nil || cm.Name != b.Name || !slices.Contains(cm.Items, corev1.KeyToPath{Key: b.Spec.Target.ConfigMap.Key, Path: rel}) {
			t.Errorf("PAYMENTS_TLS_CLIENT_CA_FILE %s is in volume %+v, want the ConfigMap %s's key %s (the trust bundle)", file, d.Spec.Template.Spec.Volumes[i], b.Name, b.Spec.Target.ConfigMap.Key)
		}
		if cm != nil && cm.Optional != nil && *cm.Optional {
			t.Errorf("the trust bundle's volume is optional: without it paymentsd would start trusting nobody")
		}
	}
	if !found {
		t.Errorf("PAYMENTS_TLS_CLIENT_CA_FILE = %q is under no volumeMount", file)
	}
	ns := typed[corev1.Namespace](t, r, "Namespace")
	if len(ns) != 1 || !selects(labelSelector{MatchLabels: b.Spec.Target.NamespaceSelector.MatchLabels}, ns[0].Labels) {
		t.Errorf("namespace %s labels %v: trust-manager writes the Bundle only where %v", namespace(env), ns[0].Labels, b.Spec.Target.NamespaceSelector.MatchLabels)
	}
	sources := map[string]bool{}
	for _, src := range b.Spec.Sources {
		if src.UseDefaultCAs != nil && *src.UseDefaultCAs {
			t.Errorf("Bundle %s trusts the public CAs (useDefaultCAs): any public certificate would reach paymentsd", b.Name)
		}
		if src.Secret != nil {
			sources[src.Secret.Name] = true
		}
	}
	for _, ci := range typed[clusterIssuer](t, render(t, "cluster"), "ClusterIssuer") {
		if ci.Spec.CA != nil && !sources[ci.Spec.CA.SecretName] {
			t.Errorf("Bundle %s does not trust the CA of ClusterIssuer %s (Secret %s): what it signs would be refused", b.Name, ci.Name, ci.Spec.CA.SecretName)
		}
	}
}
