// Package docs_test keeps the documentation true: its links resolve, each
// page's contents list its headings, the README maps every page, and
// every shell command block either runs against a paymentsd --simulate, in
// a shell that has only what its page set up, or says what it needs that a
// test cannot give it. docs/development.md
// ("Writing the docs", "Command blocks") is the convention it checks.
package docs_test

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unicode"

	"example.com/paymentsd/internal/testenv"
)

// root is the repository root, relative to this package.
const root = ".."

// page is a Markdown file of the documentation.
type page struct {
	path     string // relative to root, with slashes
	text     string
	headings []heading
	blocks   []block
	links    []link
	anchors  map[string]bool
}

type heading struct {
	level int
	text  string
	line  int
}

type block struct {
	lang  string
	attrs string // what follows the language in the info string
	body  string
	line  int
}

type link struct {
	target string
	line   int
}

// pages reads every page the docs' rules apply to.
func pages(t *testing.T) []*page {
	t.Helper()
	names := []string{"README.md", "CHANGELOG.md", "deploy/README.md"}
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range docs {
		names = append(names, "docs/"+filepath.Base(d))
	}
	var ps []*page
	for _, name := range names {
		b, err := os.ReadFile(filepath.Join(root, name))
		if err != nil {
			t.Fatal(err)
		}
		ps = append(ps, parse(name, string(b)))
	}
	return ps
}

var (
	fenceOpen  = regexp.MustCompile("^( {0,3})(`{3,}|~{3,})[ \t]*([^ \t`]*)[ \t]*(.*)$")
	atxHeading = regexp.MustCompile(`^ {0,3}(#{1,6})[ \t]+(.*?)[ \t#]*$`)
	inlineCode = regexp.MustCompile("`+[^`]*`+")
	mdLink     = regexp.MustCompile(`!?\[[^\]]*\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)
	htmlAnchor = regexp.MustCompile(`<a\s+(?:id|name)="([^"]+)"`)
	comment    = regexp.MustCompile(`(?s)<!--.*?-->`)
)

// parse finds a page's headings, fenced code blocks and links, outside
// code blocks and HTML comments.
func parse(path, text string) *page {
	p := &page{path: path, text: text, anchors: map[string]bool{}}
	lines := strings.Split(comment.ReplaceAllStringFunc(text, func(c string) string {
		return strings.Repeat("\n", strings.Count(c, "\n"))
	}), "\n")
	seen := map[string]int{}
	for i := 0; i < len(lines); i++ {
		line := lines[i]
		if m := fenceOpen.FindStringSubmatch(line); m != nil && !(m[2][0] == '`' && strings.Contains(m[4], "`")) {
			b := block{lang: m[3], attrs: strings.TrimSpace(m[4]), line: i + 1}
			indent, fence := len(m[1]), m[2]
			var body []string
			for i++; i < len(lines); i++ {
				l := strings.TrimLeft(lines[i], " ")
				if strings.HasPrefix(l, fence) && strings.Trim(l, fence[:1]+" \t") == "" {
					break
				}
				body = append(body, trimIndent(lines[i], indent))
			}
			b.body = strings.Join(body, "\n")
			p.blocks = append(p.blocks, b)
			continue
		}
		if m := atxHeading.FindStringSubmatch(line); m != nil {
			h := heading{level: len(m[1]), text: m[2], line: i + 1}
			p.headings = append(p.headings, h)
			a := anchor(h.text)
			if n := seen[a]; n > 0 {
				p.anchors[fmt.Sprintf("%s-%d", a, n)] = true
			} else {
				p.anchors[a] = true
			}
			seen[a]++
		}
		for _, m := range htmlAnchor.FindAllStringSubmatch(line, -1) {
			p.anchors[m[1]] = true
		}
		for _, m := range mdLink.FindAllStringSubmatch(inlineCode.ReplaceAllString(line, ""), -1) {
			p.links = append(p.links, link{target: m[1], line: i + 1})
		}
	}
	return p
}

// trimIndent removes up to n leading spaces, as a fence's indentation is
// removed from its content.
func trimIndent(s string, n int) string {
	for ; n > 0 && strings.HasPrefix(s, " "); n-- {
		s = s[1:]
	}
	return s
}

