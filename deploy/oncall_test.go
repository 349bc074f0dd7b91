package deploy_test

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
)

// onCallCommands returns the kubectl and cmctl commands of
// docs/identity.md "On call", in the order the page gives them: each line
// of its fenced blocks, and each command in `code` in its prose (such as
// the one that says why a request was denied).
func onCallCommands(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile("../docs/identity.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	i := strings.Index(doc, "\n## On call\n")
	if i < 0 {
		t.Fatal(`docs/identity.md has no "## On call" section`)
	}
	doc = doc[i+1:]
	if j := strings.Index(doc[3:], "\n## "); j >= 0 {
		doc = doc[:j+3]
	}
	var cmds []string
	add := func(s string) {
		s = strings.TrimSpace(s)
		if strings.HasPrefix(s, "kubectl ") || strings.HasPrefix(s, "cmctl ") {
			cmds = append(cmds, s)
		}
	}
	fenced := false
	var para strings.Builder
	flush := func() {
		// Inline code may wrap across lines within a paragraph.
		for _, m := range regexp.MustCompile("`([^`]+)`").FindAllStringSubmatch(strings.Join(strings.Fields(para.String()), " "), -1) {
			add(m[1])
		}
		para.Reset()
	}
	for line := range strings.Lines(doc) {
		switch {
		case strings.HasPrefix(strings.TrimSpace(line), "```"):
			flush()
			fenced = !fenced
		case fenced:
			add(line)
		case strings.TrimSpace(line) == "":
			flush()
		default:
			para.WriteString(line)
		}
	}
	flush()
	if len(cmds) == 0 {
		t.Fatal(`docs/identity.md "On call" has no kubectl or cmctl command`)
	}
	return cmds
}

// apiAccess is one request a command makes of the API server: of one
// object named name, or of any.
type apiAccess struct {
	verb, group, resource, name string
}

// onCallStep is what one command of the runbook does, as far as the API
// server and the CertificateRequests in the namespace are concerned.
type onCallStep struct {
	command   string
	namespace string
	access    []apiAccess
	// request is the CertificateRequest it creates, reads or deletes, if
	// any: create fails if it exists (AlreadyExists), the others if it
	// doesn't (NotFound), unless ignoreMissing.
	request       string
	op            string // create, read or delete
	ignoreMissing bool
}

var certificateRequests = apiAccess{group: "cert-manager.io", resource: "certificaterequests"}

// parseOnCallStep reads cmd as kubectl or cmctl would; ok is false for a
// command that asks nothing of the namespace (kubectl auth whoami).
func parseOnCallStep(t *testing.T, cmd string) (step onCallStep, ok bool) {
	t.Helper()
	line, _, _ := strings.Cut(cmd, "|")   // what it pipes to runs on the laptop
	line, _, _ = strings.Cut(line, " > ") // and so does where it writes
	step.command = cmd
	var args []string
	words := strings.Fields(line)
	for i := 1; i < len(words); i++ {
		switch w := words[i]; {
		case w == "-n" || w == "--namespace":
			i++
			step.namespace = words[i]
		case w == "--ignore-not-found" || w == "--ignore-not-found=true":
			step.ignoreMissing = true
		case w == "-o" || w == "--output" || w == "--from-certificate-file" || w == "--output-key-file" || w == "--output-certificate-file" || w == "--timeout":
			i++
		case strings.HasPrefix(w, "-"):
		default:
			args = append(args, w)
		}
	}
	with := func(a apiAccess, verb string) apiAccess { a.verb = verb; return a }
	switch {
	case words[0] == "cmctl" && len(args) == 3 && args[0] == "create" && (args[1] == "certificaterequest" || args[1] == "cr"):
		// It creates the request, then reads it until it is signed.
		step.access = []apiAccess{with(certificateRequests, "create"), with(certificateRequests, "get")}
		step.request, step.op = args[2], "create"
	case words[0] == "kubectl" && len(args) == 3 && slices.Contains([]string{"get", "describe", "delete"}, args[0]) && args[1] == "certificaterequest":
		verb, op := "get", "read"
		if args[0] == "delete" {
			verb, op = "delete", "delete"
		}
		step.access = []apiAccess{with(certificateRequests, verb)}
		step.request, step.op = args[2], op
	case words[0] == "kubectl" && len(args) >= 2 && args[0] == "port-forward" && strings.HasPrefix(args[1], "service/"):
		// kubectl reads the Service, picks one of its pods, and opens the
		// stream to it.
		step.access = []apiAccess{{"get", "", "services", ""}, {"list", "", "pods", ""}, {"get", "", "pods", ""}, {"create", "", "pods/portforward", ""}}
	case words[0] == "kubectl" && len(args) == 3 && args[0] == "get" && (args[1] == "configmap" || args[1] == "cm"):
		step.access = []apiAccess{{"get", "", "configmaps", args[2]}}
	case words[0] == "kubectl" && len(args) >= 2 && args[0] == "auth" && args[1] == "whoami":
		return step, false
	default:
		t.Fatalf("docs/identity.md On call: %q is a command the test does not know; teach it what the command asks of the API server", cmd)
	}
	return step, true
}

// allows reports whether role lets its subjects make a.
func allows(role *rbacv1.Role, a apiAccess) bool {
	return slices.ContainsFunc(role.Rules, func(r rbacv1.PolicyRule) bool {
		return slices.Contains(r.APIGroups, a.group) && slices.Contains(r.Resources, a.resource) &&
			slices.Contains(r.Verbs, a.verb) && (len(r.ResourceNames) == 0 || a.name != "" && slices.Contains(r.ResourceNames, a.name))
	})
}

// TestOnCallRunbookRunsEveryShift: every kubectl and cmctl command of the
// on-call procedure in docs/identity.md is one the on-call group's Role,
// as each overlay renders it, lets them run, in that overlay's namespace;
// and the procedure can be followed shift after shift by the same person:
// the CertificateRequest it names is gone before it is created again (a
// name can be created once: cmctl would stop with AlreadyExists, and step
// 1 would never give the next shift a certificate).
func TestOnCallRunbookRunsEveryShift(t *testing.T) {
	t.Parallel()
	cmds := onCallCommands(t)
	for _, env := range environments {
		t.Run(env, func(t *testing.T) {
			t.Parallel()
			var role *rbacv1.Role
			for _, r := range typed[rbacv1.Role](t, render(t, "overlays/"+env), "Role") {
				if r.Name == "paymentsd-oncall" {
					role = r
				}
			}
			if role == nil {
				t.Fatal("no Role paymentsd-oncall")
			}
			var steps []onCallStep
			for _, cmd := range cmds {
				// The page is written for live, and says to write
				// payments-sandbox for sandbox.
				step, ok := parseOnCallStep(t, strings.ReplaceAll(cmd, "payments-live", namespace(env)))
				if !ok {
					continue
				}
				if step.namespace != namespace(env) {
					t.Errorf("%q runs in namespace %q, want -n %s (the Role is that namespace's)", step.command, step.namespace, namespace(env))
				}
				for _, a := range step.access {
					if !allows(role, a) {
						t.Errorf("%q needs %s on %s (group %q), which the Role %s does not grant: the on-call person gets Forbidden", step.command, a.verb, a.resource, a.group, role.Name)
					}
				}
				steps = append(steps, step)
			}

			requests := map[string]bool{} // the CertificateRequests in the namespace
			for shift := 1; shift <= 3; shift++ {
				for _, s := range steps {
					if s.request == "" {
						continue
					}
					switch exists := requests[s.request]; {
					case s.op == "create" && exists:
						t.Fatalf("shift %d: %q: CertificateRequest %s already exists, from an earlier shift", shift, s.command, s.request)
					case s.op != "create" && !exists && !s.ignoreMissing:
						t.Fatalf("shift %d: %q: CertificateRequest %s does not exist", shift, s.command, s.request)
					}
					requests[s.request] = s.op != "delete"
				}
			}
		})
	}
}
