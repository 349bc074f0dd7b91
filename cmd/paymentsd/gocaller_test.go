package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestGoCallerModule follows README "Calling it from Go" in a module of its
// own (testdata/gocaller): with a replace directive, then with a go.work,
// the client package (paymentsclient, over the generated client) builds,
// and the caller links in neither the REST gateway nor protovalidate's
// runtime (CEL), nor anything else only the server needs.
func TestGoCallerModule(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the go command")
	}
	t.Parallel()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile("testdata/gocaller/main.go")
	if err != nil {
		t.Fatal(err)
	}
	newModule := func(t *testing.T) string {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "main.go"), src, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "go.mod"), []byte("module example.com/checkout\n\ngo 1.26.8\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	goCmd := func(t *testing.T, dir string, env []string, args ...string) string {
		t.Helper()
		cmd := exec.CommandContext(t.Context(), "go", args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), env...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	// Modules that only the server needs.
	serverOnly := []string{"github.com/grpc-ecosystem/grpc-gateway", "buf.build/go/protovalidate", "cel.dev/", "github.com/google/cel-go",
		"github.com/prometheus/", "go.opentelemetry.io/", "modernc.org/", "github.com/jackc/"}
	checkDeps := func(t *testing.T, dir string, env []string) {
		t.Helper()
		goCmd(t, dir, env, "build", "-o", os.DevNull, ".")
		seen := map[string]bool{}
		for _, m := range strings.Fields(goCmd(t, dir, env, "list", "-deps", "-f", "{{with .Module}}{{.Path}}{{end}}", ".")) {
			if seen[m] {
				continue
			}
			seen[m] = true
			for _, s := range serverOnly {
				if strings.HasPrefix(m, s) {
					t.Errorf("the caller links in %s, which only the server needs", m)
				}
			}
		}
	}

	t.Run("replace", func(t *testing.T) {
		t.Parallel()
		dir := newModule(t)
		env := []string{"GOWORK=off", "GOFLAGS=-mod=mod"}
		goCmd(t, dir, env, "mod", "edit", "-replace", "example.com/paymentsd="+root)
		goCmd(t, dir, env, "mod", "tidy")
		checkDeps(t, dir, env)
	})
	t.Run("go.work", func(t *testing.T) {
		t.Parallel()
		dir := newModule(t)
		env := []string{"GOWORK=", "GOFLAGS="}
		goCmd(t, dir, env, "work", "init", ".", root)
		checkDeps(t, dir, env)
	})
}