// anchor is the fragment GitHub gives a heading: its text without
// markup, in lower case, with punctuation dropped and spaces as hyphens.
func anchor(heading string) string {
	heading = regexp.MustCompile(`\[([^\]]*)\]\([^)]*\)`).ReplaceAllString(heading, "$1")
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// TestLinks: every relative link points to a file that exists, and a
// fragment to a heading of its page.
func TestLinks(t *testing.T) {
	t.Parallel()
	ps := pages(t)
	byPath := map[string]*page{}
	for _, p := range ps {
		byPath[p.path] = p
	}
	for _, p := range ps {
		for _, l := range p.links {
			if regexp.MustCompile(`^[a-zA-Z][a-zA-Z0-9+.-]*:`).MatchString(l.target) {
				continue // https:, mailto: and the like
			}
			file, frag, _ := strings.Cut(l.target, "#")
			target := p.path
			if file != "" {
				target = filepath.ToSlash(filepath.Clean(filepath.Join(filepath.Dir(p.path), file)))
				if _, err := os.Stat(filepath.Join(root, target)); err != nil {
					t.Errorf("%s:%d: link to %s: no such file (%s)", p.path, l.line, l.target, target)
					continue
				}
			}
			if frag == "" {
				continue
			}
			tp, ok := byPath[target]
			if !ok && strings.HasSuffix(target, ".md") {
				b, err := os.ReadFile(filepath.Join(root, target))
				if err != nil {
					t.Fatal(err)
				}
				tp = parse(target, string(b))
				byPath[target] = tp
			}
			if tp == nil || !tp.anchors[frag] {
				t.Errorf("%s:%d: link to %s: %s has no heading with the anchor #%s", p.path, l.line, l.target, target, frag)
			}
		}
	}
}

// TestContents: each docs/ page lists its ## headings, in order, under
// "## Contents".
func TestContents(t *testing.T) {
	t.Parallel()
	for _, p := range pages(t) {
		if !strings.HasPrefix(p.path, "docs/") {
			continue
		}
		var want []string
		contents, end := -1, len(p.text)
		for _, h := range p.headings {
			switch {
			case h.level != 2:
			case h.text == "Contents":
				contents = h.line
			case contents > 0:
				end = min(end, h.line)
				want = append(want, "#"+anchor(h.text))
			}
		}
		if contents < 0 {
			t.Errorf("%s has no ## Contents", p.path)
			continue
		}
		var got []string
		for _, l := range p.links {
			if l.line > contents && l.line < end && strings.HasPrefix(l.target, "#") {
				got = append(got, l.target)
			}
		}
		if !slices.Equal(got, want) {
			t.Errorf("%s: ## Contents links %q, want its ## headings in order: %q", p.path, got, want)
		}
	}
}

// TestLanding: the README is a landing page, and a map to every page.
func TestLanding(t *testing.T) {
	t.Parallel()
	ps := pages(t)
	readme := ps[0]
	if n := strings.Count(readme.text, "\n"); n > 200 {
		t.Errorf("README.md has %d lines, want at most 200: it is the landing page; move reference to docs/", n)
	}
	linked := map[string]bool{}
	for _, l := range readme.links {
		file, _, _ := strings.Cut(l.target, "#")
		linked[filepath.ToSlash(filepath.Clean(file))] = true
	}
	for _, p := range ps[1:] {
		if !linked[p.path] {
			t.Errorf("README.md does not link %s: every page must be reachable from its map", p.path)
		}
	}
}

// needs are the reasons a command block may give for not running.
var needs = []string{"cluster", "certificates", "deployment", "postgres", "time", "foreground", "your-module"}

var needsAttr = regexp.MustCompile(`^\{needs=([a-z-]+(?:,[a-z-]+)*)\}$`)

// runnable reports whether a block is a command to run, and refuses
// blocks that break the convention.
func runnable(b block) (bool, error) {
	switch b.lang {
	case "":
		return false, errors.New("fenced block without a language: write sh for commands, text for output")
	case "bash", "shell", "console", "shell-session", "zsh":
		return false, fmt.Errorf("fenced block in %s: write sh for commands, text for output", b.lang)
	case "sh":
	default:
		if b.attrs != "" {
			return false, fmt.Errorf("%s block with %q: only sh blocks take {needs=…}", b.lang, b.attrs)
		}
		return false, nil
	}
	if b.attrs == "" {
		return true, nil
	}
	m := needsAttr.FindStringSubmatch(b.attrs)
	if m == nil {
		return false, fmt.Errorf("sh block with %q: want nothing (it runs) or {needs=REASON,…}", b.attrs)
	}
	for _, r := range strings.Split(m[1], ",") {
		if !slices.Contains(needs, r) {
			return false, fmt.Errorf("sh block needs %q: want one of %v (docs/development.md)", r, needs)
		}
	}
	return false, nil
}

// TestCommandBlocks runs every runnable command block, page by page,
// against a paymentsd --simulate started for the page, and checks that
// every other block follows the convention.
func TestCommandBlocks(t *testing.T) {
	t.Parallel()
	type todo struct {
		page   *page
		blocks []block
		env    []string // for the page's paymentsd --simulate
	}
	var work []todo
	for _, p := range pages(t) {
		var run []block
		var env []string
		for _, b := range p.blocks {
			if b.lang == "sh" && b.attrs == "{needs=foreground}" {
				env = append(env, simulateEnv(b.body)...)
			}
			ok, err := runnable(b)
			if err != nil {
				t.Errorf("%s:%d: %v", p.path, b.line, err)
			}
			if ok {
				run = append(run, b)
			}
		}
		if len(run) > 0 {
			work = append(work, todo{p, run, env})
		}
	}
	if testing.Short() {
		t.Skip("runs the docs' commands")
	}
	if _, err := exec.LookPath("curl"); err != nil {
		testenv.Missing(t, "curl is not installed; the docs' commands use it")
	}
	// The contract check: with PAYMENTS_DOCS_PRISM naming Stoplight
	// Prism's CLI (.ci/run installs it), every REST request of the
	// docs goes through prism proxy, which checks it and paymentsd's
	// answer against the OpenAPI document.
	prism := os.Getenv("PAYMENTS_DOCS_PRISM")
	if prism == "" && os.Getenv("CI") == "true" {
		t.Fatal("PAYMENTS_DOCS_PRISM is not set: under CI the docs' REST requests must go through the contract validator (.ci/run installs it)")
	}
	// The test's own paymentsd --simulate, built where no block can
	// find it.
	bin := t.TempDir()
	build := exec.CommandContext(t.Context(), "go", "build", "-o", filepath.Join(bin, "paymentsd"), "./cmd/paymentsd")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/paymentsd: %v\n%s", err, out)
	}
	modCache, err := exec.CommandContext(t.Context(), "go", "env", "GOMODCACHE").Output()
	if err != nil {
		t.Fatalf("go env GOMODCACHE: %v", err)
	}
	for _, w := range work {
		t.Run(w.page.path, func(t *testing.T) {
			grpcAddr, httpAddr := simulate(t, filepath.Join(bin, "paymentsd"), w.env)
			env := newcomerEnv(t, strings.TrimSpace(string(modCache)))
			env = append(env, "PAYMENTS_CLI_ADDR="+grpcAddr)
			restAddr := httpAddr
			var violations func() []string
			if prism != "" {
				restAddr, violations = startPrism(t, prism, filepath.Join(root, "internal", "service", "openapi.json"), httpAddr)
			}
			// REST requests (and only those: /metrics, /readyz are not in
			// the OpenAPI document) go through the contract validator.
			ports := strings.NewReplacer("localhost:9090", grpcAddr, "localhost:8080/v1/", restAddr+"/v1/", "localhost:8080", httpAddr)
			// The page's blocks share one terminal, as a reader's would:
			// what a block exports (PATH, after go install) the next one
			// has. Each block ends by writing its environment here.
			state := filepath.Join(t.TempDir(), "env")
			for _, b := range w.blocks {
				// A guard against a command that never ends, not a timed
				// assertion: the first grpcurl build takes minutes.
				ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
				defer cancel()
				script := ports.Replace(b.body) + "\nenv -0 >" + shellQuote(state) + "\n"
				cmd := exec.CommandContext(ctx, "bash", "-e", "-o", "pipefail", "-c", script)
				cmd.Dir = root
				cmd.Env = env
				cmd.Stdin = strings.NewReader("")
				out, err := cmd.CombinedOutput()
				if err != nil {
					t.Errorf("%s:%d: the command block failed: %v\n%s\n--- output:\n%s", w.page.path, b.line, err, b.body, out)
					continue
				}
				t.Logf("%s:%d:\n%s", w.page.path, b.line, out)
				after, err := os.ReadFile(state)
				if err != nil {
					t.Fatalf("%s:%d: the block's environment: %v", w.page.path, b.line, err)
				}
				env = blockEnv(after)
			}
			if violations != nil {
				for _, v := range violations() {
					t.Errorf("%s: the contract validator refused a request or an answer (the block's output above shows its problem+json): %s", w.page.path, v)
				}
			}
		})
	}
}

