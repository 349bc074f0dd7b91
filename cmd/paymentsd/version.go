package main

import (
	"fmt"
	"runtime/debug"
)

// buildVersion and buildRevision are set at link time by a build that has
// no VCS information for the toolchain to stamp, such as the image's
// (.dockerignore leaves .git out of its context):
//
//	go build -ldflags "-X main.buildVersion=v1.4.0 -X main.buildRevision=$(git rev-parse HEAD)" ./cmd/paymentsd
//
// They are never changed at run time. Unset, the toolchain's stamps are
// used.
var buildVersion, buildRevision string

// version is the version and VCS revision the binary was built from, and
// its Go version, as --version prints them.
func version() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown (built without module support)"
	}
	v := bi.Main.Version
	if v == "" {
		v = "(devel)"
	}
	if buildVersion != "" {
		v = buildVersion
	}
	var rev, at, modified string
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.time":
			at = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				modified = ", modified"
			}
		}
	}
	if buildRevision != "" {
		rev, at, modified = buildRevision, "", ""
	}
	if rev != "" {
		v += fmt.Sprintf(" (revision %s%s%s)", rev, prefixed(", ", at), modified)
	}
	return v + " " + bi.GoVersion
}

// releaseVersion is the version alone, as one token (RFC 9110's product
// version): what the provider sees in paymentsd/<version> and the OpenAPI
// document's info.version. A development build is devel, with its
// revision if known (devel+1a2b3c4d5e6f).
func releaseVersion() string {
	if buildVersion != "" {
		return buildVersion
	}
	bi, ok := debug.ReadBuildInfo()
	if ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	rev := buildRevision
	if ok && rev == "" {
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" {
				rev = s.Value
			}
		}
	}
	if rev != "" {
		return "devel+" + rev[:min(len(rev), 12)]
	}
	return "devel"
}

func prefixed(prefix, s string) string {
	if s == "" {
		return ""
	}
	return prefix + s
}
