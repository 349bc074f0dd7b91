package main

import (
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"

	"example.com/paymentsd/internal/simulator"
)

// TestBuildVersion builds paymentsd with the Dockerfile's own -ldflags,
// its build arguments filled in, and no VCS information to stamp (as in
// the image, whose context has no .git), and checks that the binary
// carries the version and revision: --version prints them, the provider
// sees User-Agent: paymentsd/<version>, and the served OpenAPI document's
// info.version is the version.
func TestBuildVersion(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	t.Parallel()
	const ver, rev = "v9.8.7-test", "0123456789abcdef0123456789abcdef01234567"
	ldflags := strings.NewReplacer("${VERSION}", ver, "${REVISION}", rev).Replace(dockerfileLDFlags(t))
	bin, err := buildBinary("paymentsd-versioned", "-trimpath", "-buildvcs=false", "-ldflags", ldflags)
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(bin, "--version").Output()
	if err != nil {
		t.Fatalf("paymentsd --version: %v", err)
	}
	if want := "paymentsd " + ver + " (revision " + rev + ") go"; !strings.HasPrefix(string(out), want) {
		t.Errorf("paymentsd --version = %q, want it to start %q", out, want)
	}

	p := fakeProvider(t, "sandbox")
	proc := startBinary(t, bin, sandboxEnv(p))
	r := postREST(t, http.DefaultClient, "http://"+proc.httpAddr, validBody("k-version"), nil)
	if r.status != http.StatusOK {
		t.Fatalf("POST = %d %s, want 200", r.status, r.raw)
	}
	reqs := p.Requests()
	if len(reqs) != 1 || reqs[0].Header.Get("User-Agent") != "paymentsd/"+ver {
		t.Errorf("the provider saw %d requests, User-Agent %q; want 1, %q", len(reqs), userAgent(reqs), "paymentsd/"+ver)
	}

	resp, err := http.Get("http://" + proc.httpAddr + "/openapi.json")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var doc struct{ Info struct{ Version string } }
	if err := json.NewDecoder(resp.Body).Decode(&doc); err != nil {
		t.Fatal(err)
	}
	if doc.Info.Version != ver {
		t.Errorf("GET /openapi.json info.version = %q, want %q", doc.Info.Version, ver)
	}
}

func userAgent(reqs []simulator.Request) string {
	if len(reqs) == 0 {
		return ""
	}
	return reqs[0].Header.Get("User-Agent")
}

// dockerfileLDFlags is the -ldflags of the Dockerfile's go build.
func dockerfileLDFlags(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("../../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^RUN .*go build .*-ldflags="([^"]*)"`).FindSubmatch(b)
	if m == nil {
		t.Fatal("the Dockerfile has no RUN … go build … -ldflags=\"…\"")
	}
	return string(m[1])
}

// TestDockerfile checks the Dockerfile as far as it can be without a
// Docker engine: every base image is pinned by digest, and the version and
// revision, build arguments, reach the linker and the image's labels.
func TestDockerfile(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("../../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	from := regexp.MustCompile(`(?m)^FROM\s+(\S+)`).FindAllSubmatch(b, -1)
	if len(from) == 0 {
		t.Fatal("the Dockerfile has no FROM")
	}
	pinned := regexp.MustCompile(`^[a-z0-9./-]+:[\w.-]+@sha256:[0-9a-f]{64}$`)
	for _, f := range from {
		if !pinned.Match(f[1]) {
			t.Errorf("FROM %s: want a tag and a digest, image:tag@sha256:<64 hex digits>", f[1])
		}
	}
	ldflags := dockerfileLDFlags(t)
	for _, want := range []string{"-X main.buildVersion=${VERSION}", "-X main.buildRevision=${REVISION}"} {
		if !strings.Contains(ldflags, want) {
			t.Errorf("the Dockerfile's -ldflags %q lack %s", ldflags, want)
		}
	}
	for _, want := range []string{"org.opencontainers.image.version=${VERSION}", "org.opencontainers.image.revision=${REVISION}"} {
		if !strings.Contains(string(b), want) {
			t.Errorf("the Dockerfile has no label %s", want)
		}
	}
	if n := len(regexp.MustCompile(`(?m)^ARG VERSION$`).FindAll(b, -1)); n != 2 {
		t.Errorf("the Dockerfile declares ARG VERSION %d times, want 2: once in each stage that uses it", n)
	}
}