// newcomerEnv is the environment a page's blocks start in: a newcomer's
// shell in a fresh clone. It has the test's own environment (Go, curl,
// the module cache), but no paymentsd on the PATH, and a GOPATH of its own
// whose bin directory is not on the PATH either: a block that runs a bare
// paymentsd fails unless the page has installed it and put it there.
// The module cache stays the test's, so that nothing is downloaded again.
func newcomerEnv(t *testing.T, modCache string) []string {
	t.Helper()
	var path []string
	for _, dir := range filepath.SplitList(os.Getenv("PATH")) {
		if fi, err := os.Stat(filepath.Join(cmp.Or(dir, "."), "paymentsd")); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			continue
		}
		path = append(path, dir)
	}
	env := []string{
		"PATH=" + strings.Join(path, string(os.PathListSeparator)),
		"GOPATH=" + t.TempDir(),
		"GOMODCACHE=" + modCache,
	}
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		switch {
		case name == "PATH", name == "GOPATH", name == "GOMODCACHE", name == "GOBIN", strings.HasPrefix(name, "PAYMENTS_CLI_"):
		default:
			env = append(env, kv)
		}
	}
	return env
}

// blockEnv reads the environment a block left, as env -0 wrote it.
func blockEnv(b []byte) []string {
	var env []string
	for _, kv := range strings.Split(string(b), "\x00") {
		if kv == "" || strings.HasPrefix(kv, "_=") {
			continue
		}
		env = append(env, kv)
	}
	return env
}

