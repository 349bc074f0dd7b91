package paymentsclient_test

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestREADMESnippet compiles README "Calling it from Go"'s snippet as the
// body of a function, so the README's example stays true to the API, and
// checks that its switch handles the errors that need handling of their
// own. The
// package it compiles exists only in a go build -overlay.
func TestREADMESnippet(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the go command")
	}
	t.Parallel()
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(readme), "\n## Calling it from Go\n")
	if !ok {
		t.Fatal(`README has no "## Calling it from Go" section`)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	_, snippet, ok := strings.Cut(section, "```go\n")
	if !ok {
		t.Fatal(`README "Calling it from Go" has no Go snippet`)
	}
	snippet, _, _ = strings.Cut(snippet, "```")
	// A caller copies the switch as it is: each error that asks for its
	// own handling has a case. Without ErrInvalidRequest's, a request
	// that can never succeed is retried.
	for _, sentinel := range []string{"ErrNotCreated", "ErrInvalidRequest"} {
		if !strings.Contains(snippet, "case errors.Is(err, paymentsclient."+sentinel+"):") {
			t.Errorf("README's snippet has no case for paymentsclient.%s", sentinel)
		}
	}

	src := `package main

import (
	"context"
	"errors"
	"log"
	"time"

	paymentsv1 "example.com/paymentsd/gen/payments/v1"
	"example.com/paymentsd/paymentsclient"
)

func main() { _ = pay(context.Background()) }

func pay(ctx context.Context) error {
` + snippet + `	return nil
}
`
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	file := filepath.Join(dir, "main.go")
	if err := os.WriteFile(file, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	virtual := filepath.Join(root, "paymentsclient", "internal", "readmesnippet", "main.go")
	overlay, _ := json.Marshal(map[string]map[string]string{"Replace": {virtual: file}})
	overlayFile := filepath.Join(dir, "overlay.json")
	if err := os.WriteFile(overlayFile, overlay, 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(t.Context(), "go", "build", "-overlay", overlayFile, "-o", os.DevNull, "./paymentsclient/internal/readmesnippet")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("README's snippet does not compile: %v\n%s\n%s", err, out, src)
	}
}
