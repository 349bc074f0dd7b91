package main

import (
	"encoding/json"
	"net/http"
	"os/exec"
	"strings"
	"testing"

	"example.com/paymentsd/upstream/upstreamtest"
)

// TestBuildVersion builds paymentsd as the Dockerfile does, with no VCS
// information to stamp and the version and revision given to the linker,
// and checks that the binary carries them: --version prints them, the
// provider sees User-Agent: paymentsd/<version>, and the served OpenAPI
// document's info.version is the version.
func TestBuildVersion(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	t.Parallel()
	const ver, rev = "v9.8.7-test", "0123456789abcdef0123456789abcdef01234567"
	bin, err := buildBinary("paymentsd-versioned", "-trimpath", "-buildvcs=false",
		"-ldflags", "-s -w -X main.buildVersion="+ver+" -X main.buildRevision="+rev)
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

func userAgent(reqs []upstreamtest.Request) string {
	if len(reqs) == 0 {
		return ""
	}
	return reqs[0].Header.Get("User-Agent")
}