// shellQuote quotes s for bash.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// startPrism starts `prism proxy doc http://upstream --errors` on a free
// loopback port, stops it when the test ends, and returns its address and
// a function giving the violations it has logged so far: each request or
// answer that breaks the document. With --errors it answers such a call
// with a problem+json saying what broke, in place of paymentsd's answer.
func startPrism(t *testing.T, prism, doc, upstream string) (addr string, violations func() []string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	cmd := exec.Command(prism, "proxy", doc, "http://"+upstream, "--errors", "--host", "127.0.0.1", "--port", fmt.Sprint(port))
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", prism, err)
	}
	var mu sync.Mutex
	var bad []string
	listening := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		sc := bufio.NewScanner(out)
		once := sync.Once{}
		for sc.Scan() {
			line := sc.Text()
			switch {
			case strings.Contains(line, "Prism is listening"):
				once.Do(func() { close(listening) })
			case strings.Contains(line, "✖"), strings.Contains(line, "⚠"):
				mu.Lock()
				bad = append(bad, line)
				mu.Unlock()
			}
		}
	}()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-done
		cmd.Wait()
	})
	select {
	case <-listening:
	case <-done:
		t.Fatalf("prism proxy exited before listening")
	case <-t.Context().Done():
		t.Fatal("the test ended before prism proxy listened")
	}
	return fmt.Sprintf("127.0.0.1:%d", port), func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(bad)
	}
}

// startsSimulate matches a command line that starts paymentsd --simulate,
// with the variables set before it.
var startsSimulate = regexp.MustCompile(`^((?:PAYMENTS_[A-Z0-9_]+=[^\s'"]*\s+)*)(?:go run \./cmd/paymentsd|paymentsd)\s+--simulate\b`)

// simulateEnv is what a page's own start of paymentsd --simulate sets
// (PAYMENTS_SETTLEMENT_WINDOW=20s go run ./cmd/paymentsd --simulate), so
// that the paymentsd its blocks run against is the one it tells the
// reader to start.
func simulateEnv(body string) []string {
	var env []string
	for _, line := range strings.Split(body, "\n") {
		if m := startsSimulate.FindStringSubmatch(strings.TrimSpace(line)); m != nil {
			env = append(env, strings.Fields(m[1])...)
		}
	}
	return env
}

// simulate starts bin --simulate on free loopback ports, with env, stops
// it when the test ends, and returns its gRPC and HTTP addresses.
func simulate(t *testing.T, bin string, env []string) (grpcAddr, httpAddr string) {
	t.Helper()
	cmd := exec.Command(bin, "--simulate")
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH")}, env...)
	cmd.Env = append(cmd.Env, "PAYMENTS_GRPC_ADDR=127.0.0.1:0", "PAYMENTS_HTTP_ADDR=127.0.0.1:0")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var exitErr error
	exited := make(chan struct{}) // closed once it has exited, exitErr set
	serving := make(chan [2]string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			var line struct {
				Msg      string `json:"msg"`
				GRPCAddr string `json:"grpc_addr"`
				HTTPAddr string `json:"http_addr"`
			}
			if json.Unmarshal(sc.Bytes(), &line) == nil && line.Msg == "serving" {
				serving <- [2]string{line.GRPCAddr, line.HTTPAddr}
			}
		}
		io.Copy(io.Discard, stderr)
		exitErr = cmd.Wait()
		close(exited)
	}()
	served := false
	t.Cleanup(func() {
		if !served {
			cmd.Process.Kill()
			<-exited
			return
		}
		cmd.Process.Signal(syscall.SIGTERM)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		select {
		case <-exited:
			if exitErr != nil {
				t.Errorf("paymentsd --simulate exited with %v after SIGTERM, want 0", exitErr)
			}
		case <-ctx.Done():
			cmd.Process.Kill()
			t.Errorf("paymentsd --simulate still running a minute after SIGTERM")
		}
	})
	select {
	case a := <-serving:
		served = true
		return a[0], a[1]
	case <-exited:
		t.Fatalf("paymentsd --simulate exited before serving: %v", exitErr)
	case <-time.After(time.Minute): // a guard against a hang
		t.Fatal("paymentsd --simulate neither served nor exited within a minute")
	}
	return "", ""
}
